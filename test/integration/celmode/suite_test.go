// Package celmode_test holds CEL mode's control-plane tests: the order of a
// lock's bindings (with the manager's clock skewed, and a second apiserver
// instance lagging) and the prover, against a real kube-apiserver and etcd
// (envtest). Each spec starts its own control plane: the bindings specs
// with the manager running only the CEL-mode policies and bindings
// (startBed), the prover spec a plain one.
package celmode_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestCELMode(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "CEL mode suite")
}

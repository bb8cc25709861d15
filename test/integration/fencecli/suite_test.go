package fencecli_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	ctx        = context.Background()
	suite      *envtestutil.Suite
	env        *envtestutil.AdmissionEnv
	mgr        *envtestutil.Manager
	admin      client.WithWatch
	plugin     string // the built kubectl-fence binary
	kubeconfig string
)

func TestPlugin(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubectl fence suite")
}

var _ = BeforeSuite(func() {
	dir := GinkgoT().TempDir()
	plugin = filepath.Join(dir, "kubectl-fence")
	build := exec.Command("go", "build", "-o", plugin, "./cmd/kubectl-fence")
	build.Dir = envtestutil.RepoRoot()
	b, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(b))

	suite, err = envtestutil.StartSuite(ctx, envtestutil.SuiteOptions{Log: GinkgoWriter,
		Guarded: []string{"configmaps"}, Manager: true, Scheme: lease.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	env, mgr, admin = suite.Admission, suite.Manager, suite.Client
	kubeconfig, err = suite.Kubeconfig("worker", dir)
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if suite != nil {
		Expect(suite.Stop()).To(Succeed())
	}
})

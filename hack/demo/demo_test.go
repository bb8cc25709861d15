package main

import (
	"io"
	"os"
	"testing"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// TestMain lets the test binary play the demo's worker processes: the demo
// starts workers by running its own executable with "worker".
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemo runs `make demo`'s scenario, the same code, inside make test: real
// worker processes, W1 SIGSTOPped past its TTL, W2 taking over, W1's late
// publish refused at the object, the report's history verified.
func TestDemo(t *testing.T) {
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	kubeconfig := envtestutil.DemoKubeconfig(t, "demo")
	if err := orchestrate(kubeconfig, 3*time.Second); err != nil {
		t.Fatalf("the demo deviated: %v", err)
	}
}

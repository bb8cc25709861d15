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

// TestMain lets the test binary play the operator's replicas: the demo
// starts them by running its own executable with "operator".
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "operator" {
		operatorMain()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemoLeader runs `make demo-leader`'s scenario, the same code, inside
// make test: two operator processes, the leader SIGSTOPped mid-allocation
// past its TTL, the other taking over with epoch+1, the old leader's stale
// allocation refused, the allocation table free of duplicates.
func TestDemoLeader(t *testing.T) {
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	kubeconfig := envtestutil.DemoKubeconfig(t, "operator")
	if err := orchestrate(kubeconfig, 3*time.Second); err != nil {
		t.Fatalf("the demo deviated: %v", err)
	}
}

package envtestutil

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// DemoKubeconfig starts what a demo runs against inside make test (a
// control plane with the fencing webhook for ConfigMaps and the Lease guard,
// and an in-process manager), stopped when t ends, and returns the path of
// a kubeconfig for user (cluster-admin, not the manager).
func DemoKubeconfig(t testing.TB, user string) string {
	t.Helper()
	env := StartAdmissionEnvWithManager(t, []string{"configmaps"})
	u, err := env.Env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// StartAdmissionEnvWithManager starts StartAdmissionEnv's control plane and
// an in-process manager serving the fencing webhook, both stopped when t
// ends.
func StartAdmissionEnvWithManager(t testing.TB, guarded []string, extraCRDDirs ...string) *AdmissionEnv {
	t.Helper()
	return startWithManager(t, StartAdmissionEnv, guarded, extraCRDDirs...)
}

// StartCELEnvWithManager is the same in CEL enforcement mode (StartCELEnv):
// the manager applies the fencing policies and binds each lock.
func StartCELEnvWithManager(t testing.TB, guarded []string, extraCRDDirs ...string) *AdmissionEnv {
	t.Helper()
	return startWithManager(t, StartCELEnv, guarded, extraCRDDirs...)
}

func startWithManager(t testing.TB, start func(context.Context, []string, ...string) (*AdmissionEnv, error), guarded []string, extraCRDDirs ...string) *AdmissionEnv {
	t.Helper()
	env, err := start(context.Background(), guarded, extraCRDDirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Env.Stop() })
	mgr, err := env.StartManager()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Stop() })
	return env
}

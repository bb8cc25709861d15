package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain lets a test run main() in a child process (the flags are
// checked there and the process exits).
func TestMain(m *testing.M) {
	if os.Getenv("FENCEKEEPER_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestBadFlagsFailClearly: a bad flag stops the manager at once, before it
// connects anywhere, with exit status 1 and a message naming the flag.
func TestBadFlagsFailClearly(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"--fencing-mode=both"}, want: `invalid --fencing-mode (or $FENCING_MODE): use webhook or cel`},
		{env: "FENCING_MODE=CEL", want: `invalid --fencing-mode (or $FENCING_MODE): use webhook or cel`},
		{args: []string{"--fencing-mode=cel", "--guarded-resources=*"}, want: `invalid --guarded-resources`},
		{args: []string{"--fencing-mode=cel", "--guarded-resources=,"}, want: `no guarded resources given`},
		{args: []string{"--max-waiters-per-lock=-1"}, want: `--max-waiters-per-lock must be 0 (no limit) or positive`},
		{args: []string{"--expired-claim-retention=-1s"}, want: `--expired-claim-retention must be 0 (keep Expired claims) or positive`},
	} {
		t.Run(strings.Join(append(tc.args, tc.env), " "), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], tc.args...)
			// No cluster to reach: the flags must fail before any attempt.
			cmd.Env = append(os.Environ(), "FENCEKEEPER_TEST_RUN_MAIN=1", "KUBECONFIG=/nonexistent/kubeconfig", "FENCING_MODE=")
			if tc.env != "" {
				cmd.Env = append(cmd.Env, tc.env)
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("want exit status 1, got %v; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("the output does not say %q:\n%s", tc.want, out)
			}
			if strings.Contains(string(out), "no Kubernetes connection") {
				t.Fatalf("the manager looked for a cluster before checking its flags:\n%s", out)
			}
		})
	}
}

package fencecli_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/pkg/fencecli"
)

// noCluster is the error of a command that got past its checks and tried to
// connect: these tests point --kubeconfig at a file that does not exist, so
// a check that runs only after connecting never shows its message.
const noCluster = "no Kubernetes connection"

func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	var stdout, stderr bytes.Buffer
	code := fencecli.Main(append([]string{"--kubeconfig", missing}, args...),
		fencecli.Streams{In: strings.NewReader(""), Out: &stdout, ErrOut: &stderr})
	return code, stdout.String(), stderr.String()
}

// Bad flags and arguments are refused before any API call, with what to
// type instead; good ones at the edges of the ranges get through.
func TestFlagAndArgumentErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // substrings of stderr, in any order
	}{
		// --ttl, --wait (acquire and run), --grace (run)
		{"acquire ttl zero", []string{"acquire", "x", "--ttl", "0s"}, []string{"--ttl 0s: want whole seconds from 1s to 24h"}},
		{"acquire ttl negative", []string{"acquire", "x", "--ttl", "-5s"}, []string{"--ttl -5s: want whole seconds from 1s to 24h"}},
		{"acquire ttl fraction", []string{"acquire", "x", "--ttl", "1500ms"}, []string{"--ttl 1.5s: want whole seconds"}},
		{"acquire ttl too long", []string{"acquire", "x", "--ttl", "25h"}, []string{"--ttl 25h0m0s: want whole seconds from 1s to 24h"}},
		{"acquire wait negative", []string{"acquire", "x", "--wait", "-1s"}, []string{"--wait -1s: want 0 (wait forever"}},
		{"acquire ttl not a duration", []string{"acquire", "x", "--ttl", "abc"}, []string{`invalid argument "abc" for "--ttl" flag`, "see 'kubectl fence acquire --help'"}},
		{"run ttl zero", []string{"run", "x", "--ttl", "0s", "--", "true"}, []string{"--ttl 0s: want whole seconds from 1s to 24h"}},
		{"run ttl negative", []string{"run", "x", "--ttl", "-1s", "--", "true"}, []string{"--ttl -1s: want whole seconds from 1s to 24h"}},
		{"run wait negative", []string{"run", "x", "--wait", "-1s", "--", "true"}, []string{"--wait -1s: want 0 (wait forever"}},
		{"acquire wait too long", []string{"acquire", "x", "--wait", "24h0m1s"}, []string{"--wait 24h0m1s: want 0 (wait forever, the default) or a positive duration up to 24h"}},
		{"run wait too long", []string{"run", "x", "--wait", "25h", "--", "true"}, []string{"--wait 25h0m0s: want 0 (wait forever, the default) or a positive duration up to 24h"}},
		{"acquire no-wait and wait", []string{"acquire", "x", "--no-wait", "--wait", "5s"}, []string{"--no-wait and --wait 5s: pass one", "usage: kubectl fence acquire LOCK"}},
		{"acquire no-wait and wait 0", []string{"acquire", "x", "--wait", "0", "--no-wait"}, []string{"--no-wait and --wait 0s: pass one"}},
		{"run no-wait and wait", []string{"run", "x", "--no-wait", "--wait", "1m", "--", "true"}, []string{"--no-wait and --wait 1m0s: pass one", "usage: kubectl fence run LOCK[,LOCK...]"}},
		{"run grace negative", []string{"run", "x", "--grace", "-1s", "--", "true"}, []string{"--grace -1s: want 0"}},
		{"run unknown signal", []string{"run", "x", "--signal", "SIGFOO", "--", "true"}, []string{`unknown --signal "SIGFOO"`}},
		// --max-holders (acquire and run), --epoch and --claim (break)
		{"acquire max-holders zero", []string{"acquire", "x", "--max-holders", "0"}, []string{"--max-holders 0: want 1 (a mutex, the default) to 100"}},
		{"acquire max-holders negative", []string{"acquire", "x", "--max-holders", "-2"}, []string{"--max-holders -2: want 1 (a mutex, the default) to 100"}},
		{"acquire max-holders too many", []string{"acquire", "x", "--max-holders", "101"}, []string{"--max-holders 101: want 1 (a mutex, the default) to 100"}},
		{"acquire max-holders not a number", []string{"acquire", "x", "--max-holders", "three"}, []string{`invalid argument "three" for "--max-holders" flag`}},
		{"run max-holders too many", []string{"run", "x", "--max-holders", "1000", "--", "true"}, []string{"--max-holders 1000: want 1 (a mutex, the default) to 100"}},
		{"break epoch negative", []string{"break", "x", "--reason", "r", "--epoch", "-1"}, []string{"--epoch -1: want the positive epoch"}},
		{"break epoch and claim", []string{"break", "x", "--reason", "r", "--epoch", "5", "--claim", "c"}, []string{"--epoch and --claim both name the hold to break: pass one"}},
		// --holder, -o, lock names
		{"acquire empty holder", []string{"acquire", "x", "--holder", ""}, []string{"--holder is empty"}},
		{"acquire bad output", []string{"acquire", "x", "-o", "xml"}, []string{badOutput("xml"), "json,jsonpath", "name", "yaml"}},
		{"acquire no wide", []string{"acquire", "x", "-o", "wide"}, []string{badOutput("wide")}},
		{"status bad output", []string{"status", "-o", "xml"}, []string{badOutput("xml"), "wide", "jsonpath", "go-template"}},
		{"status bad jsonpath", []string{"status", "-o", "jsonpath={.items[0"}, []string{"error parsing jsonpath {.items[0"}},
		{"status jsonpath without template", []string{"status", "-o", "jsonpath"}, []string{"template format specified but no template given"}},
		{"status bad go-template", []string{"status", "-o", "go-template={{.lock"}, []string{"error parsing template {{.lock"}},
		{"release bad output", []string{"release", "c", "-o", "xml"}, []string{badOutput("xml")}},
		{"release no wide", []string{"release", "c", "-o", "wide"}, []string{badOutput("wide")}},
		{"break bad output", []string{"break", "x", "--reason", "r", "-o", "xml"}, []string{badOutput("xml")}},
		{"status lock across namespaces", []string{"status", "x", "-A"}, []string{"a LOCK cannot be looked up across all namespaces", "usage: kubectl fence status [LOCK]"}},
		{"acquire bad lock", []string{"acquire", "Bad_Lock"}, []string{`invalid lock name "Bad_Lock"`}},
		{"run bad lock", []string{"run", "Bad_Lock", "--", "true"}, []string{`invalid lock name "Bad_Lock"`}},
		// missing or extra arguments: say what to type
		{"acquire no lock", []string{"acquire"}, []string{"missing LOCK", "usage: kubectl fence acquire LOCK", "example:\n  kubectl fence acquire -n reports report-2026-07"}},
		{"acquire two locks", []string{"acquire", "a", "b"}, []string{"one LOCK only, got 2 arguments", "usage: kubectl fence acquire LOCK"}},
		{"run nothing", []string{"run"}, []string{"missing LOCK and COMMAND", "usage: kubectl fence run LOCK[,LOCK...] [flags] -- COMMAND [ARGS...]", "example:\n  kubectl fence run -n reports report-2026-07"}},
		{"run no dash", []string{"run", "x", "true"}, []string{`missing "--" before COMMAND`, "usage: kubectl fence run LOCK[,LOCK...] [flags] -- COMMAND [ARGS...]"}},
		{"run lock only", []string{"run", "x"}, []string{`missing "--" before COMMAND`, "usage: kubectl fence run LOCK[,LOCK...] [flags] -- COMMAND [ARGS...]"}},
		{"run no lock", []string{"run", "--", "true"}, []string{`missing LOCK before "--"`, "usage: kubectl fence run"}},
		{"run no command", []string{"run", "x", "--"}, []string{`missing COMMAND after "--"`, "usage: kubectl fence run"}},
		{"run two locks", []string{"run", "a", "b", "--", "true"}, []string{`one LOCK only before "--"`, "join them with commas: a,b", "usage: kubectl fence run"}},
		// several locks: LOCK1,LOCK2 (each name checked, the bad one named)
		{"run locks one bad", []string{"run", "a,Bad_Lock", "--", "true"}, []string{`invalid LOCK "a,Bad_Lock": invalid lock name "Bad_Lock"`}},
		{"run locks twice", []string{"run", "b,a,b", "--", "true"}, []string{`invalid LOCK "b,a,b": lock "b" is given twice`}},
		{"run locks trailing comma", []string{"run", "a,", "--", "true"}, []string{`invalid LOCK "a,": lock 2 of 2 is empty`}},
		{"run locks empty middle", []string{"run", "a,,b", "--", "true"}, []string{`invalid LOCK "a,,b": lock 2 of 3 is empty`}},
		{"run locks leading comma", []string{"run", ",a", "--", "true"}, []string{`lock 1 of 2 is empty`}},
		{"run locks with space", []string{"run", "a, b", "--", "true"}, []string{`invalid lock name " b"`}},
		{"run locks one variable", []string{"run", "a-b,a.b", "--", "true"}, []string{`locks "a-b" and "a.b" would both export FENCEKEEPER_EPOCH_A_B`}},
		{"run locks no-wait and wait", []string{"run", "a,b", "--no-wait", "--wait", "1m", "--", "true"}, []string{"--no-wait and --wait 1m0s: pass one"}},
		{"release nothing", []string{"release"}, []string{"missing CLAIM", "or --lock LOCK", "usage: kubectl fence release", "example:\n  kubectl fence release -n reports"}},
		{"release two claims", []string{"release", "a", "b"}, []string{"one CLAIM only, got 2 arguments", "usage: kubectl fence release"}},
		{"release claim and lock", []string{"release", "c", "--lock", "x"}, []string{"either CLAIM or --lock, not both"}},
		{"release holder without lock", []string{"release", "c", "--holder", "W1"}, []string{"--holder needs --lock"}},
		{"release bad lock", []string{"release", "--lock", "Bad_Lock"}, []string{`invalid lock name "Bad_Lock"`}},
		{"release empty holder", []string{"release", "--lock", "x", "--holder", ""}, []string{"--holder is empty"}},
		{"status two locks", []string{"status", "a", "b"}, []string{"at most one LOCK, got 2 arguments", "usage: kubectl fence status [LOCK]"}},
		// the edges of the ranges pass the checks (and then find no cluster)
		{"acquire ttl 1s wait 0", []string{"acquire", "x", "--ttl", "1s", "--wait", "0s"}, []string{noCluster}},
		{"acquire ttl 24h json", []string{"acquire", "x", "--ttl", "24h", "-o", "json"}, []string{noCluster}},
		{"run grace 0 wait 1s", []string{"run", "x", "--grace", "0s", "--wait", "1s", "--", "true"}, []string{noCluster}},
		{"acquire wait 24h", []string{"acquire", "x", "--wait", "24h"}, []string{noCluster}},
		{"acquire wait sub-second", []string{"acquire", "x", "--wait", "1500ms"}, []string{noCluster}},
		{"acquire no-wait", []string{"acquire", "x", "--no-wait"}, []string{noCluster}},
		{"run no-wait", []string{"run", "x", "--no-wait", "--", "true"}, []string{noCluster}},
		{"run two locks", []string{"run", "b,a", "--wait", "5s", "--", "true"}, []string{noCluster}},
		{"run three locks no-wait", []string{"run", "report-2026-07,ledger.2026-07,a", "--no-wait", "--", "true"}, []string{noCluster}},
		{"release by claim", []string{"release", "c", "--ignore-not-found"}, []string{noCluster}},
		{"release by lock", []string{"release", "--lock", "x", "--holder", "W1"}, []string{noCluster}},
		{"status all", []string{"status", "-o", "yaml"}, []string{noCluster}},
		{"status all namespaces wide", []string{"status", "-A", "-o", "wide"}, []string{noCluster}},
		{"status all namespaces long", []string{"status", "--all-namespaces", "-o", "name"}, []string{noCluster}},
		{"status jsonpath", []string{"status", "x", "-o", "jsonpath={.items[0].epoch}"}, []string{noCluster}},
		{"status go-template", []string{"status", "-o", "go-template={{range .items}}{{.lock}}{{end}}"}, []string{noCluster}},
		{"status template flag", []string{"status", "--template", "{{.kind}}"}, []string{noCluster}},
		{"status kyaml", []string{"status", "-o", "kyaml"}, []string{noCluster}},
		{"acquire name", []string{"acquire", "x", "-o", "name"}, []string{noCluster}},
		{"acquire jsonpath", []string{"acquire", "x", "-o", "jsonpath={.epoch}"}, []string{noCluster}},
		{"release json", []string{"release", "c", "-o", "json"}, []string{noCluster}},
		{"release name", []string{"release", "--lock", "x", "-o", "name"}, []string{noCluster}},
		{"break yaml", []string{"break", "x", "--reason", "r", "-o", "yaml"}, []string{noCluster}},
		{"acquire max-holders 1", []string{"acquire", "x", "--max-holders", "1"}, []string{noCluster}},
		{"acquire max-holders 100", []string{"acquire", "x", "--max-holders", "100", "--no-wait"}, []string{noCluster}},
		{"run max-holders 3 two locks", []string{"run", "a,b", "--max-holders", "3", "--", "true"}, []string{noCluster}},
		{"break epoch", []string{"break", "x", "--reason", "r", "--epoch", "4712"}, []string{noCluster}},
		{"break claim", []string{"break", "x", "--reason", "r", "--claim", "w2-x"}, []string{noCluster}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runMain(t, tt.args...)
			if code != 1 {
				t.Errorf("exit code %d, want 1; stderr:\n%s", code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
			if tt.want[0] != noCluster && strings.Contains(stderr, noCluster) {
				t.Errorf("the check ran after connecting:\n%s", stderr)
			}
		})
	}
}

// badOutput is cli-runtime's error for an -o it has no printer for.
func badOutput(format string) string {
	return `unable to match a printer suitable for the output format "` + format + `", allowed formats are: `
}

// run documents its exit codes, the one for a lost lease above all.
func TestRunHelpDocumentsExitCodes(t *testing.T) {
	code, stdout, stderr := runMain(t, "run", "--help")
	if code != 0 {
		t.Fatalf("run --help: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"Exit codes:", fmt.Sprintf("%d ", fencecli.ExitLeaseLost), "the lease was lost while COMMAND ran", "128+N",
		fmt.Sprintf("%d ", fencecli.ExitNotAcquired), "not acquired, COMMAND not run"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("run --help does not say %q:\n%s", want, stdout)
		}
	}
}

// acquire and run document --no-wait and that --wait is the claim's
// server-side deadline, and acquire its exit codes.
func TestWaitHelp(t *testing.T) {
	for _, cmd := range []string{"acquire", "run"} {
		code, stdout, stderr := runMain(t, cmd, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d: %s", cmd, code, stderr)
		}
		notAcquired := fmt.Sprintf("exit code %d", fencecli.ExitNotAcquired)
		if line := helpLine(stdout, "--wait duration"); !strings.Contains(line, "acquireTimeoutSeconds") || !strings.Contains(line, "rounded up") || !strings.Contains(line, notAcquired) {
			t.Errorf("%s --wait help does not say it sets acquireTimeoutSeconds, rounded up, or its exit code:\n%s", cmd, line)
		}
		if line := helpLine(stdout, "--no-wait"); !strings.Contains(line, "Try once") || !strings.Contains(line, notAcquired) {
			t.Errorf("%s --no-wait help does not say it tries once, or its exit code:\n%s", cmd, line)
		}
	}
	code, stdout, stderr := runMain(t, "acquire", "--help")
	if code != 0 {
		t.Fatalf("acquire --help: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"Exit codes:", fmt.Sprintf("%d   not acquired", fencecli.ExitNotAcquired), "0    acquired", "1    acquire failed itself"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("acquire --help does not say %q:\n%s", want, stdout)
		}
	}
}

// Every command that prints takes kubectl's -o; only status, a table, takes
// -o wide.
func TestOutputFlagHelp(t *testing.T) {
	for _, cmd := range []string{"status", "acquire", "release", "break"} {
		code, stdout, stderr := runMain(t, cmd, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d: %s", cmd, code, stderr)
		}
		line := helpLine(stdout, "-o, --output")
		for _, f := range []string{"json", "yaml", "name", "jsonpath", "go-template"} {
			if !strings.Contains(line, f) {
				t.Errorf("%s -o does not offer %s:\n%s", cmd, f, line)
			}
		}
		if got, want := strings.Contains(line, "wide"), cmd == "status"; got != want {
			t.Errorf("%s -o offers wide: %v, want %v:\n%s", cmd, got, want, line)
		}
	}
}

// The default holder is the same on every call from one pod or machine, so
// a later `release --lock` finds an earlier acquire's claim.
func TestDefaultHolder(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatalf("no hostname, so the documented default holder cannot be checked: %v", err)
	}
	for _, tt := range []struct{ podName, want string }{
		{"", host},
		{"report-worker-7f9c", "report-worker-7f9c"},
	} {
		t.Setenv("POD_NAME", tt.podName)
		for _, cmd := range []string{"acquire", "run", "release"} {
			code, stdout, stderr := runMain(t, cmd, "--help")
			if code != 0 {
				t.Fatalf("%s --help: exit %d: %s", cmd, code, stderr)
			}
			holder := helpLine(stdout, "--holder")
			if !strings.Contains(holder, `(default "`+tt.want+`")`) {
				t.Errorf("POD_NAME=%q: %s --holder defaults to something else than %q:\n%s", tt.podName, cmd, tt.want, holder)
			}
			if !strings.Contains(holder, "$POD_NAME if set") || !strings.Contains(holder, "else the hostname") {
				t.Errorf("%s --help does not document the default holder:\n%s", cmd, holder)
			}
		}
	}
}

// helpLine is the help text of one flag (cobra wraps nothing: one line).
func helpLine(help, flag string) string {
	for _, l := range strings.Split(help, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), flag+" ") {
			return l
		}
	}
	return ""
}

// acquire and run document --max-holders: its range, and that every claim
// of a lock asks for the same; break documents how to name a permit.
func TestSemaphoreHelp(t *testing.T) {
	for _, cmd := range []string{"acquire", "run"} {
		code, stdout, stderr := runMain(t, cmd, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d: %s", cmd, code, stderr)
		}
		line := helpLine(stdout, "--max-holders int32")
		for _, want := range []string{"1 is a mutex", "2 to 100", "semaphore", "CapacityMismatch", "(default 1)"} {
			if !strings.Contains(line, want) {
				t.Errorf("%s --max-holders help does not say %q:\n%s", cmd, want, line)
			}
		}
		if !strings.Contains(stdout, "--max-holders N (2 to 100)") {
			t.Errorf("%s --help does not explain semaphores:\n%s", cmd, stdout)
		}
	}
	code, stdout, stderr := runMain(t, "break", "--help")
	if code != 0 {
		t.Fatalf("break --help: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"A semaphore lock", "--epoch E", "--claim NAME", "lists\nthe live permits"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("break --help does not say %q:\n%s", want, stdout)
		}
	}
	if line := helpLine(stdout, "--epoch int"); !strings.Contains(line, "required on a semaphore lock") {
		t.Errorf("break --epoch help:\n%s", line)
	}
	code, stdout, _ = runMain(t, "status", "--help")
	if code != 0 || !strings.Contains(stdout, "every live permit") {
		t.Errorf("status --help does not say it shows every permit:\n%s", stdout)
	}
}

package docs_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/test/docs"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// walked are the documents whose shell examples TestDocs runs, in order:
// each continues from the state the one before left.
var walked = []struct{ file, section string }{
	{"README.md", "## A five-minute tour"},
	{"docs/fencing.md", ""},
	{"docs/pod-leases.md", "## Trying it locally"},
	{"docs/holders.md", "## `kubectl fence`"},
}

// TestDocs starts a control plane and manager with hack/dev-up.sh (what
// `make dev-up` runs), then types the walked documents' commands into one
// bash session, from a directory laid out like the repository, and checks
// every command's exit status and shown output.
func TestDocs(t *testing.T) {
	root := envtestutil.RepoRoot()
	manager, err := envtestutil.ManagerBinary()
	if err != nil {
		t.Fatal(err)
	}
	dev := t.TempDir()
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	env := append(os.Environ(), "DEV_DIR="+dev, "MANAGER_BIN="+manager,
		"APISERVER_PORT="+strconv.Itoa(freePort(t)),
		"MANAGER_METRICS_ADDRESS="+metricsAddr,
		"MANAGER_PROBE_ADDRESS=127.0.0.1:"+strconv.Itoa(freePort(t)))
	up := exec.Command("bash", filepath.Join(root, "hack", "dev-up.sh"))
	up.Env = env
	t.Cleanup(func() {
		down := exec.Command("bash", filepath.Join(root, "hack", "dev-down.sh"))
		down.Env = env
		if out, err := down.CombinedOutput(); err != nil {
			t.Errorf("dev-down: %v\n%s", err, out)
		}
	})
	if out, err := up.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dev, "devcluster.log"))
		t.Fatalf("dev-up: %v\n%s\n%s", err, out, log)
	}

	// The user's shell: the repository's layout, with .dev being ours, and a
	// bin/ with the tools make built and the kubectl-fence plugin that
	// `make build` adds (make test does not build it into bin/).
	work := t.TempDir()
	for _, name := range []string{"config", "hack", "docs"} {
		if err := os.Symlink(filepath.Join(root, name), filepath.Join(work, name)); err != nil {
			t.Fatal(err)
		}
	}
	linkBin(t, root, work)
	if err := os.Symlink(dev, filepath.Join(work, ".dev")); err != nil {
		t.Fatal(err)
	}

	var cmds []docs.Command
	for _, w := range walked {
		text, err := os.ReadFile(filepath.Join(root, w.file))
		if err != nil {
			t.Fatal(err)
		}
		c, err := docs.Extract(w.file, string(text), w.section)
		if err != nil {
			t.Fatal(err)
		}
		if len(c) == 0 {
			t.Fatalf("%s (%q): no shell examples found", w.file, w.section)
		}
		cmds = append(cmds, c...)
	}

	var script strings.Builder
	script.WriteString("shopt -s expand_aliases\n")
	for i, c := range cmds {
		// The blank line ends output that has no final newline.
		fmt.Fprintf(&script, "echo '@@begin %d'\n{ %s\n} 2>&1\nrc=$?\necho\necho \"@@rc %d $rc\"\n", i, c.Script, i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "--noprofile", "--norc")
	sh.Dir = work
	// The user's shell has the address dev-up was given (the docs default to
	// dev-up's own default).
	sh.Env = append(withoutKubeconfig(os.Environ()), "MANAGER_METRICS_ADDRESS="+metricsAddr)
	sh.Stdin = strings.NewReader(script.String())
	transcript, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("the shell failed: %v\n%s", err, transcript)
	}
	outputs, rcs := split(string(transcript))
	failed := false
	for i, c := range cmds {
		rc, ran := rcs[i]
		switch {
		case !ran:
			t.Errorf("%s: never ran: %s", c.Where, c.Script)
		case rc != 0 && !c.FailureExpected():
			t.Errorf("%s: exit status %d, the docs show it succeeding:\n$ %s\n%s", c.Where, rc, c.Script, outputs[i])
		case rc == 0 && c.FailureExpected():
			t.Errorf("%s: succeeded, the docs show it refused:\n$ %s\n%s", c.Where, c.Script, outputs[i])
		}
		if m := docs.Missing(c.Shown, outputs[i]); len(m) > 0 {
			t.Errorf("%s: the docs show lines that the output does not have:\n$ %s\nmissing:\n  %s\noutput:\n%s",
				c.Where, c.Script, strings.Join(m, "\n  "), outputs[i])
		}
		failed = failed || t.Failed()
	}
	if failed {
		t.Logf("the whole session:\n%s", transcript)
	}
	checkMetricNames(t, metricsAddr)
	t.Logf("%d commands from %d documents ran as documented", len(cmds), len(walked))
}

// linkBin makes work/bin: a link to each tool in the repository's bin/,
// and kubectl-fence built from this tree.
func linkBin(t *testing.T, root, work string) {
	t.Helper()
	bin := filepath.Join(work, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	tools, err := os.ReadDir(filepath.Join(root, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools {
		if tool.Name() == "kubectl-fence" {
			continue
		}
		if err := os.Symlink(filepath.Join(root, "bin", tool.Name()), filepath.Join(bin, tool.Name())); err != nil {
			t.Fatal(err)
		}
	}
	plugin, err := envtestutil.BuildBinary("./cmd/kubectl-fence")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(plugin, filepath.Join(bin, "kubectl-fence")); err != nil {
		t.Fatal(err)
	}
}

var marker = regexp.MustCompile(`^@@(begin|rc) ([0-9]+)(?: ([0-9]+))?$`)

// split cuts the session's transcript into each command's output and exit
// status.
func split(transcript string) (map[int]string, map[int]int) {
	outputs, rcs := map[int]string{}, map[int]int{}
	cur := -1
	var b strings.Builder
	for _, line := range strings.Split(transcript, "\n") {
		m := marker.FindStringSubmatch(line)
		switch {
		case m == nil:
			if cur >= 0 {
				b.WriteString(line + "\n")
			}
		case m[1] == "begin":
			cur, _ = strconv.Atoi(m[2])
			b.Reset()
		default:
			i, _ := strconv.Atoi(m[2])
			rcs[i], _ = strconv.Atoi(m[3])
			outputs[i] = b.String()
			cur = -1
		}
	}
	return outputs, rcs
}

func withoutKubeconfig(env []string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, "KUBECONFIG=") {
			out = append(out, e)
		}
	}
	return out
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// designMetrics are the manager's metric names in DESIGN §8 (the holder
// library's are on its callers' registries).
var designMetrics = []string{
	"fencekeeper_grants_total", "fencekeeper_expirations_total", "fencekeeper_releases_total",
	"fencekeeper_forced_releases_total", "fencekeeper_acquire_wait_seconds", "fencekeeper_hold_duration_seconds",
	"fencekeeper_waiters", "fencekeeper_oldest_waiter_age_seconds", "fencekeeper_contended_locks",
	"fencekeeper_admission_decisions_total", "fencekeeper_admission_duration_seconds",
}

// checkMetricNames scrapes the dev-up manager, as `curl` would after the
// tour (grants done, a pod still waiting), and wants every DESIGN §8 name.
func checkMetricNames(t *testing.T, addr string) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping the manager: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range designMetrics {
		if !regexp.MustCompile(`(?m)^` + name + `(_bucket|_count|_sum)?[{ ]`).Match(body) {
			t.Errorf("the manager's /metrics has no %s", name)
		}
	}
}

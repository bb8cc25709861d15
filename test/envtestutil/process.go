package envtestutil

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// BuildBinary builds the main package pkg of this repository (for example
// "./cmd/manager") once per test process, into the temporary directory (the
// Go build cache makes it quick), and returns its path.
func BuildBinary(pkg string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if path, ok := built[pkg]; ok {
		return path, nil
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("fencekeeper-%s-test-%d", filepath.Base(pkg), os.Getpid()))
	build := exec.Command("go", "build", "-o", path, pkg)
	build.Dir = RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, out)
	}
	built[pkg] = path
	return path, nil
}

// ManagerBinary builds cmd/manager (see BuildBinary).
func ManagerBinary() (string, error) { return BuildBinary("./cmd/manager") }

// ManagerProcess is bin/manager running as a real process: the faults that
// only a process has (SIGSTOP, SIGKILL) can be injected into it.
type ManagerProcess struct {
	Cmd  *exec.Cmd
	done ended
	// cel: started with --fencing-mode=cel.
	cel bool
}

// StartManagerProcess runs the manager as the manager identity, serving the
// fencing webhook where envtest registered it, and waits until it answers
// admission. extraArgs are appended to its command line.
func StartManagerProcess(ctx context.Context, env *envtest.Environment, admin client.Client, dir string, out io.Writer, extraArgs ...string) (*ManagerProcess, error) {
	return StartManagerProcessVia(ctx, env, admin, dir, out, nil, extraArgs...)
}

// StartManagerProcessVia is StartManagerProcess with the manager reaching
// the apiserver through via (nil: directly).
func StartManagerProcessVia(ctx context.Context, env *envtest.Environment, admin client.Client, dir string, out io.Writer, via *fault.Proxy, extraArgs ...string) (*ManagerProcess, error) {
	bin, err := ManagerBinary()
	if err != nil {
		return nil, err
	}
	u, err := env.AddUser(envtest.User{Name: ManagerUser, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return nil, err
	}
	if via != nil {
		if kc, err = via.Through(kc); err != nil {
			return nil, err
		}
	}
	kubeconfig := filepath.Join(dir, "manager.kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}
	wh := env.WebhookInstallOptions
	args := append([]string{"--kubeconfig", kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--webhook-port", strconv.Itoa(wh.LocalServingPort), "--webhook-cert-dir", wh.LocalServingCertDir}, extraArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &ManagerProcess{Cmd: cmd, done: newEnded(), cel: slices.Contains(extraArgs, "--fencing-mode=cel")}
	go func() { p.done <- cmd.Wait() }()
	if err := p.waitAnswering(ctx, admin); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// waitAnswering waits until the process answers admission: a dry-run create
// of a fenced object without an epoch is refused by the webhook itself (in
// CEL mode: until the policies it applies are enforced).
func (p *ManagerProcess) waitAnswering(ctx context.Context, admin client.Client) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "probe",
			Labels: map[string]string{fkv1.LabelLock: "probe"}}}
		if p.cel {
			// Admission runs in the apiserver: wait for the policies this
			// process applies (the base policy refuses an empty lock label).
			probe.Labels[fkv1.LabelLock] = ""
		}
		err := admin.Create(ctx, probe, client.DryRunAll)
		if err != nil && (strings.Contains(err.Error(), "missing epoch") ||
			p.cel && fkv1.PolicyDenialReason(err.Error()) == fkv1.AdmissionEmptyLockLabel) {
			return nil
		}
		if exited, perr := p.done.peek(); exited {
			return fmt.Errorf("the manager process exited before answering admission: %v", perr) //nolint:errorlint // nil when it exited 0; %w would print %!w(<nil>)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the manager process does not answer admission after 60s (probe: %v)", err) //nolint:errorlint // the probe's result (often nil) is context, not the cause
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Exited reports whether the process has ended (a manager that lost its
// leadership exits).
func (p *ManagerProcess) Exited() bool {
	exited, _ := p.done.peek()
	return exited
}

// Signal sends sig to the process.
func (p *ManagerProcess) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// Stop resumes (if stopped) and terminates the process, killing it after 20 s.
func (p *ManagerProcess) Stop() {
	_ = p.Cmd.Process.Signal(syscall.SIGCONT)
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	if exited, _ := p.done.wait(20 * time.Second); !exited {
		p.Kill()
	}
}

// Kill kills the process (SIGKILL: no cleanup, like a node losing power) and
// waits for it.
func (p *ManagerProcess) Kill() {
	_ = p.Cmd.Process.Kill()
	err := <-p.done
	p.done <- err
}

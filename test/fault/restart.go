package fault

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/proc"
)

// ControlPlaneProcess is etcd or kube-apiserver of a control plane this test
// process started (envtest's), found by name among this process's children,
// so faults can be injected into it: a pause (SIGSTOP), or a restart
// (SIGKILL, then the same command line again: etcd keeps its data directory,
// kube-apiserver its certificates and port).
type ControlPlaneProcess struct {
	Name string
	pid  int
	args []string
	cmd  *exec.Cmd // our own re-started process, once restarted
	// exited gets cmd.Wait's result (buffered: one value).
	exited chan error
	out    io.Writer
}

// Pid is the process's current pid (it changes when it is restarted).
func (p *ControlPlaneProcess) Pid() int {
	if p.cmd != nil && p.cmd.Process != nil {
		return p.cmd.Process.Pid
	}
	return p.pid
}

// FindControlPlaneProcess finds the child process of this test process whose
// executable is named name ("etcd", "kube-apiserver").
func FindControlPlaneProcess(name string, out io.Writer) (*ControlPlaneProcess, error) {
	self := os.Getpid()
	children, err := proc.Children(self)
	if err != nil {
		return nil, err
	}
	for _, c := range children {
		raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c.Pid), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(args[0]) == name {
			return &ControlPlaneProcess{Name: name, pid: c.Pid, args: args, out: out}, nil
		}
	}
	return nil, fmt.Errorf("no %s child process of pid %d", name, self)
}

// Args is the process's command line, the executable first (a copy).
func (p *ControlPlaneProcess) Args() []string { return append([]string(nil), p.args...) }

// Arg returns the value of --name=value on the process's command line.
func (p *ControlPlaneProcess) Arg(name string) string {
	for _, a := range p.args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// Pause stops the process for d (every request to it hangs meanwhile).
func (p *ControlPlaneProcess) Pause(d time.Duration) {
	_ = syscall.Kill(p.pid, syscall.SIGSTOP)
	time.Sleep(d)
	_ = syscall.Kill(p.pid, syscall.SIGCONT)
}

// Restart kills the process, waits down, and starts it again with the same
// command line.
func (p *ControlPlaneProcess) Restart(down time.Duration) error {
	return p.RestartAfter(func() error { time.Sleep(down); return nil })
}

// RestartAfter kills the process, runs whileDown (restore a snapshot into
// its data directory, say), and starts it again with the same command line.
func (p *ControlPlaneProcess) RestartAfter(whileDown func() error) error {
	p.kill()
	if err := whileDown(); err != nil {
		return err
	}
	// Its port was free a moment ago, but while it was down another
	// connection on this machine (the parallel test packages make many) may
	// have been given the same number as its ephemeral local port: then the
	// bind fails ("address already in use") until that connection closes.
	// Start again until the process stays up.
	var last string
	for attempt := 0; attempt < 30; attempt++ {
		var early bytes.Buffer
		cmd := exec.Command(p.args[0], p.args[1:]...)
		out := io.MultiWriter(&lockedBuffer{b: &early}, orDiscard(p.out))
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("restarting %s: %w", p.Name, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			last = fmt.Sprintf("%v: %s", err, early.String())
			if !strings.Contains(last, "address already in use") {
				return fmt.Errorf("restarting %s: it exited at once: %s", p.Name, last)
			}
			time.Sleep(time.Second)
			continue
		case <-time.After(time.Second): // a bind failure shows within milliseconds
		}
		p.cmd, p.pid, p.exited = cmd, cmd.Process.Pid, exited
		return nil
	}
	return fmt.Errorf("restarting %s: its port stayed in use for 30 attempts: %s", p.Name, last)
}

// lockedBuffer is a bytes.Buffer written from the process's output copier
// and read here.
type lockedBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func (p *ControlPlaneProcess) kill() {
	_ = syscall.Kill(p.pid, syscall.SIGCONT)
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	if p.cmd != nil {
		// cmd.Wait's error is dropped: "signal: killed" is what we asked for.
		waitErr := <-p.exited
		_ = waitErr
		p.exited <- nil // for a later Stop
		return
	}
	// envtest's own child: envtest reaps it; wait until it is gone.
	for i := 0; i < 500; i++ {
		if st, ok := proc.ReadProc(p.pid); !ok || st.Zombie() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills a process this helper restarted (envtest stops the original).
// Call it before stopping the environment.
func (p *ControlPlaneProcess) Stop() {
	if p.cmd != nil {
		_ = syscall.Kill(p.pid, syscall.SIGCONT)
		proc.Terminate(p.cmd.Process, p.exited, 20*time.Second)
		p.cmd = nil
	}
}

// WaitAnswering waits up to a minute until the apiserver answers c again
// (after a restart of it or of etcd) and serves FencedLeases: a restarted
// kube-apiserver answers for built-in kinds a moment before its CRD
// handler and discovery know the CRDs again ("no matches for kind").
func WaitAnswering(ctx context.Context, c client.Client) error {
	var err error
	for i := 0; i < 600; i++ {
		if err = c.List(ctx, &corev1.NamespaceList{}, client.Limit(1)); err == nil {
			if err = c.List(ctx, &fkv1.FencedLeaseList{}, client.Limit(1)); err == nil {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the apiserver does not answer after a minute: %w", err)
}

// WaitEtcdHealthy waits until etcd at clientURL reports itself healthy
// (GET /health), so a kube-apiserver started next finds it serving.
func WaitEtcdHealthy(ctx context.Context, clientURL string) error {
	var last string
	for i := 0; i < 600; i++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(clientURL, "/")+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(b, []byte(`"health":"true"`)) {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("etcd at %s is not healthy after a minute: %s", clientURL, last)
}

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// WriterCommand is the argument that makes the chaos test binary act as the
// command a `kubectl fence run` worker runs (see RunWriter).
const WriterCommand = "chaos-writer"

// ProcessWorker is a holder made of real processes: `kubectl fence run`
// holding the lock, running this test binary as its command, which writes
// the fenced objects with the epoch in its environment until it is told the
// lease is lost. The nemesis of the run stops both processes (SIGSTOP to the
// process group: a paused machine) for up to 3×TTL and resumes them.
type ProcessWorker struct {
	Name       string
	NS, Lock   string
	TTL        time.Duration
	Plugin     string // the kubectl-fence binary
	Kubeconfig string
	Rng        *rand.Rand
	Pauses     *atomic.Int64
	Runs       *atomic.Int64
}

// Run starts `kubectl fence run` again and again until ctx ends.
func (p *ProcessWorker) Run(ctx context.Context) {
	self, err := os.Executable()
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		cmd := exec.Command(p.Plugin, "--kubeconfig", p.Kubeconfig, "-n", p.NS, "run", p.Lock,
			"--holder", p.Name, "--ttl", p.TTL.String(), "--grace", "2s", "--", self, WriterCommand)
		cmd.Env = append(os.Environ(), "CHAOS_KUBECONFIG="+p.Kubeconfig)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return
		}
		p.Runs.Add(1)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		pgid := cmd.Process.Pid
		life := time.After(time.Duration(1000+p.Rng.IntN(4000)) * time.Millisecond)
	loop:
		for {
			select {
			case <-done:
				break loop
			case <-ctx.Done():
				_ = syscall.Kill(-pgid, syscall.SIGCONT)
				_ = syscall.Kill(-pgid, syscall.SIGTERM)
				<-done
				return
			case <-life:
				if p.Rng.IntN(2) == 0 {
					// A paused machine: plugin and command stop together.
					p.Pauses.Add(1)
					_ = syscall.Kill(-pgid, syscall.SIGSTOP)
					sleep(ctx, time.Duration(p.Rng.Int64N(int64(3*p.TTL))))
					_ = syscall.Kill(-pgid, syscall.SIGCONT)
				}
				life = time.After(time.Duration(1000+p.Rng.IntN(4000)) * time.Millisecond)
				if p.Rng.IntN(3) == 0 {
					_ = syscall.Kill(-pgid, syscall.SIGTERM) // done with the work: exit and release
				}
			}
		}
		// The plugin is gone; make sure its command is too.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// RunWriter is the command `kubectl fence run` runs: it writes the fenced
// objects with $FENCEKEEPER_EPOCH by merge patch, as its holder, until it is
// signalled. It never checks whether its lease is still valid: that is the
// fence's job.
func RunWriter() int {
	epoch, err := strconv.ParseInt(os.Getenv("FENCEKEEPER_EPOCH"), 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos-writer: no epoch:", err)
		return 2
	}
	ns, holder := os.Getenv("FENCEKEEPER_NAMESPACE"), os.Getenv("FENCEKEEPER_HOLDER")
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("CHAOS_KUBECONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos-writer:", err)
		return 2
	}
	c, err := client.New(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos-writer:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(epoch)))
	objects := append(append([]string(nil), ObjectsCurrent...), ObjectMonotonic)
	for seq := 1; ctx.Err() == nil; seq++ {
		obj := objects[rng.IntN(len(objects))]
		b, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"annotations": map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(epoch)}},
			"data":     map[string]string{"report.csv": fmt.Sprintf("epoch=%d writer=%s seq=%d", epoch, holder, seq)},
		})
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		// Objects are created by the goroutine workers; a missing one is skipped.
		_ = c.Patch(wctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: obj}}, client.RawPatch("application/merge-patch+json", b))
		cancel()
		sleep(ctx, time.Duration(50+rng.IntN(100))*time.Millisecond)
	}
	return 0
}

package election_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fencekeeper/fencekeeper/pkg/election"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	env   *envtestutil.AdmissionEnv
	admin client.WithWatch
)

// TestElection runs the fenced leader election against a real apiserver,
// the fencing webhook and the authority.
func TestElection(t *testing.T) {
	logf.SetLogger(zap.New(zap.WriteTo(testWriter{t}), zap.UseDevMode(true)))
	env = envtestutil.StartAdmissionEnvWithManager(t, []string{"configmaps", "reports.reports.example.com"},
		filepath.Join(envtestutil.RepoRoot(), "test", "crds"))
	var err error
	if admin, err = client.NewWithWatch(env.Admin, client.Options{Scheme: lease.Scheme()}); err != nil {
		t.Fatal(err)
	}
	t.Run("one leader at a time by the authority's history, graceful handoff", testOneLeaderAtATime)
	t.Run("a leader whose apiserver hangs stops acting before the next is granted", testHungLeader)
	t.Run("the gate stamps every write path and leaves unfenced objects alone", testGateWritePaths)
	t.Run("the transport gate for client-go clients", testTransportGate)
	t.Run("a waiting replica leaves the queue when its manager stops", testWaitingReplicaLeavesQueue)
	t.Run("Release before the grant ends the election", testReleaseBeforeGrant)
	t.Run("status writes of a fenced object by name are refused after the term", testStatusByName)
	t.Run("a gated write held up in the client is not sent after the safe time", testWriteDeadline)
	t.Run("the gate presents the epoch on scales and refuses subresource writes after the term", testGateScale)
	t.Run("the transport gate presents the epoch on scales and refuses subresource writes after the term", testTransportScale)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// faultTransport hangs every request while hang is set: an apiserver
// connection that stops answering. It counts the requests it let through.
type faultTransport struct {
	next http.RoundTripper
	hang atomic.Bool
	// hangPath, when set, hangs only the requests whose path contains it.
	hangPath atomic.Value
	mu       sync.Mutex
	writes   []string
}

func (f *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if p, _ := f.hangPath.Load().(string); f.hang.Load() || (p != "" && strings.Contains(req.URL.Path, p)) {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	if req.Method != http.MethodGet {
		f.mu.Lock()
		f.writes = append(f.writes, req.Method+" "+req.URL.Path)
		f.mu.Unlock()
	}
	return f.next.RoundTrip(req)
}

func (f *faultTransport) sent(fragment string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.writes {
		if strings.Contains(w, fragment) {
			n++
		}
	}
	return n
}

// leadership is one term as the leader's runnable saw it.
type leadership struct {
	who        string
	epoch      int64
	start, end time.Time
}

type journal struct {
	mu    sync.Mutex
	terms []leadership
}

func (j *journal) begin(who string, epoch int64) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.terms = append(j.terms, leadership{who: who, epoch: epoch, start: time.Now()})
	return len(j.terms) - 1
}

func (j *journal) finish(i int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.terms[i].end = time.Now()
}

func (j *journal) snapshot() []leadership {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]leadership(nil), j.terms...)
}

// candidate is one replica of an operator: a controller-runtime manager
// under fenced leader election, in this process.
type candidate struct {
	name   string
	lock   *election.Lock
	mgr    manager.Manager
	faults *faultTransport
	cancel context.CancelFunc
	done   chan error
	leads  chan int64
}

func startCandidate(t *testing.T, ns, lockName, name string, ttl time.Duration, j *journal) *candidate {
	t.Helper()
	f := &faultTransport{}
	cfg := rest.CopyConfig(env.Admin)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
	lock, err := election.New(cfg, election.Config{Namespace: ns, Name: lockName, Identity: name, TTL: ttl,
		Logger: logf.Log.WithName(name)})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, lock.ManagerOptions(ctrl.Options{
		Scheme:                 lease.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Logger:                 logf.Log.WithName(name),
	}))
	if err != nil {
		t.Fatal(err)
	}
	// As docs/leader-election.md adopts it: the Lock leaves the queue on shutdown.
	if err := mgr.Add(lock); err != nil {
		t.Fatal(err)
	}
	c := &candidate{name: name, lock: lock, mgr: mgr, faults: f, done: make(chan error, 1), leads: make(chan int64, 1)}
	// The leader's work: it runs only while controller-runtime says this
	// replica leads, and notes when.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		epoch, err := lock.Epoch()
		if err != nil {
			return fmt.Errorf("started leading without a term: %w", err)
		}
		i := j.begin(name, epoch)
		c.leads <- epoch
		<-ctx.Done()
		j.finish(i)
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- mgr.Start(ctx) }()
	t.Cleanup(func() { c.stop() })
	return c
}

// stop shuts the replica down the way SIGTERM does and returns Start's result.
func (c *candidate) stop() error {
	c.cancel()
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(60 * time.Second):
		return errors.New("manager did not stop within 60s")
	}
}

// waitLeads waits until the candidate's leader runnable starts.
func (c *candidate) waitLeads(t *testing.T, within time.Duration) int64 {
	t.Helper()
	select {
	case e := <-c.leads:
		return e
	case err := <-c.done:
		t.Fatalf("%s: manager exited before leading: %v", c.name, err)
	case <-time.After(within):
		t.Fatalf("%s did not lead within %v", c.name, within)
	}
	return 0
}

func (c *candidate) leading() bool {
	select {
	case e := <-c.leads:
		c.leads <- e
		return true
	default:
		return false
	}
}

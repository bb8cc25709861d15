// Package election_test runs the fenced leader election (pkg/election)
// against a real apiserver, the fencing webhook and the authority: one
// control plane, with the fencing webhook for ConfigMaps and test Reports
// (test/crds), the Lease guard and an in-process manager, for the suite.
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

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/fencekeeper/fencekeeper/pkg/election"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	suite *envtestutil.Suite
	env   *envtestutil.AdmissionEnv
	admin client.WithWatch
)

// TestElection runs the fenced leader election against a real apiserver,
// the fencing webhook and the authority.
func TestElection(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Fenced leader election suite")
}

var _ = BeforeSuite(func() {
	var err error
	suite, err = envtestutil.StartSuite(context.Background(), envtestutil.SuiteOptions{Log: GinkgoWriter,
		Guarded: []string{"configmaps", "reports.reports.example.com"},
		CRDDirs: []string{filepath.Join(envtestutil.RepoRoot(), "test", "crds")},
		Manager: true, Scheme: lease.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	env, admin = suite.Admission, suite.Client
})

var _ = AfterSuite(func() {
	if suite != nil {
		Expect(suite.Stop()).To(Succeed())
	}
})

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

// startCandidate starts a replica, stopped when the spec ends.
func startCandidate(ns, lockName, name string, ttl time.Duration, j *journal) *candidate {
	GinkgoHelper()
	f := &faultTransport{}
	cfg := rest.CopyConfig(env.Admin)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
	lock, err := election.New(cfg, election.Config{Namespace: ns, Name: lockName, Identity: name, TTL: ttl,
		Logger: logf.Log.WithName(name)})
	Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(cfg, lock.ManagerOptions(ctrl.Options{
		Scheme:                 lease.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Logger:                 logf.Log.WithName(name),
	}))
	Expect(err).NotTo(HaveOccurred())
	// As docs/leader-election.md adopts it: the Lock leaves the queue on shutdown.
	Expect(mgr.Add(lock)).To(Succeed())
	c := &candidate{name: name, lock: lock, mgr: mgr, faults: f, done: make(chan error, 1), leads: make(chan int64, 1)}
	// The leader's work: it runs only while controller-runtime says this
	// replica leads, and notes when.
	Expect(mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		epoch, err := lock.Epoch()
		if err != nil {
			return fmt.Errorf("started leading without a term: %w", err)
		}
		i := j.begin(name, epoch)
		c.leads <- epoch
		<-ctx.Done()
		j.finish(i)
		return nil
	}))).To(Succeed())
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- mgr.Start(ctx) }()
	DeferCleanup(func() { _ = c.stop() })
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
func (c *candidate) waitLeads(within time.Duration) int64 {
	GinkgoHelper()
	select {
	case e := <-c.leads:
		return e
	case err := <-c.done:
		Fail(fmt.Sprintf("%s: manager exited before leading: %v", c.name, err))
	case <-time.After(within):
		Fail(fmt.Sprintf("%s did not lead within %v", c.name, within))
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

package election

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// ErrNotLeading: this process holds no live term of the lock (never
// granted yet, SUSPECT, lost or released), so the write gate refused a
// write to a fenced object without sending it.
var ErrNotLeading = errors.New("fencekeeper: not the leader")

// Config names the lock and the candidate.
type Config struct {
	// Namespace and Name are the lock's (the Lease the authority keeps and
	// the value of the fencekeeper.io/lock label on fenced objects).
	Namespace, Name string
	// Identity is this candidate's holder identity. Default: the hostname
	// (the pod name in a pod) and a random suffix, as controller-runtime's.
	Identity string
	// TTL is the lease duration the authority enforces (default 15s, whole
	// seconds). A paused or cut-off leader stops writing within it.
	TTL time.Duration
	// Logger gets state transitions and retries.
	Logger logr.Logger
	// OnTransition is called on every state change of every term
	// (synchronously: keep it short, and do not call the Lock's Release
	// from it).
	OnTransition func(lease.Transition)
}

// Lock is a client-go resourcelock.Interface whose terms are FencedLease
// grants. Leadership follows the authority: Get reports this candidate as
// holder exactly while its term is HELD or SUSPECT, and never reports a
// lease another client-go candidate could take over on its own clock.
//
// A Lock serves one election: once a term ends it never leads again, so a
// manager that lost its term exits (as controller-runtime does) instead of
// carrying its stale view into a new term. Make a new Lock per manager.
type Lock struct {
	cfg     Config
	holders *lease.Client

	mu          sync.Mutex
	acquiring   bool
	stopAcquire context.CancelFunc // ends a pending acquisition
	acquireDone chan struct{}      // closed when the acquisition goroutine returns
	term        *lease.Lease
	observed    bool          // client-go saw this term (Get reported it): its release is client-go's
	ended       bool          // a term ended or the election stopped: never lead again
	unseen      chan struct{} // closed when a term ends before client-go saw it
	granted     metav1.Time
}

// New returns a Lock whose claims are made with cfg's identity (the one
// the fenced objects' writes come from: identity binding, DESIGN §3 rule 9).
func New(restCfg *rest.Config, cfg Config) (*Lock, error) {
	c, err := client.NewWithWatch(restCfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return nil, err
	}
	return NewFromClient(c, cfg)
}

// NewFromClient returns a Lock using c (its scheme must know FencedLease).
func NewFromClient(c client.WithWatch, cfg Config) (*Lock, error) {
	if cfg.Namespace == "" || cfg.Name == "" {
		return nil, fmt.Errorf("election: Config.Namespace and Config.Name are required (the lock's namespace and name)")
	}
	// Checked here, once: the queueing goroutine would retry a bad name forever.
	if err := lease.ValidateLockName(cfg.Name); err != nil {
		return nil, fmt.Errorf("election: Config.Name: %w", err)
	}
	if cfg.TTL == 0 {
		cfg.TTL = 15 * time.Second
	}
	if cfg.TTL < time.Second || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("election: TTL %v: want whole seconds, at least 1s", cfg.TTL)
	}
	if cfg.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("election: no Identity given and no hostname: %w", err)
		}
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.Identity = host + "_" + hex.EncodeToString(b)
	}
	if err := lease.ValidateHolder(cfg.Identity); err != nil {
		return nil, fmt.Errorf("election: Config.Identity: %w", err)
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = logr.Discard()
	}
	return &Lock{cfg: cfg, holders: lease.NewClientFrom(c, cfg.Namespace).WithLogger(cfg.Logger), unseen: make(chan struct{})}, nil
}

// Identity is the candidate's holder identity.
func (l *Lock) Identity() string { return l.cfg.Identity }

// Describe names the lock for client-go's logs.
func (l *Lock) Describe() string {
	return fmt.Sprintf("fencedlease %s/%s", l.cfg.Namespace, l.cfg.Name)
}

// RecordEvent logs client-go's leadership events; the authority already
// records an Event per grant on the claim.
func (l *Lock) RecordEvent(s string) {
	l.cfg.Logger.Info("leader election", "lock", l.Describe(), "identity", l.cfg.Identity, "event", s)
}

// Term is the current term's lease (nil before the first grant): its Epoch,
// State and Context (cancelled when the term ends).
func (l *Lock) Term() *lease.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term
}

// Epoch is the leader's fencing token while its term is HELD.
func (l *Lock) Epoch() (int64, error) {
	t, _, err := l.leading()
	if err != nil {
		return 0, err
	}
	return t.Epoch, nil
}

// leading is the live term and the moment it would turn SUSPECT (writes
// are not sent after it), or why there is none. SUSPECT refuses: the
// renewal is in doubt and another holder may be granted before it resolves.
func (l *Lock) leading() (*lease.Lease, time.Time, error) {
	var never time.Time
	t := l.Term()
	if t == nil {
		return nil, never, fmt.Errorf("%w of lock %s/%s: no term granted to %s", ErrNotLeading, l.cfg.Namespace, l.cfg.Name, l.cfg.Identity)
	}
	switch s := t.State(); s {
	case lease.Held:
		// The state goroutines may not have run yet (a process that was
		// just resumed from a pause): judge the safe time by the clock too.
		now := time.Now()
		rem := t.Remaining()
		if rem <= 0 {
			return nil, never, fmt.Errorf("%w of lock %s/%s: the term of epoch %d ran out of safe time %v ago: %w", ErrNotLeading, l.cfg.Namespace, l.cfg.Name, t.Epoch, -rem.Round(time.Millisecond), lease.ErrLost)
		}
		if rem <= t.TTL/3 {
			return nil, never, fmt.Errorf("%w of lock %s/%s: the term of epoch %d has %v of safe time left (SUSPECT)", ErrNotLeading, l.cfg.Namespace, l.cfg.Name, t.Epoch, rem.Round(time.Millisecond))
		}
		return t, now.Add(rem - t.TTL/3), nil
	case lease.Lost:
		return nil, never, fmt.Errorf("%w of lock %s/%s: the term of epoch %d is LOST: %w", ErrNotLeading, l.cfg.Namespace, l.cfg.Name, t.Epoch, lease.ErrLost)
	default:
		return nil, never, fmt.Errorf("%w of lock %s/%s: the term of epoch %d is %s", ErrNotLeading, l.cfg.Namespace, l.cfg.Name, t.Epoch, s)
	}
}

// record is what client-go sees. Its raw form changes exactly when the term
// changes, which is all client-go compares.
type record struct {
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch,omitempty"`
	State  string `json:"state"`
}

// forever keeps client-go from ever judging a foreign term expired on its
// own clock: only the authority ends terms.
const forever = math.MaxInt32

// Get reports this candidate as holder while its term is HELD or SUSPECT.
// Otherwise it reports a foreign holder whose lease client-go must never
// take over itself, and (once per election) starts queueing a claim: the
// grant, on the authority's clock, is what makes this candidate leader. Get
// makes no API call, so client-go may poll it often.
func (l *Lock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.term; t != nil {
		if s := t.State(); s == lease.Held || s == lease.Suspect {
			l.observed = true
			return l.encode(rl.LeaderElectionRecord{HolderIdentity: l.cfg.Identity, LeaseDurationSeconds: int(t.TTL / time.Second),
				AcquireTime: l.granted, RenewTime: metav1.Now(), LeaderTransitions: int(t.Epoch)},
				record{Holder: l.cfg.Identity, Epoch: t.Epoch, State: "leading"})
		}
		l.ended = true
		if !l.observed {
			l.endUnseen()
		}
		return l.foreign("ended")
	}
	if !l.ended && !l.acquiring {
		actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		l.acquiring, l.stopAcquire, l.acquireDone = true, cancel, make(chan struct{})
		go l.acquire(ctx, actx, l.acquireDone)
	}
	return l.foreign("waiting")
}

// endUnseen reports (once) a term that ended before client-go saw it: the
// elector keeps polling a lock that will never be granted again, so Start
// stops the manager instead (call with l.mu held).
func (l *Lock) endUnseen() {
	select {
	case <-l.unseen:
	default:
		close(l.unseen)
	}
}

func (l *Lock) foreign(state string) (*rl.LeaderElectionRecord, []byte, error) {
	holder := fmt.Sprintf("(the holder fencekeeper grants %s/%s)", l.cfg.Namespace, l.cfg.Name)
	return l.encode(rl.LeaderElectionRecord{HolderIdentity: holder, LeaseDurationSeconds: forever},
		record{Holder: holder, State: state})
}

func (l *Lock) encode(r rl.LeaderElectionRecord, raw record) (*rl.LeaderElectionRecord, []byte, error) {
	b, err := json.Marshal(raw)
	return &r, b, err
}

// acquire queues a claim until it is granted, or until the election that
// asked stops (client-go cancels ctx when its Run ends) or the Lock is
// stopped (actx): then the claim is deleted, leaving the queue cleanly.
func (l *Lock) acquire(ctx, actx context.Context, done chan struct{}) {
	defer close(done)
	cancel := l.stopAcquireFunc()
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		// client-go cancels its acquire context once it leads; only an
		// election that stops before our grant ends the queueing.
		if !l.isLeading() {
			cancel()
		}
	})
	defer stop()
	backoff := 100 * time.Millisecond
	for actx.Err() == nil {
		t, err := l.holders.Acquire(actx, l.cfg.Name, l.cfg.Identity, lease.Options{TTL: l.cfg.TTL, OnTransition: func(tr lease.Transition) {
			if t := l.Term(); tr.To == lease.Lost && t != nil {
				// The gate refuses from here on; deleting the claim now lets
				// the authority grant the next candidate without waiting for
				// its own expiry of this term (client-go releases nothing:
				// it no longer believes it leads).
				go func(t *lease.Lease) {
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = t.Release(rctx)
				}(t)
			}
			if l.cfg.OnTransition != nil {
				l.cfg.OnTransition(tr)
			}
		}})
		if err == nil {
			l.mu.Lock()
			if ctx.Err() != nil || actx.Err() != nil || l.ended {
				// The election or the Lock stopped as the grant came:
				// client-go cannot have led yet (it leads only after Get
				// reports this term), so nobody will use the term.
				l.acquiring, l.ended = false, true
				l.mu.Unlock()
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = t.Release(rctx)
				rcancel()
				return
			}
			l.term, l.granted, l.acquiring = t, metav1.Now(), false
			l.mu.Unlock()
			if t.State() == lease.Lost {
				// Lost before it was recorded here: the hook did not see it.
				go func() {
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = t.Release(rctx)
				}()
			}
			l.cfg.Logger.Info("granted a term", "lock", l.Describe(), "identity", l.cfg.Identity, "epoch", t.Epoch)
			return
		}
		if actx.Err() != nil {
			break
		}
		// Turned away (queue full), expired while waiting, deleted by an
		// operator: queue again with a new claim.
		l.cfg.Logger.Info("queueing for the lock failed; retrying", "lock", l.Describe(), "error", err.Error())
		select {
		case <-actx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	l.mu.Lock()
	l.acquiring, l.ended = false, true
	l.mu.Unlock()
}

func (l *Lock) stopAcquireFunc() context.CancelFunc {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopAcquire
}

func (l *Lock) isLeading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term != nil
}

// Create is never needed (Get never reports NotFound); it behaves as Update.
func (l *Lock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	return l.Update(ctx, ler)
}

// Update is client-go renewing (accepted while the term is HELD or SUSPECT:
// the real renewal runs in the holder library on the authority's rules) or,
// with an empty holder, client-go's ReleaseOnCancel: the claim is deleted at
// once and the next candidate is granted without waiting out the TTL.
func (l *Lock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		return l.Release(ctx)
	}
	t := l.Term()
	if ler.HolderIdentity != l.cfg.Identity || t == nil {
		return fmt.Errorf("%w of lock %s/%s: waiting for the authority's grant", ErrNotLeading, l.cfg.Namespace, l.cfg.Name)
	}
	if s := t.State(); s != lease.Held && s != lease.Suspect {
		return fmt.Errorf("%w of lock %s/%s: the term of epoch %d is %s", ErrNotLeading, l.cfg.Namespace, l.cfg.Name, t.Epoch, s)
	}
	return nil
}

// Release ends this Lock's election: a pending claim leaves the queue, and
// a term ends now (its claim deleted by UID). It never leads again.
func (l *Lock) Release(ctx context.Context) error {
	t, _ := l.stop(ctx)
	if t == nil {
		return nil
	}
	return t.Release(ctx)
}

// stop ends the election and any pending acquisition, waiting (until ctx
// ends) for its claim to leave the queue. It returns the term, if any, and
// whether client-go saw it; a term client-go never saw is withdrawn at once
// (Get will not report it), for the caller to release.
func (l *Lock) stop(ctx context.Context) (*lease.Lease, bool) {
	l.mu.Lock()
	l.ended = true
	cancel, done := l.stopAcquire, l.acquireDone
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t, observed := l.term, l.observed
	if t != nil && !observed {
		l.term = nil
	}
	return t, observed
}

// NeedLeaderElection: the Lock runs as a manager runnable on every
// replica, leader or not (add it with mgr.Add).
func (l *Lock) NeedLeaderElection() bool { return false }

// Start makes the Lock a manager runnable that leaves the queue cleanly on
// shutdown: controller-runtime stops it before it ends the election, so a
// waiting replica's claim is deleted before the process exits (without it,
// a dead replica's claim is granted and then expires, leaving the lock
// without a leader for a TTL). A term granted as the shutdown began, which
// client-go never saw, is released too; a term client-go saw is released by
// client-go itself (ReleaseOnCancel) once the controllers have stopped.
// The manager's GracefulShutdownTimeout (default 30s) must leave it time
// for one API request. A term that ends before client-go ever saw it (a
// pause right after the grant) stops the manager with an error: the
// elector would otherwise poll a Lock that never leads again.
func (l *Lock) Start(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-l.unseen:
		return fmt.Errorf("lock %s/%s: this replica's term ended before it led; restart it to queue again", l.cfg.Namespace, l.cfg.Name)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if t, observed := l.stop(sctx); t != nil && !observed {
		return t.Release(sctx)
	}
	return nil
}

var _ rl.Interface = (*Lock)(nil)

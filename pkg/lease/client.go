package lease

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Client acquires leases in one namespace.
type Client struct {
	c         client.WithWatch
	namespace string
	log       logr.Logger
}

// Scheme knows FencedLease, Lease and the built-in kinds.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(fkv1.AddToScheme(s))
	return s
}

// NewClient returns a Client for the namespace using cfg.
func NewClient(cfg *rest.Config, namespace string) (*Client, error) {
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	return NewClientFrom(c, namespace), nil
}

// NewClientFrom wraps an existing controller-runtime client (its scheme must
// know fencekeeper.io/v1alpha1).
func NewClientFrom(c client.WithWatch, namespace string) *Client {
	return &Client{c: c, namespace: namespace, log: logr.Discard()}
}

// WithLogger sets the logger for state transitions and renewals.
func (c *Client) WithLogger(l logr.Logger) *Client {
	cp := *c
	cp.log = l
	return &cp
}

// Options tune one acquisition.
type Options struct {
	// RequestID makes Acquire idempotent: the same lock, holder and request ID
	// always name the same claim. Default: a random ID (no retry possible).
	RequestID string
	// TTL is the lease duration (default 15s, 1s..24h, whole seconds).
	TTL time.Duration
	// RenewInterval defaults to TTL/3.
	RenewInterval time.Duration
	// SuspectMargin: SUSPECT when less safe time than this is left; default TTL/3.
	SuspectMargin time.Duration
	// RequestTimeout bounds each API request (default 5s, at most RenewInterval).
	RequestTimeout time.Duration
	// AcquireTimeout bounds the wait on the server too: it sets the claim's
	// spec.acquireTimeoutSeconds (rounded up to whole seconds, so the wait
	// is never cut shorter than asked; 0..24h), and the authority ends the
	// claim if it is still waiting that long after it first observed it,
	// even if this process is gone by then: a waiter that crashed never
	// holds the lock. Acquire then returns ErrAcquireTimeout (and deletes
	// the ended claim). 0 is try-once: granted at the authority's first
	// decision, or ErrAcquireTimeout. nil: the claim waits until granted or
	// deleted (ctx alone bounds the wait).
	//
	// ctx still bounds the wait as well: if it ends first, Acquire gives up
	// and deletes the claim, a grant that came meanwhile included. To have
	// the authority decide, give ctx a later deadline than AcquireTimeout
	// (the time the authority takes to first observe the claim comes on
	// top), or none: with no authority running nothing ends the claim.
	AcquireTimeout *time.Duration
	// MaxHolders is the lock's capacity, the claim's spec.maxHolders: 0 or
	// 1 (the default) is a mutex; 2..100 makes the lock a semaphore whose
	// holders each hold a permit with an epoch of its own (docs/design.md
	// §9). Every claim of a lock must ask for the capacity the lock records
	// while it has holders: a claim asking for another waits (reason
	// CapacityMismatch) until the lock has no holder and it is first in line.
	MaxHolders int32
	// OnTransition is called (synchronously, keep it short) on every state change.
	OnTransition func(Transition)
}

func (o *Options) defaults() error {
	if o.TTL == 0 {
		o.TTL = time.Duration(fkv1.DefaultLeaseDurationSeconds) * time.Second
	}
	if o.TTL < time.Second || o.TTL > 24*time.Hour || o.TTL%time.Second != 0 {
		return fmt.Errorf("TTL %v: want whole seconds in 1s..24h", o.TTL)
	}
	if o.RenewInterval <= 0 {
		o.RenewInterval = o.TTL / 3
	}
	if o.SuspectMargin <= 0 {
		o.SuspectMargin = o.TTL / 3
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if o.RequestTimeout > o.RenewInterval {
		o.RequestTimeout = o.RenewInterval
	}
	if o.AcquireTimeout != nil && (*o.AcquireTimeout < 0 || *o.AcquireTimeout > maxAcquireTimeout) {
		return fmt.Errorf("AcquireTimeout %v: want 0 (try once) to 24h, or nil to wait until ctx ends", *o.AcquireTimeout)
	}
	if o.MaxHolders < 0 || o.MaxHolders > fkv1.MaxMaxHolders {
		return fmt.Errorf("MaxHolders %d: want 1..%d (0 or 1: a mutex, more: a semaphore)", o.MaxHolders, fkv1.MaxMaxHolders)
	}
	if o.RequestID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		o.RequestID = hex.EncodeToString(b)
	}
	return nil
}

// maxAcquireTimeout is the largest Options.AcquireTimeout (the CRD's
// acquireTimeoutSeconds: 0..86400).
const maxAcquireTimeout = 24 * time.Hour

// acquireTimeoutSeconds is spec.acquireTimeoutSeconds for a wait of d:
// whole seconds, rounded up (nil: unbounded).
func acquireTimeoutSeconds(d *time.Duration) *int32 {
	if d == nil {
		return nil
	}
	return ptr.To(int32((*d + time.Second - 1) / time.Second))
}

// maxHoldersSpec is spec.maxHolders for a capacity: unset for a mutex
// (the CRD defaults it to 1), else the capacity.
func maxHoldersSpec(n int32) *int32 {
	if n <= 1 {
		return nil
	}
	return ptr.To(n)
}

// capacity is the capacity a claim asks for, defaulted (1: a mutex).
func (o *Options) capacity() int32 { return max(o.MaxHolders, 1) }

// ClaimName is the FencedLease name for a lock, holder and request ID.
func ClaimName(lock, holder, requestID string) string {
	sum := sha256.Sum256([]byte(holder + "\x00" + requestID))
	return lock + "-" + hex.EncodeToString(sum[:])[:12]
}

// Acquire queues for the lock and waits (until ctx is done) to hold it. If ctx
// ends first the claim is deleted, leaving the queue cleanly. The returned
// Lease is renewed in the background until it is released or lost.
//
// With opts.AcquireTimeout set, the authority bounds the wait as well: a
// claim it ends for its timeout returns ErrAcquireTimeout (and is
// deleted). The authority decides between a grant and a timeout on its own
// ledger, never both, so a grant that came just before the deadline is
// returned as a grant.
//
// The same lock, holder and RequestID name the same claim: a retry finds the
// claim an earlier call created, and takes it as it is (its TTL and its
// acquireTimeoutSeconds are immutable). A claim found with another
// acquireTimeoutSeconds than opts asks for is an error: the two calls meant
// different waits, and neither can be honoured with one claim.
func (c *Client) Acquire(ctx context.Context, lock, holder string, opts Options) (*Lease, error) {
	if err := ValidateLockName(lock); err != nil {
		return nil, err
	}
	if err := ValidateHolder(holder); err != nil {
		return nil, err
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	l := newLease(c, lock, holder, opts)
	l.transition(Acquiring, "acquire requested")

	claim, err := c.createClaim(ctx, l)
	if err != nil {
		if ctx.Err() != nil {
			// Gave up while a create was in flight: it may have committed,
			// and the claim would wait in the queue with nobody behind it.
			c.leaveQueueByName(l, opts.RequestTimeout)
		}
		l.transition(Idle, err.Error())
		return nil, err
	}
	l.ClaimName, l.UID, l.MaxHolders = claim.Name, claim.UID, claim.MaxHolders()

	g, err := c.waitGrant(ctx, l, claim)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, ErrQueueFull) || errors.Is(err, ErrAcquireTimeout) || errors.Is(err, errBadGrant) {
			// Gave up waiting, turned away, timed out, or granted as
			// nothing can trust: the claim would only stay behind (a
			// turned-away or timed-out claim is terminal) or block the
			// lock for a TTL.
			c.leaveQueue(claim, opts.RequestTimeout)
		}
		l.transition(Idle, err.Error())
		return nil, err
	}
	l.Epoch = g.epoch
	l.TTL = claim.LeaseDuration()
	l.watches = g.watches
	// The first renewal starts from the Lease version that showed the
	// grant, when one did (no read needed). A permit renews a Lease of its
	// own: the lock's Lease is then only what it checks its grant on.
	if l.isPermit() {
		l.ledger = g.lease
	} else {
		l.lease = g.lease
	}
	grants.WithLabelValues(g.source).Inc()
	// Anchor the safe time on a renewal we send now: the grant itself may
	// have happened long before we saw it.
	if err := l.start(ctx, g.source); err != nil {
		// Granted but never renewed: give the claim up rather than leave it
		// to block the lock for a TTL and then stay Expired forever.
		l.watches.stop()
		c.leaveQueue(claim, opts.RequestTimeout)
		return nil, err
	}
	return l, nil
}

// TryAcquire is Acquire with Options.AcquireTimeout 0 (whatever opts sets it
// to): it asks for the lock once. It returns the Lease when the authority
// grants the claim at its first decision, also when that grant raced the
// deadline and won (the authority decides one or the other, never both),
// and ErrAcquireTimeout when it does not (the lock is held, or others wait
// first); the ended claim is deleted, so nothing stays in the queue. The
// answer is the authority's: bound ctx (a few seconds) to give up when no
// authority runs; ctx ending first deletes the claim as Acquire does.
func (c *Client) TryAcquire(ctx context.Context, lock, holder string, opts Options) (*Lease, error) {
	opts.AcquireTimeout = ptr.To(time.Duration(0))
	return c.Acquire(ctx, lock, holder, opts)
}

// createClaim creates the claim, or finds it when an earlier attempt (whose
// reply was lost) created it. Transient errors are retried with the same name.
func (c *Client) createClaim(ctx context.Context, l *Lease) (*fkv1.FencedLease, error) {
	want := &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: ClaimName(l.Lock, l.Holder, l.opts.RequestID)},
		Spec: fkv1.FencedLeaseSpec{LockName: l.Lock, HolderIdentity: l.Holder,
			LeaseDurationSeconds:  ptr.To(int32(l.opts.TTL / time.Second)),
			AcquireTimeoutSeconds: acquireTimeoutSeconds(l.opts.AcquireTimeout),
			MaxHolders:            maxHoldersSpec(l.opts.MaxHolders)},
	}
	backoff := 50 * time.Millisecond
	for {
		claim := want.DeepCopy()
		err := c.withTimeout(ctx, l.opts.RequestTimeout, func(ctx context.Context) error { return c.c.Create(ctx, claim) })
		if err == nil {
			if claim.MaxHolders() != l.opts.capacity() {
				// A FencedLease CRD from before semaphores prunes the field:
				// the claim would wait for a mutex.
				c.leaveQueue(claim, l.opts.RequestTimeout)
				return nil, fmt.Errorf("claim %s/%s was stored with maxHolders %d, not %d: the installed FencedLease CRD predates semaphore locks "+
					"(spec.maxHolders); upgrade fencekeeper (the claim was deleted)", c.namespace, claim.Name, claim.MaxHolders(), l.opts.capacity())
			}
			return claim, nil
		}
		if apierrors.IsAlreadyExists(err) {
			err = c.withTimeout(ctx, l.opts.RequestTimeout, func(ctx context.Context) error {
				return c.c.Get(ctx, client.ObjectKeyFromObject(want), claim)
			})
			if err == nil {
				if claim.Spec.LockName != l.Lock || claim.Spec.HolderIdentity != l.Holder {
					return nil, fmt.Errorf("claim %s/%s exists for lock %q holder %q, not lock %q holder %q",
						c.namespace, claim.Name, claim.Spec.LockName, claim.Spec.HolderIdentity, l.Lock, l.Holder)
				}
				if !ptr.Equal(claim.Spec.AcquireTimeoutSeconds, want.Spec.AcquireTimeoutSeconds) {
					return nil, fmt.Errorf("claim %s/%s (request ID %q) exists with acquireTimeoutSeconds %s, not %s: the field is immutable; "+
						"retry with the options of the call that created it, or use another request ID",
						c.namespace, claim.Name, l.opts.RequestID, showSeconds(claim.Spec.AcquireTimeoutSeconds), showSeconds(want.Spec.AcquireTimeoutSeconds))
				}
				if claim.MaxHolders() != l.opts.capacity() {
					return nil, fmt.Errorf("claim %s/%s (request ID %q) exists with maxHolders %d, not %d: the field is immutable; "+
						"retry with the options of the call that created it, or use another request ID",
						c.namespace, claim.Name, l.opts.RequestID, claim.MaxHolders(), l.opts.capacity())
				}
				return claim, nil
			}
		}
		if !retriable(err) {
			return nil, fmt.Errorf("creating claim %s/%s: %w", c.namespace, want.Name, err)
		}
		c.log.V(1).Info("retrying claim creation with the same name", "claim", want.Name, "error", err.Error())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("creating claim %s/%s: %w", c.namespace, want.Name, errors.Join(ctx.Err(), err))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// showSeconds shows an optional acquireTimeoutSeconds.
func showSeconds(s *int32) string {
	if s == nil {
		return "unset (wait until granted)"
	}
	return strconv.Itoa(int(*s))
}

// Where a grant was seen first (the grants metric's source label).
const (
	sourceLease = "lease"
	sourceClaim = "claim"
)

// errBadGrant: the claim shows a grant nothing can use; the holder gives
// the claim up.
var errBadGrant = fmt.Errorf("no usable grant: %w", ErrLost)

// grant is a claim's grant as the holder learned it: the pair (claim UID,
// epoch), and where it was seen first.
type grant struct {
	epoch  int64
	source string
	// lease is the Lease version that showed the grant (nil when it was
	// seen on the claim first): the first renewal starts from it.
	lease *coordinationv1.Lease
	// watches are the follows the wait had open, which the held lease goes
	// on with (set by waitGrant on a grant).
	watches heldWatches
}

// heldWatches are the follows a granted holder goes on with: its claim's,
// and the lock's Lease's when the grant was seen there (every later event
// of it is newer than the grant). A nil follow is started afresh. Each
// runs on a context of its own under the lease's, ended by its stop.
type heldWatches struct {
	claims     <-chan seen[*fkv1.FencedLease]
	stopClaims context.CancelFunc
	leases     <-chan seen[*coordinationv1.Lease]
	stopLeases context.CancelFunc
}

// stop ends the follows still open.
func (w heldWatches) stop() {
	for _, f := range []context.CancelFunc{w.stopClaims, w.stopLeases} {
		if f != nil {
			f()
		}
	}
}

// waitGrant waits until the claim is granted, Expired, deleted, or ctx
// ends. The grant is whichever comes first of the two records of it: the
// lock's Lease naming the claim's UID with an epoch (the authority's
// ledger, and what admission checks; the authority writes it before the
// claim's status) or the claim's status turning Held. Both must agree: a
// grant seen on the claim is checked against the Lease by the first
// renewal, and one seen on the Lease against the claim's status by the
// holder's claim watch; where they differ the lease is LOST.
//
// It watches its claim (a field selector on its name, never all claims)
// throughout, and the lock's Lease (by name) only while the claim may be
// next: from the start (a claim on a free or new lock is granted at once;
// the Lease may not exist yet), until the claim's status shows it waiting
// behind others (Queued, or a lock nobody can be granted now), and again
// once the authority marks it the head waiter (Next). So however many
// wait, a lock's Lease has O(1) watchers: its holder and its head waiter.
// Without the mark (an authority that does not set it) waiters behind the
// first learn of their grant from their claim's status.
//
// The follows run on the lease's context, not the caller's: on a grant
// they are handed over (grant.watches) and the held lease's loss watches go
// on with them, so taking the grant costs no read of the claim and no new
// watch. The Lease's follow is handed over only when it showed the grant:
// after a grant seen on the claim it may still lag behind, with versions
// naming the previous holder to come.
func (c *Client) waitGrant(ctx context.Context, l *Lease, claim *fkv1.FencedLease) (g grant, err error) {
	key := client.ObjectKeyFromObject(claim)
	cctx, stopClaims := context.WithCancel(l.ctx)
	claims := follow(cctx, c.c, key, claimKind, reading(true), claim.ResourceVersion)

	var (
		leases     <-chan seen[*coordinationv1.Lease]
		stopLeases = func() {}
		leaseOff   bool // the Lease cannot be watched (Forbidden, say)
		// leaseRead: the Lease's follow reads first when it starts over,
		// switched on once it is a holder's (a waiter's Lease may not
		// exist yet; a holder's must be reported gone).
		leaseRead = reading(false)
	)
	defer func() {
		switch {
		case err != nil:
			stopClaims()
			stopLeases()
		case g.source == sourceLease:
			leaseRead.Store(true)
			g.watches = heldWatches{claims: claims, stopClaims: stopClaims, leases: leases, stopLeases: stopLeases}
		default:
			stopLeases()
			g.watches = heldWatches{claims: claims, stopClaims: stopClaims}
		}
	}()
	watchLease := func(on bool) {
		switch {
		case on && leases == nil && !leaseOff:
			lctx, cancel := context.WithCancel(l.ctx)
			leases, stopLeases = follow(lctx, c.c, client.ObjectKey{Namespace: c.namespace, Name: l.Lock}, leaseKind, leaseRead, ""), cancel
		case !on && leases != nil:
			stopLeases()
			leases, stopLeases = nil, func() {}
		}
	}
	toldMismatch := false // CapacityMismatch logged once
	// onClaim takes in a version of the claim: done when it shows the
	// grant or the end of the wait.
	onClaim := func(cur *fkv1.FencedLease) (grant, bool, error) {
		if cur.Status.Phase == fkv1.PhaseHeld {
			g := grant{epoch: cur.Status.Epoch, source: sourceClaim}
			if g.epoch <= 0 {
				return grant{}, true, fmt.Errorf("claim %s shows Held with no epoch: %w", key, errBadGrant)
			}
			return g, true, nil
		}
		if done, err := phaseDone(cur); done {
			return grant{}, true, err
		}
		if h := meta.FindStatusCondition(cur.Status.Conditions, fkv1.ConditionHeld); h != nil && h.Reason == fkv1.ReasonCapacityMismatch && !toldMismatch {
			toldMismatch = true
			c.log.Info("waiting: the lock records another capacity than the claim asks for", "lock", l.Lock, "claim", key.Name,
				"maxHolders", cur.MaxHolders(), "message", h.Message)
		}
		watchLease(mayBeNext(cur))
		return grant{}, false, nil
	}
	// The claim as created (or found) is its first version: the claim's
	// watch starts after it.
	if g, done, err := onClaim(claim); done {
		return g, err
	}
	for {
		select {
		case <-ctx.Done():
			return grant{}, ctx.Err()

		case s, open := <-claims:
			switch {
			case !open:
				return grant{}, errors.Join(ctx.Err(), fmt.Errorf("waiting for claim %s: the watch ended", key))
			case s.err != nil:
				return grant{}, fmt.Errorf("waiting for claim %s: %w", key, s.err)
			case s.gone && (s.obj == nil || s.obj.UID == claim.UID):
				return grant{}, fmt.Errorf("claim %s was deleted while waiting: %w", key, ErrLost)
			case s.obj.UID != claim.UID:
				return grant{}, fmt.Errorf("claim %s was replaced while waiting: %w", key, ErrLost)
			}
			if g, done, err := onClaim(s.obj); done {
				return g, err
			}

		case s, open := <-leases:
			switch {
			case !open:
				leases, leaseOff = nil, true
				continue
			case s.err != nil:
				c.log.Info("cannot watch the lock's Lease: learning of the grant from the claim's status only", "lock", l.Lock, "claim", key.Name, "error", s.err.Error())
				continue // the follow ends: the channel closes next
			case s.gone:
				continue
			}
			if g, ok := leaseGrant(s.obj, l.Lock, claim.UID, l.isPermit()); ok {
				return g, nil
			}
			if leaseTimedOut(s.obj, l.Lock, claim.UID) {
				return grant{}, fmt.Errorf("claim %s: %w (the lock's Lease lists it as timed out)", key, ErrAcquireTimeout)
			}
		}
	}
}

// leaseGrant reports whether lease (the lock's Lease) grants the claim
// uid: fencekeeper manages it and it names the claim with an epoch. A
// Lease naming the claim with no epoch (yet) is no grant: the authority
// shows such a claim Held only once it has rewritten the Lease with one.
// For a claim of a semaphore (permit), the grant is the Lease's permit
// entry naming the claim's UID, with the entry's epoch; the Lease's holder
// annotations play no part.
func leaseGrant(lease *coordinationv1.Lease, lock string, uid types.UID, permit bool) (grant, bool) {
	if !fkv1.IsManagedLease(lease) {
		return grant{}, false
	}
	led := fkv1.ReadLedger(lease, lock)
	if permit {
		p, ok := led.PermitFor(uid)
		if !ok || led.PermitsInvalid || p.Epoch <= 0 {
			return grant{}, false
		}
		return grant{epoch: p.Epoch, source: sourceLease, lease: lease}, true
	}
	if led.HolderUID != uid || !led.EpochValid || led.Epoch <= 0 {
		return grant{}, false
	}
	return grant{epoch: led.Epoch, source: sourceLease, lease: lease}, true
}

// leaseTimedOut reports whether lease (the lock's Lease) records that the
// authority ended the claim uid for its acquireTimeoutSeconds. That guarded
// write is the timeout, as the Lease naming a claim is the grant: a listed
// claim is never granted, and a claim the Lease named is never listed.
func leaseTimedOut(lease *coordinationv1.Lease, lock string, uid types.UID) bool {
	return fkv1.IsManagedLease(lease) && fkv1.ReadLedger(lease, lock).TimedOutClaim(uid)
}

// mayBeNext reports whether a waiting claim may be the next granted, so
// that its holder watches the lock's Lease: before the authority has said
// where it waits, and when it marks it the head waiter (Next). A claim
// shown waiting for another reason (Queued behind others, a lock blocked or
// never grantable) watches only itself until that changes.
func mayBeNext(c *fkv1.FencedLease) bool {
	if c.Status.Phase == "" {
		return true
	}
	h := meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld)
	return h == nil || h.Reason == fkv1.ReasonNext || h.Reason == ""
}

func phaseDone(c *fkv1.FencedLease) (bool, error) {
	switch c.Status.Phase {
	case fkv1.PhaseHeld:
		return true, nil
	case fkv1.PhaseExpired:
		h := meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld)
		switch {
		case h != nil && h.Reason == fkv1.ReasonQueueFull:
			return true, fmt.Errorf("claim %s/%s: %w: %s", c.Namespace, c.Name, ErrQueueFull, h.Message)
		case h != nil && h.Reason == fkv1.ReasonAcquireTimeout:
			return true, fmt.Errorf("claim %s/%s: %w: %s", c.Namespace, c.Name, ErrAcquireTimeout, h.Message)
		}
		return true, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, ErrExpired)
	}
	return false, nil
}

// leaveQueue deletes a claim we gave up waiting for, by UID.
func (c *Client) leaveQueue(claim *fkv1.FencedLease, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := c.c.Delete(ctx, claim, client.Preconditions{UID: &claim.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Info("could not leave the queue; the claim stays until deleted", "claim", claim.Name, "error", err.Error())
	}
}

// leaveQueueByName deletes the claim an abandoned create of l may have
// made: found by its deterministic name, and only if it is l's (same lock
// and holder), with its UID as the precondition.
func (c *Client) leaveQueueByName(l *Lease, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var claim fkv1.FencedLease
	key := client.ObjectKey{Namespace: c.namespace, Name: ClaimName(l.Lock, l.Holder, l.opts.RequestID)}
	if err := c.c.Get(ctx, key, &claim); err != nil {
		if !apierrors.IsNotFound(err) {
			c.log.Info("could not check for a claim left by an abandoned create; it stays until deleted", "claim", key.Name, "error", err.Error())
		}
		return
	}
	if claim.Spec.LockName == l.Lock && claim.Spec.HolderIdentity == l.Holder {
		c.leaveQueue(&claim, timeout)
	}
}

func (c *Client) withTimeout(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}

// retriable: the request may not have reached the server, or its reply was
// lost; the same request is safe to repeat.
func retriable(err error) bool {
	if err == nil {
		return false
	}
	if apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var st apierrors.APIStatus
	return !errors.As(err, &st) // transport errors carry no API status
}

// ValidateLockName checks a lock name the way the FencedLease API does: a
// DNS-1123 subdomain of at most 63 characters (it names the Lease).
func ValidateLockName(lock string) error {
	if errs := validation.IsDNS1123Subdomain(lock); len(errs) > 0 || len(lock) > 63 {
		return fmt.Errorf("invalid lock name %q: a DNS-1123 subdomain of at most 63 characters (lowercase letters, digits, '-' and '.')", lock)
	}
	return nil
}

// ValidateHolder checks a holder identity: 1..253 characters.
func ValidateHolder(holder string) error {
	if holder == "" || len(holder) > 253 {
		return fmt.Errorf("invalid holder %q: 1..253 characters", holder)
	}
	return nil
}

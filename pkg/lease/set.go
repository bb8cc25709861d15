package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/utils/ptr"
)

// Several locks at once (docs/design.md §9, the seed's §19). Two holders
// that each hold one lock and wait for the other's deadlock, whatever the
// locks guarantee one at a time; a fixed TTL does not help, both renew.
// The cure is the classic one: every caller takes its locks in one global
// order, so whoever holds the first lock of the order that two sets share
// can always go on to the next. The order is the lock names sorted
// bytewise (AcquisitionOrder): no caller can deviate from it, because
// AcquireAll sorts whatever it is given.

// AcquisitionOrder is the order AcquireAll takes locks in, the one every
// caller shares: the names sorted bytewise (lock names are lowercase
// DNS-1123 subdomains, so that is also their alphabetical order). It
// refuses an empty list, an invalid name and a name given twice (a set
// holds each lock once: a second claim of a lock it holds would wait for
// itself forever), naming the bad one. locks is not modified.
func AcquisitionOrder(locks []string) ([]string, error) {
	if len(locks) == 0 {
		return nil, errors.New("no lock given: want at least one lock name")
	}
	for i, lock := range locks {
		if lock == "" {
			return nil, fmt.Errorf("lock %d of %d is an empty name (in %q)", i+1, len(locks), locks)
		}
		if err := ValidateLockName(lock); err != nil {
			return nil, err
		}
	}
	order := slices.Clone(locks)
	slices.Sort(order)
	for i := 1; i < len(order); i++ {
		if order[i] == order[i-1] {
			return nil, fmt.Errorf("lock %q is given twice (in %q): a set takes each lock once", order[i], locks)
		}
	}
	return order, nil
}

// LockError is the error of AcquireAll, and the cause of a Set's context
// when one of its leases ended: which lock it was, and what happened to it.
// When AcquireAll returns it, the locks before Lock in the order were
// released again; ReleaseErr is what went wrong doing so, if anything.
type LockError struct {
	Namespace, Lock string
	Err             error
	// ReleaseErr: releasing the locks taken before failed (nil: they
	// were released). ErrReleaseUncertain: a lost reply, the claim is
	// gone or will expire.
	ReleaseErr error
}

func (e *LockError) Error() string {
	msg := fmt.Sprintf("lock %s/%s: %v", e.Namespace, e.Lock, e.Err)
	if e.ReleaseErr != nil {
		msg += fmt.Sprintf(" (and releasing the locks taken before: %v)", e.ReleaseErr)
	}
	return msg
}

// Unwrap: errors.Is and errors.As see Err, and ReleaseErr when set.
func (e *LockError) Unwrap() []error {
	if e.ReleaseErr == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.ReleaseErr}
}

// errSetReleased is the cause of a released Set's context.
var errSetReleased = errors.New("fencekeeper: the set of leases was released")

// Set is several locks held together, taken by AcquireAll: one Lease per
// lock, each renewed and watched on its own as Acquire's are. The set's
// context is cancelled, and Done closed, as soon as any of its leases is
// lost (or released): work that needs all the locks must stop when one is
// gone, since the objects of that lock refuse its epoch from then on.
type Set struct {
	namespace, holder string
	leases            []*Lease // in AcquisitionOrder

	ctx    context.Context
	cancel context.CancelCauseFunc
	stops  []func() bool // the context.AfterFunc registrations
}

// AcquireAll takes every lock of locks for holder, one at a time in
// AcquisitionOrder (sorted by name, whatever order locks is in), so two
// callers whose sets share locks cannot deadlock: each waits only for
// locks that come later in the order than all it holds. Each lock is
// taken by Acquire with opts (one claim per lock, the same RequestID: the
// claim names differ by lock); opts.OnTransition is called for every
// lock's changes, Transition.Lock says which.
//
// opts.AcquireTimeout bounds the wait for the whole set, not each lock:
// each claim gets what is left of it when it is created (rounded up to
// whole seconds, at least a try-once 0), so the authority ends the last
// claim at about the set's deadline; TryAcquireAll asks for each lock
// once. ctx bounds the wait as it does for Acquire.
//
// If a lock is not granted (ctx ends, the authority times its claim out,
// turns it away), or a lock already taken is lost while a later one is
// awaited, AcquireAll releases the locks it took, in reverse order, and
// returns a *LockError naming that lock and wrapping the cause (ErrLost,
// ErrAcquireTimeout, ctx.Err(), ...) and any release error.
func (c *Client) AcquireAll(ctx context.Context, locks []string, holder string, opts Options) (*Set, error) {
	order, err := AcquisitionOrder(locks)
	if err != nil {
		return nil, err
	}
	if err := ValidateHolder(holder); err != nil {
		return nil, err
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	var deadline time.Time
	if opts.AcquireTimeout != nil {
		deadline = time.Now().Add(*opts.AcquireTimeout)
	}
	s := &Set{namespace: c.namespace, holder: holder}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	// The wait for the next lock ends as soon as one taken ends: a set
	// with a lost lock is no use, and its claims should not wait on.
	actx, acancel := context.WithCancelCause(ctx)
	defer acancel(nil)
	stopWait := context.AfterFunc(s.ctx, func() { acancel(context.Cause(s.ctx)) })
	defer stopWait()

	for i, lock := range order {
		o := opts
		if opts.AcquireTimeout != nil && i > 0 {
			// What is left of the set's deadline (the first lock gets it
			// all, as Acquire would).
			o.AcquireTimeout = ptr.To(max(time.Until(deadline), 0))
		}
		l, err := c.Acquire(actx, lock, holder, o)
		if err != nil {
			why := &LockError{Namespace: c.namespace, Lock: lock, Err: err}
			if s.ctx.Err() != nil {
				// A lock taken before was lost: that is the news, not
				// the wait it cut short.
				why = s.cause()
			}
			return nil, s.giveUp(why, opts.RequestTimeout)
		}
		s.add(l)
	}
	if s.ctx.Err() != nil {
		// Lost between its grant and now.
		return nil, s.giveUp(s.cause(), opts.RequestTimeout)
	}
	return s, nil
}

// cause is why the set's context ended (a lease of it did).
func (s *Set) cause() *LockError {
	var le *LockError
	if errors.As(context.Cause(s.ctx), &le) {
		return le
	}
	return &LockError{Namespace: s.namespace, Err: context.Cause(s.ctx)}
}

// TryAcquireAll is AcquireAll with Options.AcquireTimeout 0: each lock is
// asked for once, in order; the first not granted at the authority's first
// decision returns ErrAcquireTimeout (in a *LockError), the ones before it
// released.
func (c *Client) TryAcquireAll(ctx context.Context, locks []string, holder string, opts Options) (*Set, error) {
	opts.AcquireTimeout = ptr.To(time.Duration(0))
	return c.AcquireAll(ctx, locks, holder, opts)
}

// add makes l one of the set's leases: its end ends the set.
func (s *Set) add(l *Lease) {
	s.leases = append(s.leases, l)
	s.stops = append(s.stops, context.AfterFunc(l.Context(), func() { s.cancel(ended(l)) }))
}

// ended is the cause of the set's end when l's context was cancelled.
func ended(l *Lease) error {
	if l.State() == Lost {
		return &LockError{Namespace: l.Namespace, Lock: l.Lock, Err: fmt.Errorf("lease of epoch %d lost: %w", l.Epoch, ErrLost)}
	}
	return &LockError{Namespace: l.Namespace, Lock: l.Lock, Err: fmt.Errorf("lease of epoch %d released", l.Epoch)}
}

// giveUp releases what AcquireAll took, in reverse order, and returns why
// it gave up (a copy: a context's cause is shared) with any release error.
func (s *Set) giveUp(why *LockError, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := *why
	out.ReleaseErr = s.Release(ctx)
	return &out
}

// Context is cancelled when any lease of the set is lost, or the set is
// released: derive the work's context from it. context.Cause of it is a
// *LockError naming the lock that ended first (wrapping ErrLost when it
// was lost).
func (s *Set) Context() context.Context { return s.ctx }

// Done is closed when any lease of the set is lost, or the set is released.
func (s *Set) Done() <-chan struct{} { return s.ctx.Done() }

// Holder is the holder identity every lease of the set was taken for.
func (s *Set) Holder() string { return s.holder }

// Namespace is the namespace of the set's locks.
func (s *Set) Namespace() string { return s.namespace }

// Locks are the set's lock names, in AcquisitionOrder.
func (s *Set) Locks() []string {
	out := make([]string, len(s.leases))
	for i, l := range s.leases {
		out[i] = l.Lock
	}
	return out
}

// Leases are the set's leases, in AcquisitionOrder. Stamp writes to an
// object fenced by a lock with that lock's lease (Lease(lock).Update, say):
// each lock has its own epoch.
func (s *Set) Leases() []*Lease { return slices.Clone(s.leases) }

// Lease is the lease of lock, or nil when the set does not hold it.
func (s *Set) Lease(lock string) *Lease {
	for _, l := range s.leases {
		if l.Lock == lock {
			return l
		}
	}
	return nil
}

// Epochs are the fencing tokens of the set's locks, by lock name.
func (s *Set) Epochs() map[string]int64 {
	out := make(map[string]int64, len(s.leases))
	for _, l := range s.leases {
		out[l.Lock] = l.Epoch
	}
	return out
}

// State is the set's state, the worst of its leases': LOST if any is lost,
// then RELEASED, RELEASING, SUSPECT, and HELD only when every lease is.
func (s *Set) State() State {
	worst := Held
	for _, l := range s.leases {
		if st := l.State(); setRank(st) > setRank(worst) {
			worst = st
		}
	}
	return worst
}

// setRank orders states for Set.State: how much of the set they leave usable.
func setRank(st State) int {
	switch st {
	case Held:
		return 0
	case Suspect:
		return 1
	case Releasing:
		return 2
	case Released:
		return 3
	case Lost:
		return 4
	}
	return 5 // Idle, Acquiring: never a member's state; worst if they were
}

// Remaining is the least safe time left of the set's leases (see
// Lease.Remaining).
func (s *Set) Remaining() time.Duration {
	var least time.Duration
	for i, l := range s.leases {
		if r := l.Remaining(); i == 0 || r < least {
			least = r
		}
	}
	return least
}

// Release gives every lock of the set up, in the reverse of the order they
// were taken in, after cancelling the set's context. Each is released as
// Lease.Release does (by claim UID), a lost one included; the errors are
// joined (ErrReleaseUncertain for a lost reply: that claim is gone or will
// expire). Repeating Release is harmless.
func (s *Set) Release(ctx context.Context) error {
	s.cancel(errSetReleased)
	for _, stop := range s.stops {
		stop()
	}
	var errs []error
	for i := len(s.leases) - 1; i >= 0; i-- {
		if err := s.leases[i].Release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// String is "ns/a (epoch 4), ns/b (epoch 9)", for logs.
func (s *Set) String() string {
	parts := make([]string, len(s.leases))
	for i, l := range s.leases {
		parts[i] = fmt.Sprintf("%s/%s (epoch %d)", l.Namespace, l.Lock, l.Epoch)
	}
	return strings.Join(parts, ", ")
}

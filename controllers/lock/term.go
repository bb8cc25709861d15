package lock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// View is what this process, as the lock authority, last decided about a
// lock. The fencing webhook uses it to show its Lease cache fresh: a cache
// that names the same holder, before that holder's lease lapses on this
// process's own clock, is as fresh as the authority. Anything else (another
// replica that does not reconcile, a holder past its deadline, a cache behind
// a grant this process made) makes the webhook read the Lease live.
type View struct {
	// HeldEpoch is the holder's epoch (0: free).
	HeldEpoch int64
	// Permits are the epochs of a semaphore lock's live permits, ascending
	// (nil for a mutex).
	Permits []int64
	// Floor is the highest epoch this process issued or saw for the lock.
	Floor int64
	// deadline is when the holder's lease lapses on this process's clock,
	// unless a renewal is observed first.
	deadline time.Time
}

// Leadership tells whether this process's leader-election term is
// certainly still its own (manager.LeadershipLock).
type Leadership interface{ Current() bool }

// term is this process's term as the only lock authority. It begins when
// CatchUp has read the managed Leases live (a new leader's cache may trail
// the previous leader's writes) and ends with EndTerm (it stopped leading,
// or is stopping), and, with leader election, holds only while leadership
// is certain (a leader paused past its lease resumes deciding on caches
// from before the pause, while its successor already acts). Outside it no
// Lease is written and nothing is vouched for.
type term struct {
	caughtUp   atomic.Bool
	leadership Leadership
}

// leading reports whether leadership, if any, is certainly this process's.
func (t *term) leading() bool { return t.leadership == nil || t.leadership.Current() }

// CatchUp is called when this process starts acting as the authority (a
// new leader's term): its cache has been running, but may trail the
// writes of the leader before it. It reads the managed Leases live and
// expects the cache to show at least those versions before any lock is
// decided on, or vouched for, again.
func (r *Reconciler) CatchUp(ctx context.Context) error {
	var live coordinationv1.LeaseList
	if err := r.apiReader.List(ctx, &live, client.MatchingLabels{fkv1.LabelManagedBy: fkv1.ManagedByValue}); err != nil {
		return fmt.Errorf("reading the managed Leases at the start of this authority's term: %w", err)
	}
	for i := range live.Items {
		l := &live.Items[i]
		if _, ok := fkv1.IsPermitLease(l); ok {
			continue // no lock's ledger
		}
		r.memory.expectLease(types.NamespacedName{Namespace: l.Namespace, Name: l.Name}, leaseVersion{uid: l.UID, rv: l.ResourceVersion})
	}
	// Only reconciles that start from here on, and so see these
	// expectations, may vouch.
	r.term.caughtUp.Store(true)
	return nil
}

// CaughtUp reports whether this term's CatchUp has run: from then on the
// authority may vouch for holders it decides on.
func (r *Reconciler) CaughtUp() bool { return r.term.caughtUp.Load() }

// EndTerm is called when this process stops acting as the authority (it
// stopped leading, or is stopping): nothing it decided is vouched for from
// then on, while the next leader grants.
func (r *Reconciler) EndTerm() { r.term.caughtUp.Store(false) }

// FreshView is what the webhook asks (webhook.Authority): the holder's
// epoch and the highest epoch this process issued or saw for lock, and
// whether the authority vouches for them now: its term has begun and not
// ended, its leadership (if any) is certain, the lock is held, and its
// holder's lease has not lapsed on this process's clock.
func (r *Reconciler) FreshView(lock types.NamespacedName) (heldEpoch, floor int64, fresh bool) {
	v, ok := r.freshView(lock)
	return v.HeldEpoch, v.Floor, ok
}

// FreshPermits is FreshView for a semaphore lock: the epochs of its live
// permits, ascending, the floor, and whether the authority vouches for
// them now (as FreshView; the deadline is the earliest permit's).
func (r *Reconciler) FreshPermits(lock types.NamespacedName) (permits []int64, floor int64, fresh bool) {
	v, ok := r.freshView(lock)
	return v.Permits, v.Floor, ok && len(v.Permits) > 0
}

func (r *Reconciler) freshView(lock types.NamespacedName) (View, bool) {
	if !r.term.caughtUp.Load() || !r.term.leading() {
		return View{}, false
	}
	view, ok := r.memory.view(lock)
	if !ok || !r.clock.Now().Before(view.deadline) {
		return View{}, false
	}
	return view, true
}

package lock

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
	// Floor is the highest epoch this process issued or saw for the lock.
	Floor int64
	// deadline is when the holder's lease lapses on this process's clock,
	// unless a renewal is observed first.
	deadline time.Time
}

type views struct {
	mu sync.Mutex
	m  map[types.NamespacedName]View
}

func newViews() *views { return &views{m: map[types.NamespacedName]View{}} }

func (v *views) set(lock types.NamespacedName, view View) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if view.HeldEpoch == 0 {
		// Nothing held: no deadline to keep, and no memory for idle locks.
		delete(v.m, lock)
		return
	}
	v.m[lock] = view
}

// FreshView returns the authority's view of lock when it can vouch for it
// now: this process's term as the only authority has begun (CatchUp) and
// not ended (EndTerm), the lock is held, and its holder's lease has not
// lapsed on this process's clock.
func (r *Reconciler) FreshView(lock types.NamespacedName) (View, bool) {
	if !r.caughtUp.Load() {
		return View{}, false
	}
	r.views.mu.Lock()
	view, ok := r.views.m[lock]
	r.views.mu.Unlock()
	if !ok || !r.clock.now().Before(view.deadline) {
		return View{}, false
	}
	return view, true
}

package lock

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// renewal is the signal that a holder is alive: a change of the Lease's
// holder or renewTime, or of the holder pod's liveness (see renews).
type renewal struct {
	holderUID types.UID
	renewTime string
	pod       pods.Liveness
	// podNotReadySince is pods.NotReadySince of the holder pod.
	podNotReadySince string
}

// renews reports whether s, seen after prev, is a renewal. A pod whose
// containers stopped being ready at another time than the last look saw
// was ready in between: that is one, but only between two looks that both
// saw a time (containers not ready on a node not known to be not Ready); a
// time appearing or going away is no evidence the pod was live.
func (s renewal) renews(prev renewal) bool {
	if s.holderUID != prev.holderUID || s.renewTime != prev.renewTime || s.pod != prev.pod {
		return true
	}
	return s.podNotReadySince != "" && prev.podNotReadySince != "" && s.podNotReadySince != prev.podNotReadySince
}

// renewClock remembers, per lock, when this controller first observed the
// current renewal signal, on its own monotonic clock. A lease expires
// leaseDuration after that observation. Nothing here survives a restart,
// which is the point: after a restart every lease gets a fresh full TTL (late
// takeover, never early).
type renewClock struct {
	clock clock.PassiveClock

	mu   sync.Mutex
	seen map[types.NamespacedName]observed
}

type observed struct {
	signal renewal
	at     time.Time
	// firstSight is true when at is merely when this process first looked
	// (after a start, or a pause it cannot tell from one), not when it saw
	// the signal change: fine for expiry (late, never early), but no proof
	// the holder is alive now.
	firstSight bool
}

func newRenewClock(c clock.PassiveClock) *renewClock {
	return &renewClock{clock: c, seen: map[types.NamespacedName]observed{}}
}

// observe records the lock's current renewal signal and returns when this
// controller first saw it, and whether that was a change it watched happen
// (rather than its first look at the lock).
func (c *renewClock) observe(lock types.NamespacedName, signal renewal) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.seen[lock]
	switch {
	case !ok || signal.renews(o.signal):
		o = observed{signal: signal, at: c.clock.Now(), firstSight: !ok}
	default:
		// The next look compares with what this one saw.
		o.signal = signal
	}
	c.seen[lock] = o
	return o.at, !o.firstSight
}

// granted records the signal of a holder this process has just granted
// (its Lease write succeeded) as a change it watched happen: the grant is
// the holder's first renewal, on this process's clock. Without it, a lock
// new to this process would count as a first look, and its holder be
// vouched for only from its first renewal on (for a pod holder, its next
// readiness change).
func (c *renewClock) granted(lock types.NamespacedName, signal renewal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[lock] = observed{signal: signal, at: c.clock.Now()}
}

func (c *renewClock) now() time.Time { return c.clock.Now() }

// forget drops what was observed of lock (it is idle).
func (c *renewClock) forget(lock types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.seen, lock)
}

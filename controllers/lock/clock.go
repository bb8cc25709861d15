package lock

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
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

// observed is when this controller first observed a lock's current
// renewal signal, on its own monotonic clock. A lease expires leaseDuration
// after that observation. Nothing here survives a restart, which is the
// point: after a restart every lease gets a fresh full TTL (late takeover,
// never early).
type observed struct {
	signal renewal
	at     time.Time
	// firstSight is true when at is merely when this process first looked
	// (after a start, or a pause it cannot tell from one), not when it saw
	// the signal change: fine for expiry (late, never early), but no proof
	// the holder is alive now.
	firstSight bool
}

// observe records the lock's current renewal signal, seen at now, and
// returns when this controller first saw it, and whether that was a change
// it watched happen (rather than its first look at the lock).
func (m *lockMemory) observe(signal renewal, now time.Time) (time.Time, bool) {
	o := m.renewal
	switch {
	case !m.renewalSeen || signal.renews(o.signal):
		o = observed{signal: signal, at: now, firstSight: !m.renewalSeen}
	default:
		// The next look compares with what this one saw.
		o.signal = signal
	}
	m.renewal, m.renewalSeen = o, true
	return o.at, !o.firstSight
}

// granted records the signal of a holder this process has just granted
// (its Lease write succeeded) at now, as a change it watched happen: the
// grant is the holder's first renewal, on this process's clock. Without it,
// a lock new to this process would count as a first look, and its holder be
// vouched for only from its first renewal on (for a pod holder, its next
// readiness change).
func (m *lockMemory) granted(signal renewal, now time.Time) {
	m.renewal, m.renewalSeen = observed{signal: signal, at: now}, true
}

// observePermit is observe for one permit of a semaphore lock (by epoch).
// A signal that is not known (its renewal Lease is missing) renews
// nothing: the permit keeps what was last observed, and expires one TTL
// after it.
func (m *lockMemory) observePermit(epoch int64, signal renewal, known bool, now time.Time) (time.Time, bool) {
	o, seen := m.permitRenewals[epoch]
	switch {
	case seen && !known:
		return o.at, !o.firstSight
	case !seen || signal.renews(o.signal):
		o = observed{signal: signal, at: now, firstSight: !seen}
	default:
		o.signal = signal
	}
	if m.permitRenewals == nil {
		m.permitRenewals = map[int64]observed{}
	}
	m.permitRenewals[epoch] = o
	return o.at, !o.firstSight
}

// grantedPermit is granted for one permit this process has just granted.
func (m *lockMemory) grantedPermit(epoch int64, signal renewal, now time.Time) {
	if m.permitRenewals == nil {
		m.permitRenewals = map[int64]observed{}
	}
	m.permitRenewals[epoch] = observed{signal: signal, at: now}
}

// retainPermits forgets the renewals of permits that are no longer live.
func (m *lockMemory) retainPermits(live []fkv1.Permit) {
	for epoch := range m.permitRenewals {
		if !slices.ContainsFunc(live, func(p fkv1.Permit) bool { return p.Epoch == epoch }) {
			delete(m.permitRenewals, epoch)
		}
	}
}

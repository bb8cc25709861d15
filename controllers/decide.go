package controllers

import (
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// lockSnapshot is everything a decision about one lock needs. It is built
// from the informer cache (plus a live read of the holder claim when the
// cache does not have it) and holds no clients, so decide is a pure function.
type lockSnapshot struct {
	ledger ledger
	// claims of this lock that exist and are not being deleted.
	claims []*fkv1.FencedLease
	// renewSeenAt is when this controller last observed the holder or its
	// renewTime change; zero when the Lease names no holder.
	renewSeenAt time.Time
	now         time.Time
	// floor is the highest epoch known from any source other than the Lease:
	// claim statuses and this process's memory.
	floor int64
	// leaseDurationOnLease is spec.leaseDurationSeconds of the Lease (0 if unset).
	leaseDurationOnLease int32
}

// holderEnd says why the current holder stops holding.
type holderEnd string

const (
	holderContinues holderEnd = ""
	holderReleased  holderEnd = fkv1.ReasonReleased   // claim deleted
	holderExpired   holderEnd = fkv1.ReasonExpired    // no renewal observed for a TTL
	holderGaveUp    holderEnd = fkv1.ReasonSuperseded // claim is already Expired (terminal)
)

// lockDecision is the single Lease change (if any) a reconcile makes. The
// claim statuses follow from the Lease afterwards (see desiredStatus).
type lockDecision struct {
	// writeLease is true when the Lease must be written.
	writeLease bool
	// newHolder is the claim to grant, or nil to leave the lock free (or keep
	// the current holder when end is holderContinues).
	newHolder *fkv1.FencedLease
	// epoch is the epoch annotation to write: floor+1 for a grant, otherwise
	// the repaired last issued epoch.
	epoch int64
	// end tells what happened to the previous holder.
	end           holderEnd
	endedUID      types.UID
	endedName     string
	leaseDuration int32
	// requeueAfter is when the current holder expires if not renewed.
	requeueAfter time.Duration
}

// decide computes what one reconcile of a lock does. It never issues an epoch
// at or below anything already issued: the next epoch is one above the
// highest of the Lease's counter, every claim's recorded epoch and this
// process's memory.
func decide(s lockSnapshot) lockDecision {
	issued := s.ledger.epoch
	if s.floor > issued {
		issued = s.floor
	}
	d := lockDecision{epoch: issued}
	// The ledger needs repair when its counter is below what was issued,
	// unreadable, or its labels or finalizer are missing (adoption).
	repair := issued != s.ledger.epoch || !s.ledger.epochValid || !s.ledger.managedFully

	holder := findClaim(s.claims, s.ledger.holderUID)
	if s.ledger.holderUID != "" {
		switch {
		case holder == nil:
			d.end = holderReleased
		case holder.Status.Phase == fkv1.PhaseExpired:
			d.end = holderGaveUp
		default:
			ttl := holder.LeaseDuration()
			left := s.renewSeenAt.Add(ttl).Sub(s.now)
			if left <= 0 {
				d.end = holderExpired
			} else {
				d.requeueAfter = left
				d.leaseDuration = holder.LeaseDurationSeconds()
				if s.leaseDurationOnLease != d.leaseDuration {
					repair = true
				}
			}
		}
		if d.end != holderContinues {
			d.endedUID, d.endedName = s.ledger.holderUID, s.ledger.holderName
		}
	}

	if s.ledger.holderUID == "" || d.end != holderContinues {
		if next := nextWaiter(s.claims, s.ledger); next != nil {
			d.newHolder = next
			d.epoch = issued + 1
			d.leaseDuration = next.LeaseDurationSeconds()
			d.requeueAfter = next.LeaseDuration()
			d.writeLease = true
			return d
		}
		if d.end != holderContinues {
			d.writeLease = true // clear the holder, keep the epoch
			return d
		}
	} else {
		d.newHolder = holder
	}
	d.writeLease = repair
	return d
}

// grantable reports whether a claim may still be granted: it never held the
// lock (no epoch, not Expired) and is not the holder or the one before it.
func grantable(c *fkv1.FencedLease, l ledger) bool {
	if c.Status.Epoch != 0 || c.Status.Phase == fkv1.PhaseExpired || c.Status.Phase == fkv1.PhaseHeld {
		return false
	}
	return c.UID != l.holderUID && c.UID != l.previousUID
}

// nextWaiter is the first grantable claim in FIFO order: creationTimestamp,
// then name.
func nextWaiter(claims []*fkv1.FencedLease, l ledger) *fkv1.FencedLease {
	var waiting []*fkv1.FencedLease
	for _, c := range claims {
		if grantable(c, l) {
			waiting = append(waiting, c)
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	sortFIFO(waiting)
	return waiting[0]
}

func sortFIFO(claims []*fkv1.FencedLease) {
	sort.SliceStable(claims, func(i, j int) bool {
		a, b := claims[i], claims[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
}

func findClaim(claims []*fkv1.FencedLease, uid types.UID) *fkv1.FencedLease {
	if uid == "" {
		return nil
	}
	for _, c := range claims {
		if c.UID == uid {
			return c
		}
	}
	return nil
}

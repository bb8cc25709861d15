package lock

import (
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// statusInputs is the lock's state after this reconcile's Lease write, from
// which every claim's status follows.
type statusInputs struct {
	lease  *coordinationv1.Lease // nil while a foreign Lease blocks the lock
	ledger fkv1.Ledger
	// foreign is non-empty while a Lease fencekeeper does not manage blocks
	// the lock: why.
	foreign string
	// expiredUID is the holder this reconcile expired (reason Expired rather
	// than Superseded).
	expiredUID string
	// epochLostUID is the holder whose hold this reconcile ended because the
	// Lease could not keep its epoch (holderEpochLost): Superseded, saying why.
	epochLostUID string
	// exhausted: the lock's epochs are used up; waiters are never granted.
	exhausted bool
	// next is the waiter to be granted next (none: ""): shown ReasonNext
	// when it entered the queue there, so its library watches the Lease for
	// its grant while the waiters behind it watch only their claims.
	next types.UID
	// unrecorded: the Lease's counter cannot be its holder's epoch, and the
	// holder's status records none (decide's grantUnrecorded).
	unrecorded bool
	// queueFull are the new claims turned away because maxWaiters wait
	// ahead of them.
	queueFull  map[types.UID]bool
	maxWaiters int
	// permitEnds is why this reconcile ended each semaphore permit it
	// ended, by claim.
	permitEnds map[types.UID]holderEnd
}

// transitionEpochLost is desiredStatus's transition for the holder whose
// hold ended because the Lease could not keep its epoch: a Superseded Event
// that says so (the plain one says another holder took over, and here the
// lock may be free).
const transitionEpochLost = "EpochLost"

// desiredStatus computes a claim's status. It only changes what a phase
// transition changes, so a reconcile with nothing new writes nothing, and a
// waiter's status is written when it enters the queue and when its phase
// changes — not at every grant.
func desiredStatus(c *fkv1.FencedLease, in statusInputs) (fkv1.FencedLeaseStatus, string) {
	st := *c.Status.DeepCopy()
	st.ObservedGeneration = c.Generation
	if st.Phase == fkv1.PhaseExpired {
		return st, "" // terminal
	}
	lockName := c.Spec.LockName
	if in.foreign == "" && in.lease != nil && !in.ledger.IsMutexLedger() {
		if st, transition, done := permitStatus(c, st, in); done {
			return st, transition
		}
	}

	switch {
	case in.foreign == "" && c.UID == in.ledger.HolderUID && in.lease != nil:
		if st.Epoch == 0 && (in.unrecorded || in.ledger.IsNew()) {
			// Nothing tells which epoch its grant issued: it is shown
			// Held once the Lease is rewritten at a fresh one (decide).
			return st, ""
		}
		if st.Epoch == 0 {
			st.Epoch = in.ledger.Epoch
		}
		transition := ""
		if st.Phase != fkv1.PhaseHeld {
			transition = fkv1.ReasonGranted
			st.Phase = fkv1.PhaseHeld
			st.AcquireTime = microToTime(in.lease.Spec.AcquireTime)
			st.RenewTime = microToTime(in.lease.Spec.RenewTime)
			if st.RenewTime != nil {
				t := metav1.NewTime(st.RenewTime.Add(c.LeaseDuration()))
				st.ExpireTime = &t
			}
		}
		st.LeaseName = lockName
		setCondition(&st, fkv1.ConditionHeld, metav1.ConditionTrue, fkv1.ReasonGranted,
			fmt.Sprintf("Holds lock %s with epoch %d", lockName, st.Epoch))
		meta.RemoveStatusCondition(&st.Conditions, fkv1.ConditionLockConflict)
		return st, transition

	case st.Phase == fkv1.PhaseHeld && st.Epoch > in.ledger.Epoch && in.foreign == "":
		// The Lease we read is older than this claim's grant (a cache behind
		// another controller's write): it proves nothing about this claim.
		return st, ""

	case st.Phase == fkv1.PhaseHeld || (in.ledger.PreviousUID != "" && c.UID == in.ledger.PreviousUID):
		// It held the lock and the Lease, at or past its grant, no longer
		// names it.
		reason := fkv1.ReasonSuperseded
		msg := fmt.Sprintf("Lost lock %s: the Lease names another holder", lockName)
		if string(c.UID) == in.expiredUID || c.UID == in.ledger.PreviousUID {
			reason = fkv1.ReasonExpired
			msg = fmt.Sprintf("Lease on lock %s expired: no renewal observed for %ds", lockName, c.LeaseDurationSeconds())
		}
		transition := reason
		if string(c.UID) == in.epochLostUID {
			reason, transition = fkv1.ReasonSuperseded, transitionEpochLost
			msg = fmt.Sprintf("Lost lock %s: the Lease's epoch counter no longer showed this claim's epoch (it was edited, set back "+
				"or unreadable), and a holder's epoch is never changed, so the hold ended; create a new claim to contend again", lockName)
		}
		if by, why, ok := fkv1.BreakRequest(c); ok {
			reason, transition = fkv1.ReasonForcedRelease, fkv1.ReasonForcedRelease
			msg = fmt.Sprintf("Lock %s was forcibly released by user %q: reason %q", lockName, by, why)
		}
		st.Phase = fkv1.PhaseExpired
		setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, reason, msg)
		return st, transition

	case st.Epoch == 0 && st.Phase != fkv1.PhaseHeld && in.foreign == "" && in.ledger.TimedOutClaim(c.UID):
		// Never named by the Lease (a listed claim is never granted): it
		// leaves the queue without an epoch.
		st.Phase = fkv1.PhaseExpired
		st.LeaseName = lockName
		setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonAcquireTimeout,
			fmt.Sprintf("Not granted lock %s within acquireTimeoutSeconds (%ds) of being observed waiting: left the queue without an epoch; create a new claim to contend again",
				lockName, ptr.Deref(c.Spec.AcquireTimeoutSeconds, 0)))
		meta.RemoveStatusCondition(&st.Conditions, fkv1.ConditionLockConflict)
		return st, ""

	case st.Phase == "" && in.queueFull[c.UID]:
		st.Phase = fkv1.PhaseExpired
		st.LeaseName = lockName
		setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonQueueFull,
			fmt.Sprintf("Lock %s already has %d waiting claims (the manager's --max-waiters-per-lock): this claim was turned away; delete it and retry later", lockName, in.maxWaiters))
		return st, fkv1.ReasonQueueFull

	default:
		transition := ""
		if st.Phase == "" {
			transition = fkv1.ReasonQueued
		}
		st.Phase = fkv1.PhasePending
		st.LeaseName = lockName
		switch {
		case fkv1.RecordsNoIdentity(c):
			// Never granted (nextReadyWaiter), whatever else blocks the
			// lock: say so once, with a Warning Event, when the condition
			// first says it (the Event goes with the status write).
			transition = ""
			if cond := meta.FindStatusCondition(st.Conditions, fkv1.ConditionHeld); cond == nil || cond.Reason != fkv1.ReasonNoIdentity {
				transition = fkv1.ReasonNoIdentity
			}
			setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonNoIdentity, noIdentityMessage(lockName))
			meta.RemoveStatusCondition(&st.Conditions, fkv1.ConditionLockConflict)
		case in.foreign != "":
			setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonLockConflict, in.foreign)
			setCondition(&st, fkv1.ConditionLockConflict, metav1.ConditionTrue, fkv1.ReasonLockConflict, in.foreign)
		case capacityMismatch(c, in.ledger):
			setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonCapacityMismatch,
				fmt.Sprintf("This claim asks for maxHolders %d, but lock %s has maxHolders %d while it is held: it waits until the lock has no holder "+
					"and it is first in line (claims behind it wait too)", c.MaxHolders(), lockName, in.ledger.MaxHolders()))
			meta.RemoveStatusCondition(&st.Conditions, fkv1.ConditionLockConflict)
		case in.exhausted:
			setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonEpochsExhausted,
				fmt.Sprintf("Lock %s has issued its last possible epoch (%d) and will never be granted again: use another lock name", lockName, in.ledger.Epoch))
		case c.UID == in.next && (c.Status.Phase == "" || heldReason(c) == fkv1.ReasonNext):
			// Shown when it enters the queue at its head (the same status
			// write), and kept while it stays there. A waiter that becomes
			// the head later is not marked: that would be one more status
			// write per handoff (docs/design.md §7), and it learns of its
			// grant from its claim.
			setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonNext,
				fmt.Sprintf("Next in the queue of lock %s: granted when the current hold ends", lockName))
			meta.RemoveStatusCondition(&st.Conditions, fkv1.ConditionLockConflict)
		default:
			setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, fkv1.ReasonQueued, queuedPrefix+lockName)
			meta.RemoveStatusCondition(&st.Conditions, fkv1.ConditionLockConflict)
		}
		return st, transition
	}
}

// capacityMismatch reports whether claim c asks for another capacity than
// the lock has while it is held (docs/design.md §9).
func capacityMismatch(c *fkv1.FencedLease, l fkv1.Ledger) bool {
	return (l.Held() || len(l.Permits) > 0) && c.MaxHolders() != l.MaxHolders()
}

// permitStatus is desiredStatus for a claim of a semaphore lock whose
// status a permit decides (done): a claim with a live permit is Held at
// its permit's epoch; one that was granted a permit the Lease, at or past
// its grant, no longer lists has lost it (Expired). Other claims (waiting,
// timed out, turned away) are not done: desiredStatus goes on as for a
// mutex.
func permitStatus(c *fkv1.FencedLease, st fkv1.FencedLeaseStatus, in statusInputs) (fkv1.FencedLeaseStatus, string, bool) {
	lockName := c.Spec.LockName
	if p, ok := in.ledger.PermitFor(c.UID); ok {
		if st.Epoch != 0 && st.Epoch != p.Epoch {
			return st, "", true // its permit ends (decideSemaphore), never re-epoched
		}
		transition := ""
		st.Epoch = p.Epoch
		if st.Phase != fkv1.PhaseHeld {
			transition = fkv1.ReasonGranted
			st.Phase = fkv1.PhaseHeld
			st.AcquireTime = microToTime(in.lease.Spec.AcquireTime)
			st.RenewTime = st.AcquireTime
			if st.RenewTime != nil {
				t := metav1.NewTime(st.RenewTime.Add(c.LeaseDuration()))
				st.ExpireTime = &t
			}
		}
		st.LeaseName = fkv1.PermitLeaseName(lockName, p.Epoch)
		setCondition(&st, fkv1.ConditionHeld, metav1.ConditionTrue, fkv1.ReasonGranted,
			fmt.Sprintf("Holds a permit of lock %s (at most %d holders) with epoch %d; renews Lease %s", lockName, in.ledger.MaxHolders(), p.Epoch, st.LeaseName))
		meta.RemoveStatusCondition(&st.Conditions, fkv1.ConditionLockConflict)
		return st, transition, true
	}
	if st.Phase != fkv1.PhaseHeld && st.Epoch == 0 {
		return st, "", false
	}
	if st.Epoch > in.ledger.Epoch {
		// The Lease we read is older than this claim's grant.
		return st, "", true
	}
	reason, transition := fkv1.ReasonExpired, fkv1.ReasonExpired
	msg := fmt.Sprintf("Lost its permit of lock %s (epoch %d): no renewal observed for %ds", lockName, st.Epoch, c.LeaseDurationSeconds())
	switch end := in.permitEnds[c.UID]; {
	case end == holderEpochLost:
		reason, transition = fkv1.ReasonSuperseded, transitionEpochLost
		msg = fmt.Sprintf("Lost its permit of lock %s: the claim records another epoch than its permit (%d); create a new claim to contend again", lockName, st.Epoch)
	case end == holderGaveUp || (end == holderContinues && !in.ledger.IsSemaphore()):
		reason, transition = fkv1.ReasonSuperseded, fkv1.ReasonSuperseded
		msg = fmt.Sprintf("Lost lock %s (epoch %d): the Lease no longer lists it", lockName, st.Epoch)
	}
	if by, why, ok := fkv1.BreakRequest(c); ok {
		reason, transition = fkv1.ReasonForcedRelease, fkv1.ReasonForcedRelease
		msg = fmt.Sprintf("Permit of lock %s was forcibly released by user %q: reason %q", lockName, by, why)
	}
	st.Phase = fkv1.PhaseExpired
	setCondition(&st, fkv1.ConditionHeld, metav1.ConditionFalse, reason, msg)
	return st, transition, true
}

// heldReason is the reason of c's Held condition ("" without one).
func heldReason(c *fkv1.FencedLease) string {
	if h := meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld); h != nil {
		return h.Reason
	}
	return ""
}

// queuedPrefix begins a queued waiter's Held condition message; the lock's
// name ends it.
const queuedPrefix = "Waiting in the queue of lock "

// queuedAsBefore reports, without computing it, that desiredStatus leaves
// c's status as it is: a waiter already shown Queued, and nothing in that
// changes a waiter's status. syncStatuses passes those over; in a long
// queue they are nearly all the claims, and computing each one's status
// (a copy, a message) was most of a reconcile's work.
func queuedAsBefore(c *fkv1.FencedLease, in statusInputs) bool {
	st := &c.Status
	if _, permit := in.ledger.PermitFor(c.UID); permit {
		return false
	}
	if st.Phase != fkv1.PhasePending || in.foreign != "" || in.exhausted || c.UID == in.ledger.HolderUID ||
		c.UID == in.ledger.PreviousUID || st.ObservedGeneration != c.Generation || st.LeaseName != c.Spec.LockName ||
		len(st.Conditions) != 1 || fkv1.RecordsNoIdentity(c) || in.ledger.TimedOutClaim(c.UID) || capacityMismatch(c, in.ledger) {
		return false
	}
	h := &st.Conditions[0]
	return h.Type == fkv1.ConditionHeld && h.Status == metav1.ConditionFalse && h.Reason == fkv1.ReasonQueued &&
		h.ObservedGeneration == c.Generation && strings.HasPrefix(h.Message, queuedPrefix) && h.Message[len(queuedPrefix):] == c.Spec.LockName
}

// noIdentityMessage is the Held condition's message on a claim that records
// no identity, which is never granted.
func noIdentityMessage(lockName string) string {
	return fmt.Sprintf("This claim records no identity (it was created while the claim-identity policy was not in effect): "+
		"it will never be granted lock %s, since every write presenting its epoch would be refused, and the lock goes to the "+
		"next waiter; delete it and create it again", lockName)
}

func setCondition(st *fkv1.FencedLeaseStatus, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg,
		ObservedGeneration: st.ObservedGeneration,
	})
}

func microToTime(t *metav1.MicroTime) *metav1.Time {
	if t == nil {
		return nil
	}
	out := metav1.NewTime(t.Truncate(time.Second))
	return &out
}

// statusEqual is equality.Semantic.DeepEqual for claim statuses, without
// reflection: every reconcile compares the status of every claim of the
// lock, before the holder's own is written, and with 1,000 waiters the
// reflective comparison took 5 ms of it. TestStatusEqual holds it to the
// semantic comparison, and fails when the status gains a field.
func statusEqual(a, b fkv1.FencedLeaseStatus) bool {
	return a.Phase == b.Phase && a.Epoch == b.Epoch && a.LeaseName == b.LeaseName &&
		timeEqual(a.AcquireTime, b.AcquireTime) && timeEqual(a.RenewTime, b.RenewTime) &&
		timeEqual(a.ExpireTime, b.ExpireTime) && a.ObservedGeneration == b.ObservedGeneration &&
		conditionsEqual(a.Conditions, b.Conditions)
}

// timeEqual: both unset, or both set to the same instant (the semantic
// comparison of metav1.Time).
func timeEqual(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}

// conditionsEqual compares in order; nil and empty are equal.
func conditionsEqual(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.Type != y.Type || x.Status != y.Status || x.ObservedGeneration != y.ObservedGeneration ||
			!x.LastTransitionTime.Equal(&y.LastTransitionTime) || x.Reason != y.Reason || x.Message != y.Message {
			return false
		}
	}
	return true
}

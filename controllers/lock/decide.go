package lock

import (
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// snapshot is everything a decision about one lock needs, as gathered from
// the informer cache (plus the rare live reads gather makes). It holds no
// clients, so decide is a pure function.
type snapshot struct {
	// ledger is what the lock's managed Lease records (the zero Ledger with
	// EpochValid when there is no Lease).
	ledger fkv1.Ledger
	// hasLease is true when the lock has a managed Lease; leaseDeleting when
	// an admin deleted it and only its finalizer holds it.
	hasLease, leaseDeleting bool
	// foreignOwners is true when the Lease has ownerReferences. The manager
	// sets none, so another writer left them (before the managed-Lease
	// guard covered them, or with it off).
	foreignOwners bool
	// foreign explains a same-named Lease fencekeeper does not manage ("" when none).
	foreign string
	// claims of this lock that exist and are not being deleted. Their maps,
	// slices and pointers are the informer cache's (listClaims): never write
	// into them, nor decode a reply into a claim that has no copy of its own.
	claims []*fkv1.FencedLease
	// holderPod is the liveness of the pod the holder claim was made for
	// (pods.NotAPod for a claim that renews the Lease itself).
	holderPod pods.Liveness
	// firstSeen is when this process first observed each waiting claim
	// that sets acquireTimeoutSeconds, on its own clock.
	firstSeen map[types.UID]time.Time
	// timedOutGone are the claims the Lease lists as timed out that a live
	// read showed gone (deleted, or re-created with another UID) or ended.
	timedOutGone map[types.UID]bool
	// waiterPods is the liveness of the pods that waiting pod claims were
	// made for, in queue order up to the first waiter that can be granted: a
	// pod is granted only once its containers are ready.
	waiterPods map[types.UID]pods.Liveness
	// renewSeenAt is when this controller first observed the current
	// renewal signal (the holder's renewTime, or its pod's liveness).
	renewSeenAt time.Time
	now         time.Time
	// floor is the highest epoch known from any source other than the Lease:
	// claim statuses and this process's memory.
	floor int64
	// storageRevision is the resourceVersion of the Lease version a write
	// replaces (0: none): a storage revision, above every epoch this lock
	// ever issued (an epoch is below the revision of the write that issued
	// it, and the Lease's creation proves every earlier Lease of the lock
	// gone). A new ledger's epochs start there.
	storageRevision int64
	// termFloor is this term's floor (termFloor): every grant is at least
	// that.
	termFloor int64
	// permits are a semaphore lock's live permits (semaphore.go), as the
	// Lease lists them.
	permits []permitState
}

// actionKind is what a reconcile does to the lock's Lease.
type actionKind int

const (
	// actIdle: nobody holds or waits; nothing to do until a claim comes.
	actIdle actionKind = iota
	// actKeep: the holder keeps the lock; no Lease write.
	actKeep
	// actGrant: name the next waiter holder with a new epoch.
	actGrant
	// actFree: clear the ended holder and keep the epoch; nobody waits.
	actFree
	// actRepair: the holder (if any) stays, at the epoch it was granted;
	// raise the counter (back to that epoch, when a holder stays), restore
	// the labels, finalizer or TTL on the Lease, or remove the owner
	// references another writer left on it. Not a renewal: the holder's
	// TTL clock runs on.
	actRepair
	// actReleaseFinalizer: the Lease was deleted and no claim remains: let it go.
	actReleaseFinalizer
	// actForeign: a Lease fencekeeper does not manage blocks the lock.
	actForeign
)

// writesLease reports whether the action is a (guarded) Lease write.
func (k actionKind) writesLease() bool { return k == actGrant || k == actFree || k == actRepair }

// holderEnd says why the current holder stops holding.
type holderEnd string

const (
	holderContinues holderEnd = ""
	holderReleased  holderEnd = fkv1.ReasonReleased      // claim deleted, or its pod gone
	holderExpired   holderEnd = fkv1.ReasonExpired       // no renewal observed for a TTL
	holderGaveUp    holderEnd = fkv1.ReasonSuperseded    // claim is already Expired (terminal)
	holderForced    holderEnd = fkv1.ReasonForcedRelease // an operator broke the lock
	// holderEpochLost: the Lease cannot go on showing the holder's epoch
	// (keepsEpoch). A grant is the pair (claim UID, epoch): the authority
	// never gives a continuing holder another epoch, since its library,
	// and everything it already wrote, go by the one it was granted. The
	// hold ends (the claim goes Expired, Superseded) and the lock is
	// granted anew to the next waiter, or freed.
	holderEpochLost holderEnd = "EpochLost"
)

// action is the outcome of decide: at most one Lease change. The claim
// statuses follow from the Lease afterwards (see desiredStatus).
type action struct {
	kind actionKind
	// holder is the claim that holds the lock after the action: the grantee
	// of actGrant, the kept holder of actKeep/actRepair, nil otherwise.
	holder *fkv1.FencedLease
	// epoch is the counter the Lease carries after the action: issued+1 for a
	// grant, otherwise the (repaired) last issued epoch.
	epoch int64
	// repaired is true when the Lease's counter was below an epoch already
	// issued, or unreadable, and this write raises it (with any kind).
	repaired bool
	// end tells what happened to the previous holder, and who that was.
	end       holderEnd
	endedUID  types.UID
	endedName string
	// leaseDuration is the TTL the Lease records for the holder.
	leaseDuration int32
	// requeueAfter is when the holder expires if no renewal is observed.
	requeueAfter time.Duration
	// exhausted is true when a waiter could not be granted because the
	// lock's last epoch is the largest there is.
	exhausted bool
	// timedOut is what the Lease lists as timed out after the action
	// (ledger.TimedOut): the listed claims whose end is not yet seen, and
	// the waiters whose acquireTimeoutSeconds ran out now. timeoutWake is
	// when the next waiter's runs out (0: none waits with one).
	timedOut    []fkv1.ClaimRef
	timeoutWake time.Duration
	// unrecorded is true when the Lease names a holder whose grant no status
	// records and whose epoch the counter cannot tell (grantUnrecorded):
	// that holder is not shown Held from this Lease, and its hold ends
	// (holderEpochLost) as soon as the Lease can be written.
	unrecorded bool
	// semaphore is true for a decision on a semaphore lock
	// (decideSemaphore): the Lease is written in its layout, capacity and
	// permits (the live permits after the action) instead of a holder;
	// grants are the permits granted, permitEnds those ended.
	semaphore  bool
	capacity   int32
	permits    []fkv1.Permit
	grants     []permitGrant
	permitEnds []permitEnd
}

// decide computes what one reconcile of a lock does: a chain of named rules,
// each a small pure function (docs/design.md §2):
//
//   - settled: a foreign Lease, a deleted Lease to let go, an idle lock;
//   - epochsOf: where the next epoch comes from (epochSource);
//   - holderOutcome: whether the holder keeps the lock, and why not;
//   - nextGrant: the next ready waiter gets the next epoch;
//   - freeLock: an ended hold with nobody to grant frees the lock;
//   - repairLedger: a Lease that needs repair is rewritten, holder kept;
//   - acquireTimeouts: waiters whose acquireTimeoutSeconds ran out leave
//     the queue, recorded in the same guarded Lease write.
//
// It never issues an epoch at or below anything already issued: the next
// epoch is one above the highest of the Lease's counter, every claim's
// recorded epoch and this process's memory, and a new ledger starts at the
// storage revision.
func decide(s snapshot) action {
	if a, ok := settled(s); ok {
		return a
	}
	if semaphoreLock(s) {
		return decideSemaphore(s)
	}
	ep := epochsOf(s)
	a := action{kind: actKeep, epoch: ep.issued, unrecorded: ep.unrecorded, repaired: ep.repaired}
	h := holderOutcome(s, ep)
	a.holder, a.end, a.leaseDuration, a.requeueAfter = h.holder, h.end, h.leaseDuration, h.requeueAfter
	if h.end != holderContinues {
		a.endedUID, a.endedName = s.ledger.HolderUID, s.ledger.HolderClaim
	}
	if a.holder == nil {
		var done bool
		if a, done = nextGrant(s, ep, a); done {
			return acquireTimeouts(s, a)
		}
		if a.end != holderContinues {
			return acquireTimeouts(s, freeLock(ep, a))
		}
	}
	return acquireTimeouts(s, repairLedger(s, ep, a, h.ttlRepair))
}

// acquireTimeouts is the rule for bounded waits (docs/design.md §5): a
// waiter not granted acquireTimeoutSeconds after this process first
// observed it (0: at the first decision that does not grant it) leaves the
// queue without an epoch. The timeout is recorded in the Lease
// (ledger.TimedOut) and written guarded like a grant, so a claim is never
// both timed out and granted: of two decisions on one Lease version only
// one write succeeds, and a listed claim is never grantable. A claim the
// Lease ever named is not a waiter (grantable), so it ends as a holder
// does. A listed claim stays listed until its end is seen: its status
// Expired in the cache, or a live read (gather) showing it ended or gone.
// A claim missing from the cache may only be one the cache has not shown
// yet, which a write that forgot it would make grantable again. (A grant
// of a claim with a deadline reads the claim live first, in act: a cache
// may still show a claim Pending after another authority saw it end.)
func acquireTimeouts(s snapshot, a action) action {
	var due []fkv1.ClaimRef
	for _, c := range s.claims {
		limit := c.Spec.AcquireTimeoutSeconds
		if limit == nil || !grantable(c, s.ledger) || a.grantee(c.UID) {
			continue
		}
		seen, ok := s.firstSeen[c.UID]
		if !ok {
			seen = s.now
		}
		switch left := seen.Add(time.Duration(*limit) * time.Second).Sub(s.now); {
		case left <= 0:
			due = append(due, fkv1.ClaimRef{Name: c.Name, UID: c.UID})
		case a.timeoutWake == 0 || left < a.timeoutWake:
			a.timeoutWake = left
		}
	}
	a.timedOut = slices.DeleteFunc(slices.Clone(s.ledger.TimedOut), func(r fkv1.ClaimRef) bool {
		c := findClaim(s.claims, r.UID)
		return s.timedOutGone[r.UID] || (c != nil && c.Status.Phase == fkv1.PhaseExpired)
	})
	if len(due) > 0 {
		a.timedOut = append(a.timedOut, due...)
		if a.kind == actKeep && s.hasLease && (!s.ledger.IsNew() || s.storageRevision != 0) {
			a.kind = actRepair // the holder, if any, stays at its epoch
		}
	}
	if !a.kind.writesLease() {
		a.timedOut = s.ledger.TimedOut
	}
	return a
}

// settled is the rule for locks with nothing to grant or keep: a Lease
// fencekeeper does not manage blocks the lock; a Lease an admin deleted
// with no claim left is let go; nobody holds or waits (and no foreign owner
// is left to remove).
func settled(s snapshot) (action, bool) {
	switch {
	case s.foreign != "":
		return action{kind: actForeign}, true
	case len(s.claims) == 0 && s.hasLease && s.leaseDeleting:
		return action{kind: actReleaseFinalizer}, true
	case len(s.claims) == 0 && !s.ledger.Held() && len(s.ledger.Permits) == 0 && !s.dropsOwners():
		return action{kind: actIdle}, true
	}
	return action{}, false
}

// epochSource is where the lock's next epoch comes from: the counter, a
// floor above it, or a new ledger.
type epochSource struct {
	// issued is the highest epoch known issued: the Lease's counter, or the
	// floor (claim statuses and this process's memory) when that is higher.
	issued int64
	// repaired: the counter is below the floor, or unreadable; any write
	// raises it to issued.
	repaired bool
	// unrecorded: the Lease names a holder whose epoch nothing records and
	// the counter cannot be trusted to be it (grantUnrecorded).
	unrecorded bool
	// newLedger: nothing records the lock's last epoch (no epoch issued, an
	// unreadable counter, or unrecorded): the next counter written starts
	// at the storage revision, which is above every epoch ever issued.
	newLedger bool
	// revision is, for a new ledger, the resourceVersion of the Lease
	// version the write replaces (0: no Lease yet; nothing is written).
	revision int64
	// termFloor is this term's floor: no grant of the term is below it.
	termFloor int64
}

func epochsOf(s snapshot) epochSource {
	e := epochSource{issued: max(s.ledger.Epoch, s.floor), unrecorded: grantUnrecorded(s.ledger, s.claims, s.floor), termFloor: s.termFloor}
	e.repaired = e.issued != s.ledger.Epoch || !s.ledger.EpochValid
	e.newLedger = s.ledger.IsNew() || e.unrecorded
	if e.newLedger {
		e.revision = s.storageRevision
	}
	return e
}

// next is the epoch of the next grant: one above every epoch issued, at
// least the term's floor and, for a new ledger, the revision of the Lease
// it replaces (false: a new ledger without a Lease; nothing is written).
func (e epochSource) next() (int64, bool) {
	if e.newLedger && e.revision == 0 {
		return 0, false
	}
	return max(e.issued+1, e.revision, e.termFloor), true
}

// start is the counter of a new ledger written with no holder: the storage
// revision, as a grant's first epoch, or the floor when above it. From the
// floor alone the counter would look valid, and later epochs would count
// up from a floor that misses epochs whose records are gone (a claim
// deleted, then a restart). Without the revision nothing may be written
// (false).
func (e epochSource) start() (int64, bool) {
	return max(e.issued, e.revision), e.revision != 0
}

// holdOutcome is what happens to the current holder.
type holdOutcome struct {
	// holder keeps the lock (nil: not held, or the hold ends).
	holder *fkv1.FencedLease
	end    holderEnd
	// leaseDuration is the TTL in force for a kept holder; requeueAfter when
	// it lapses unless a renewal is observed.
	leaseDuration int32
	requeueAfter  time.Duration
	// ttlRepair: the Lease's TTL differs from the one in force.
	ttlRepair bool
}

// holderOutcome is the rule for the holder: released (claim gone, or its pod
// gone), gave up (its claim is already Expired), broken by an operator,
// expired (no renewal observed for a TTL on this process's clock), its
// epoch lost (keepsEpoch), or kept until its TTL lapses.
func holderOutcome(s snapshot, ep epochSource) holdOutcome {
	if !s.ledger.Held() {
		return holdOutcome{}
	}
	holder := findClaim(s.claims, s.ledger.HolderUID)
	switch {
	case holder == nil || s.holderPod == pods.Gone:
		return holdOutcome{end: holderReleased}
	case holder.Status.Phase == fkv1.PhaseExpired:
		return holdOutcome{end: holderGaveUp}
	case broken(holder):
		return holdOutcome{end: holderForced}
	}
	// The TTL in force is the one the Lease recorded at grant, which is the
	// holder's claim's (immutable, and what its library counts its safe
	// time by). A Lease whose TTL is shorter, or gone, was edited after the
	// grant (the guard off): it must not expire the holder early, and is
	// repaired. A longer one is kept.
	o := holdOutcome{leaseDuration: max(s.ledger.LeaseDurationSeconds, holder.LeaseDurationSeconds())}
	o.ttlRepair = o.leaseDuration != s.ledger.LeaseDurationSeconds
	ttl := time.Duration(o.leaseDuration) * time.Second
	left := ttl // a live pod renews its lease by being live
	if s.holderPod != pods.Live {
		left = s.renewSeenAt.Add(ttl).Sub(s.now)
	}
	switch {
	case left <= 0:
		o.end = holderExpired
	case !keepsEpoch(holder, s.ledger, ep.issued, ep.unrecorded):
		o.end = holderEpochLost
	default:
		o.holder, o.requeueAfter = holder, left
	}
	return o
}

// nextGrant is the rule for a lock nobody keeps: the first ready waiter
// (nextReadyWaiter) is granted the next epoch. done is false when nobody is
// granted: no ready waiter, or every epoch is issued (a.exhausted: granting
// would wrap). While a new ledger waits for the storage revision nothing is
// written, and an unrecorded holder is not shown Held meanwhile.
func nextGrant(s snapshot, ep epochSource, a action) (action, bool) {
	// The ended holder is never a waiter: grantable skips the Lease's holder.
	next := nextReadyWaiter(s.claims, s.ledger, s.waiterPods)
	switch {
	case next == nil || next.MaxHolders() != 1:
		// A claim for a semaphore at the head waits for the lock to be
		// free: it is then decided as a semaphore (semaphoreLock).
		return a, false
	case ep.issued == math.MaxInt64:
		a.exhausted = true
		return a, false
	}
	epoch, ok := ep.next()
	if !ok {
		return noWrite(ep), true
	}
	a.kind, a.holder, a.epoch = actGrant, next, epoch
	a.leaseDuration, a.requeueAfter = next.LeaseDurationSeconds(), next.LeaseDuration()
	return a, true
}

// noWrite is the action while a new ledger waits for the storage revision.
func noWrite(ep epochSource) action {
	return action{kind: actKeep, epoch: ep.issued, unrecorded: ep.unrecorded}
}

// freeLock is the rule for a hold that ended with nobody to grant: the
// holder is cleared and the epoch kept (a new ledger's counter starts at
// the storage revision).
func freeLock(ep epochSource, a action) action {
	a.kind = actFree
	if ep.newLedger {
		start, ok := ep.start()
		if !ok {
			return noWrite(ep)
		}
		a.epoch, a.repaired = start, true
	}
	return a
}

// repairLedger is the rule for a Lease that is kept as it is but needs
// rewriting: its counter is below an epoch issued or unreadable, its labels
// or finalizer are missing (adoption), it has owners to remove, or its TTL
// differs from the holder's. The holder (if any) stays at the epoch it was
// granted; a new ledger written without a holder starts at the storage
// revision. Not a renewal: the holder's TTL clock runs on.
func repairLedger(s snapshot, ep epochSource, a action, ttlRepair bool) action {
	repair := ep.repaired || !s.ledger.Adopted || s.dropsOwners() || ttlRepair
	if repair && a.holder == nil && s.ledger.IsNew() {
		start, ok := ep.start()
		if !ok {
			return a
		}
		a.epoch, a.repaired = start, true
	}
	if repair {
		a.kind = actRepair
	}
	return a
}

// dropsOwners reports whether the Lease carries owner references the
// authority removes (docs/design.md §2: nobody but the manager adds, removes
// or changes them, and the manager sets none). Held, free or idle alike: an
// owner that does not exist has the garbage collector retry, forever, a
// delete the managed-Lease guard refuses, and one with blockOwnerDeletion
// hangs a foreground deletion of a real owner. A Lease being deleted is
// left alone (it goes once its lock's claims do).
func (s snapshot) dropsOwners() bool { return s.foreignOwners && !s.leaseDeleting }

// keepsEpoch reports whether holder may go on holding through this action:
// the counter the Lease shows after it (issued, decide's last epoch issued,
// which a repair writes) is the epoch holder was granted. That epoch is the
// one its status records; with none recorded (the grant's status patch
// never happened), the Lease's counter, unless grantUnrecorded says the
// counter cannot be it (unrecorded). Anything else, a counter set back
// below an epoch issued after the holder's, raised past it, or unreadable
// with nothing recording the grant, would leave the holder working with an
// epoch the ledger no longer shows as its own, or need a new one for it,
// and a grant is never re-epoched: the hold ends instead.
func keepsEpoch(holder *fkv1.FencedLease, led fkv1.Ledger, issued int64, unrecorded bool) bool {
	granted := holder.Status.Epoch
	if granted == 0 && !unrecorded {
		granted = led.Epoch
	}
	return granted != 0 && granted == issued
}

// grantUnrecorded reports whether the Lease names a holder whose epoch no
// claim status records (its claim is gone, or its grant's status patch
// never happened: the controller stopped in between) while the Lease's
// counter cannot be trusted to be that epoch: unreadable, below an epoch
// already issued (the floor), or not above an epoch another claim records
// (set back by hand). The next epoch written then starts at the storage
// revision, and a surviving holder's hold ends (keepsEpoch): it is never
// given that fresh epoch, which its library would not know as its grant.
func grantUnrecorded(l fkv1.Ledger, claims []*fkv1.FencedLease, floor int64) bool {
	if !l.Held() {
		return false
	}
	if holder := findClaim(claims, l.HolderUID); holder != nil && holder.Status.Epoch != 0 {
		return false // the floor covers a counter set below it
	}
	if l.IsNew() || l.Epoch < floor {
		return true
	}
	for _, c := range claims {
		if c.UID != l.HolderUID && c.Status.Epoch >= l.Epoch {
			return true
		}
	}
	return false
}

func broken(c *fkv1.FencedLease) bool {
	_, _, ok := fkv1.BreakRequest(c)
	return ok
}

// grantable reports whether a claim may still be granted: it never held the
// lock (no epoch, not Expired), is not the holder or the one before it, and
// did not time out.
func grantable(c *fkv1.FencedLease, l fkv1.Ledger) bool {
	if c.Status.Epoch != 0 || c.Status.Phase == fkv1.PhaseExpired || c.Status.Phase == fkv1.PhaseHeld || broken(c) || l.TimedOutClaim(c.UID) {
		return false
	}
	return c.UID != l.HolderUID && c.UID != l.PreviousUID
}

// nextReadyWaiter is the first waiter in FIFO order that can hold the lock
// now: a pod claim whose pod is not ready (still pulling its image, say)
// keeps its place and is passed over, and so is a claim that records no
// identity (fkv1.RecordsNoIdentity), which is never granted: every
// write presenting its epoch would be refused, and an epoch nobody may
// write with must not block the lock.
func nextReadyWaiter(claims []*fkv1.FencedLease, l fkv1.Ledger, waiterPods map[types.UID]pods.Liveness) *fkv1.FencedLease {
	for _, c := range waitingInOrder(claims, l) {
		if fkv1.RecordsNoIdentity(c) {
			continue
		}
		if live, ok := waiterPods[c.UID]; !ok || live == pods.Live || live == pods.NotAPod {
			return c
		}
	}
	return nil
}

// waitingInOrder are the grantable claims in FIFO order: creationTimestamp,
// then name. gather hands decide the claims in that order already (fifo),
// so the usual cost is one pass; claims in any other order are sorted.
func waitingInOrder(claims []*fkv1.FencedLease, l fkv1.Ledger) []*fkv1.FencedLease {
	var waiting []*fkv1.FencedLease
	for _, c := range claims {
		if grantable(c, l) {
			waiting = append(waiting, c)
		}
	}
	if !slices.IsSortedFunc(waiting, fifoCompare) {
		slices.SortFunc(waiting, fifoCompare)
	}
	return waiting
}

// fifoCompare orders claims by creationTimestamp, then name: the queue's
// order. Two claims of one lock never compare equal (names are unique in a
// namespace), so no sort by it needs to be stable.
func fifoCompare(a, b *fkv1.FencedLease) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
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

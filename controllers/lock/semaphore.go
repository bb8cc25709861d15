package lock

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// permitState is one live permit of a semaphore lock as gather found it.
type permitState struct {
	fkv1.Permit
	// claim is the permit's claim (nil: gone).
	claim *fkv1.FencedLease
	// pod is the liveness of the pod the claim was made for (pods.NotAPod
	// for a claim that renews its permit Lease itself).
	pod pods.Liveness
	// renewSeenAt is when this process first observed the permit's current
	// renewal signal (its permit Lease's renewTime, or its pod's liveness).
	renewSeenAt time.Time
}

// permitGrant is one permit a decision grants.
type permitGrant struct {
	claim *fkv1.FencedLease
	epoch int64
}

// permitEnd is one permit a decision ends, and why.
type permitEnd struct {
	fkv1.Permit
	end holderEnd
}

// semaphoreLock reports whether the lock is decided as a semaphore: its
// ledger is not a plain mutex ledger (a capacity above 1, permits, or
// either unreadable), or nobody holds it and the first waiter in line asks
// for a capacity above 1. A mutex ledger that is held stays a mutex until
// its holder's hold ends (docs/design.md §9: the capacity is recorded
// while the lock has no holder).
func semaphoreLock(s snapshot) bool {
	l := s.ledger
	if !l.IsMutexLedger() {
		return true
	}
	if l.Held() {
		return false
	}
	head := firstInLine(s.claims, l)
	return head != nil && head.MaxHolders() > 1
}

// firstInLine is the first waiter in FIFO order that nextReadyWaiter would
// consider (identity recorded), ready or not.
func firstInLine(claims []*fkv1.FencedLease, l fkv1.Ledger) *fkv1.FencedLease {
	for _, c := range waitingInOrder(claims, l) {
		if !fkv1.RecordsNoIdentity(c) {
			return c
		}
	}
	return nil
}

// decideSemaphore is decide for a semaphore lock (docs/design.md §9). Every
// permit is ended on its own (permitOutcome) and the free permits go to the
// next ready waiters in FIFO order, each with the lock's next epoch, all in
// one guarded Lease write: of two decisions on one Lease version only one
// write succeeds, so two authorities never grant more permits than the
// capacity. The capacity is recorded while no permit is live: the first
// waiter in line's. Waiters behind a claim that asks for another capacity
// wait behind it (the queue is FIFO across capacities), and it waits until
// the lock has no permit.
func decideSemaphore(s snapshot) action {
	ep := epochsOf(s)
	a := action{kind: actKeep, epoch: ep.issued, repaired: ep.repaired, semaphore: true}
	var kept []fkv1.Permit
	var wake time.Duration
	for _, p := range s.permits {
		end, left := permitOutcome(s, p)
		if end != holderContinues {
			a.permitEnds = append(a.permitEnds, permitEnd{Permit: p.Permit, end: end})
			continue
		}
		kept = append(kept, p.Permit)
		if wake == 0 || left < wake {
			wake = left
		}
	}
	if s.ledger.Held() {
		// A mutex holder left on a ledger that is no longer a mutex one (its
		// capacity annotation edited): its epoch is not a permit's.
		a.endedUID, a.endedName, a.end = s.ledger.HolderUID, s.ledger.HolderClaim, holderEpochLost
	}
	a.capacity = s.ledger.MaxHolders()
	switch head := firstInLine(s.claims, s.ledger); {
	case s.ledger.CapacityInvalid && len(kept) > 0:
		// Nothing tells the capacity the live permits were granted under:
		// record as many as are live, so nothing more is granted until
		// they end.
		a.capacity = int32(len(kept))
	case len(kept) == 0 && head != nil:
		// No permit is live: the capacity becomes the first waiter's.
		a.capacity = head.MaxHolders()
	case s.ledger.CapacityInvalid:
		a.capacity = 1
	}
	if n := int32(len(kept)); n > 0 && a.capacity < max(n, 2) {
		// Live permits under a capacity of 1 (the annotation removed or
		// edited): a semaphore of as many as are live, so that admission
		// never reads its permits as a free mutex.
		a.capacity = max(n, 2)
	}
	a.permits = kept
	var waiters []*fkv1.FencedLease
	if a.capacity > 1 {
		// A capacity of 1 is a mutex: the Lease is written back in its
		// layout first, and its next decision grants as a mutex.
		waiters = readyWaiters(s, a.capacity, int(a.capacity)-len(kept))
	}
	epoch, canWrite := ep.next()
	switch {
	case len(waiters) > 0 && !canWrite:
		return noWrite(ep)
	case len(waiters) > 0 && ep.issued == math.MaxInt64:
		a.exhausted, waiters = true, nil
	}
	for _, c := range waiters {
		a.grants = append(a.grants, permitGrant{claim: c, epoch: epoch})
		a.permits = append(a.permits, fkv1.Permit{Epoch: epoch, Claim: c.Name, UID: c.UID, Holder: c.Spec.HolderIdentity,
			User: c.Annotations[fkv1.AnnotationCreatedBy], PodUID: c.Annotations[fkv1.AnnotationCreatedByPodUID], TTL: c.LeaseDurationSeconds()})
		a.epoch = epoch
		if ttl := c.LeaseDuration(); wake == 0 || ttl < wake {
			wake = ttl
		}
		if epoch == math.MaxInt64 {
			break // the last epoch there is
		}
		epoch++
	}
	a.requeueAfter = wake
	changed := len(a.grants) > 0 || len(a.permitEnds) > 0 || a.end != holderContinues ||
		a.capacity != s.ledger.MaxHolders() || (a.capacity > 1 && a.capacity != s.ledger.Capacity) || s.ledger.CapacityInvalid || s.ledger.PermitsInvalid
	switch {
	case len(a.grants) > 0:
		a.kind = actGrant
	case changed:
		a.kind = actFree
	case ep.repaired || !s.ledger.Adopted || s.dropsOwners():
		a.kind = actRepair
	}
	if a.kind != actKeep && ep.newLedger && len(a.grants) == 0 {
		// A new ledger written without a grant starts at the storage
		// revision, as freeLock's.
		start, ok := ep.start()
		if !ok {
			return noWrite(ep)
		}
		a.epoch, a.repaired = start, true
	}
	return acquireTimeouts(s, a)
}

// permitOutcome is holderOutcome for one permit: released (claim gone, or
// its pod gone), gave up (claim Expired), broken by an operator, its epoch
// lost (the claim records another epoch), or expired (no renewal observed
// for its TTL on this process's clock); else kept, left until it lapses.
func permitOutcome(s snapshot, p permitState) (holderEnd, time.Duration) {
	c := p.claim
	switch {
	case c == nil || p.pod == pods.Gone:
		return holderReleased, 0
	case c.Status.Phase == fkv1.PhaseExpired:
		return holderGaveUp, 0
	case broken(c):
		return holderForced, 0
	case c.Status.Epoch != 0 && c.Status.Epoch != p.Epoch:
		return holderEpochLost, 0
	}
	ttl := time.Duration(max(p.TTL, c.LeaseDurationSeconds())) * time.Second
	left := ttl // a live pod renews its lease by being live
	if p.pod != pods.Live {
		left = p.renewSeenAt.Add(ttl).Sub(s.now)
	}
	if left <= 0 {
		return holderExpired, 0
	}
	return holderContinues, left
}

// readyWaiters are up to n waiters, in FIFO order, that can hold a permit
// now: as nextReadyWaiter, stopping at the first one that asks for another
// capacity (it waits for the lock to have no permit, and those behind it
// wait behind it).
func readyWaiters(s snapshot, capacity int32, n int) []*fkv1.FencedLease {
	var out []*fkv1.FencedLease
	for _, c := range waitingInOrder(s.claims, s.ledger) {
		if len(out) >= n {
			break
		}
		if fkv1.RecordsNoIdentity(c) {
			continue
		}
		if c.MaxHolders() != capacity {
			break
		}
		if _, ok := s.ledger.PermitFor(c.UID); ok {
			continue
		}
		if live, ok := s.waiterPods[c.UID]; !ok || live == pods.Live || live == pods.NotAPod {
			out = append(out, c)
		}
	}
	return out
}

// grantee reports whether the action grants claim uid (a mutex grant or a
// permit).
func (a action) grantee(uid types.UID) bool {
	if a.holder != nil && a.holder.UID == uid {
		return true
	}
	return slices.ContainsFunc(a.grants, func(g permitGrant) bool { return g.claim.UID == uid })
}

// gatherPermits reads, for a semaphore lock, each live permit's claim
// (confirmed live when the cache misses it, as the holder's), its pod, and
// its renewal Lease from the cache, and records when this process first
// observed each permit's current renewal signal. The lock's permit Leases
// come from the cache's index (O(permits)); act deletes those of permits
// that ended.
func (r *Reconciler) gatherPermits(ctx context.Context, lock types.NamespacedName, mem *lockMemory, g *gathered, known fifo) error {
	var list coordinationv1.LeaseList
	if err := r.client.List(ctx, &list, client.InNamespace(lock.Namespace), client.MatchingFields{indexPermitOf: lock.Name}); err != nil {
		return fmt.Errorf("listing the permit Leases of lock %s: %w", lock, err)
	}
	g.permitLeases = nil // a mutex (nearly every lock) has none: no map
	for i := range list.Items {
		if g.permitLeases == nil {
			g.permitLeases = make(map[int64]*coordinationv1.Lease, len(list.Items))
		}
		if epoch, err := fkv1.ParseEpoch(list.Items[i].Labels[fkv1.LabelPermitEpoch]); err == nil {
			g.permitLeases[epoch] = &list.Items[i]
		}
	}
	g.permits, g.permitsWatched = nil, true
	for _, p := range g.ledger.Permits {
		var err error
		if g.claims, err = r.confirmClaim(ctx, lock, p.Claim, p.UID, g.claims, known); err != nil {
			return err
		}
		st := permitState{Permit: p, claim: findClaim(g.claims, p.UID)}
		var notReadySince string
		if st.pod, notReadySince, err = r.holderPod(ctx, lock.Namespace, st.claim, true); err != nil {
			return err
		}
		watched := false
		signal, known := permitRenewal(g.permitLeases[p.Epoch], p, st.pod, notReadySince)
		st.renewSeenAt, watched = mem.observePermit(p.Epoch, signal, known, r.clock.Now())
		g.permitsWatched = g.permitsWatched && watched
		g.permits = append(g.permits, st)
	}
	mem.retainPermits(g.ledger.Permits)
	if len(g.ledger.Permits) > 0 {
		// A semaphore's holders are its permits: the lock's Lease itself
		// names none and is renewed by nobody.
		g.renewWatched = g.permitsWatched
	}
	return nil
}

// permitRenewal is the renewal signal of a permit: renewalOf its renewal
// Lease, or its pod's liveness. known is false when the permit renews a
// Lease that is not there (missing, or another claim's) or shows no
// renewTime: that is no signal at all, and never a renewal.
func permitRenewal(lease *coordinationv1.Lease, p fkv1.Permit, pod pods.Liveness, notReadySince string) (renewal, bool) {
	if lease == nil || lease.Annotations[fkv1.AnnotationClaimUID] != string(p.UID) {
		return renewal{holderUID: p.UID, pod: pod, podNotReadySince: notReadySince}, pod != pods.NotAPod
	}
	sig := renewalOf(lease, p.UID, pod, notReadySince)
	// A Lease without renewTime (re-created after it went missing) shows
	// no renewal either.
	return sig, pod != pods.NotAPod || sig.renewTime != ""
}

// indexPermitOf indexes permit renewal Leases by the lock they belong to.
const indexPermitOf = "fencekeeper.permitOf"

// permitOf is the indexPermitOf index function.
func permitOf(o client.Object) []string {
	if lockName, ok := fkv1.IsPermitLease(o.(*coordinationv1.Lease)); ok {
		return []string{lockName}
	}
	return nil
}

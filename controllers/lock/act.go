package lock

import (
	"context"
	"fmt"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// act carries out the action: at most one guarded Lease write, with the
// claim statuses healed before it and derived from its result after it.
// What it learns for later reconciles it writes into mem; a view it
// withdraws or vouches for is published at once (the webhook reads it).
func (r *Reconciler) act(ctx context.Context, lock types.NamespacedName, g gathered, a action, mem *lockMemory) (ctrl.Result, error) {
	switch a.kind {
	case actIdle:
		r.memory.publishView(lock, View{})
		mem.forget(g.hasLease)
		return ctrl.Result{}, r.syncPermitLeases(ctx, lock, g, g.ledger, metav1.MicroTime{})
	case actForeign:
		lockConflicts.Inc()
		if err := r.syncStatuses(ctx, mem, g.claims, statusInputs{foreign: g.foreign}); err != nil {
			return ctrl.Result{}, err
		}
		// That Lease is outside the cache: its removal sends no event.
		return retry(r.foreignRecheck), nil
	case actReleaseFinalizer:
		// The Lease goes: nothing is vouched for from its cached copy, and
		// no permit is live.
		r.memory.publishView(lock, View{})
		if err := r.syncPermitLeases(ctx, lock, g, fkv1.Ledger{Epoch: math.MaxInt64}, metav1.MicroTime{}); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.releaseFinalizer(ctx, g.lease)
	}

	// Heal first: the holder's and the previous holder's statuses must
	// reflect this Lease before a write makes the Lease forget them. (Queue
	// entries wait until after the grant: a burst of new waiters must not
	// delay a handoff.)
	if g.lease != nil {
		if err := r.syncStatuses(ctx, mem, endedFirst(ownersOf(g.claims, g.ledger), g.ledger), statusInputs{lease: g.lease, ledger: g.ledger, unrecorded: a.unrecorded}); err != nil {
			return ctrl.Result{}, err
		}
	}

	lease := g.lease
	// A new permit's renewal Lease starts renewed at its grant, and this
	// process records that renewTime as the permit's first renewal (as the
	// apiserver stores it: microseconds).
	grantTime := metav1.NewMicroTime(r.clock.Now().Truncate(time.Microsecond))
	if a.kind.writesLease() {
		if !r.term.leading() || !r.floor.current(g.term) {
			// This term is not certainly ours (a leader that resumed from a
			// pause past its lease), or a new one began since this
			// reconcile read its floor (the Lease informer relisted, or its
			// watch ended: perhaps an etcd restore): decide again in the
			// current term, or never.
			r.memory.publishView(lock, View{})
			return retry(time.Second), nil
		}
		if a.kind != actRepair {
			// The holder changes: the webhook must not trust the old view
			// (or a cache still showing it) once the write may have committed,
			// even if its reply is lost.
			r.memory.publishView(lock, View{})
		}
		for _, c := range a.granted() {
			if c.Spec.AcquireTimeoutSeconds == nil {
				continue
			}
			// A claim with a deadline may have been timed out by another
			// authority whose record this Lease no longer lists, while this
			// cache still shows it waiting: read it live before granting.
			ended, err := r.claimEnded(ctx, client.ObjectKeyFromObject(c), c.UID)
			if err != nil {
				return ctrl.Result{}, err
			}
			if ended {
				return ctrl.Result{RequeueAfter: raceRetry}, nil
			}
		}
		written, err := r.writeLease(ctx, lock, g, a, mem)
		switch {
		case apierrors.IsAlreadyExists(err):
			// The cache had no managed Lease: a foreign one (remembered by
			// readForeignLease, so the next reconcile reports it), or ours
			// not yet seen.
			if _, err := r.readForeignLease(ctx, lock, mem); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{RequeueAfter: raceRetry}, nil
		case apierrors.IsConflict(err):
			log.FromContext(ctx).V(1).Info("lost a race for the Lease; deciding again", "reason", err.Error())
			return ctrl.Result{RequeueAfter: raceRetry}, nil
		case err != nil:
			// Not a refusal: the write may have committed (a lost reply).
			// The view stays withdrawn until a live read settles it.
			replaced := ""
			if g.lease != nil {
				replaced = g.lease.ResourceVersion
			}
			mem.markUncertain(replaced)
			// The epoch may have been issued: never issue it again.
			mem.raiseFloor(a.epoch)
			r.memory.publishView(lock, View{}) // a repair keeps its view up to the write
			return ctrl.Result{}, fmt.Errorf("writing Lease %s: %w", lock, err)
		}
		if a.semaphore {
			r.recordPermitWrite(ctx, lock, g, a)
		}
		r.recordLeaseWrite(ctx, lock, g, a)
		lease = written
		if a.semaphore {
			r.grantedPermits(ctx, lock, a, grantTime, mem)
		} else if a.kind == actGrant {
			pod, notReadySince, err := r.holderPod(ctx, lock.Namespace, a.holder, true)
			if err != nil {
				return ctrl.Result{}, err
			}
			mem.granted(renewalOf(written, fkv1.ReadLedger(written, lock.Name).HolderUID, pod, notReadySince), r.clock.Now())
		}
	}

	in := statusInputs{lease: lease, ledger: fkv1.ReadLedger(lease, lock.Name), exhausted: a.exhausted, maxWaiters: r.maxWaiters,
		unrecorded: a.unrecorded && !a.kind.writesLease(), // a write leaves a counter its holder holds
		permitEnds: a.permitEndReasons()}
	in.queueFull = queueFull(g.claims, in.ledger, r.maxWaiters)
	if next := nextReadyWaiter(g.claims, in.ledger, g.waiterPods); next != nil && !a.exhausted && !in.queueFull[next.UID] {
		in.next = next.UID
	}
	if a.exhausted {
		epochsExhausted.Inc()
		log.FromContext(ctx).Error(nil, "the lock issued the largest epoch there is; its waiters are never granted", "epoch", a.epoch)
	}
	switch a.end {
	case holderExpired:
		in.expiredUID = string(a.endedUID)
	case holderEpochLost:
		in.epochLostUID = string(a.endedUID)
	}
	// Vouched for: every holder the view names (the mutex's holder, or a
	// semaphore's permits) was watched renewing, or was granted by this
	// write.
	grantedAll := a.kind == actGrant && len(a.permits) == len(a.grants)
	if (grantedAll || g.renewWatched) && g.caughtUp && !mem.uncertain {
		r.memory.publishView(lock, View{HeldEpoch: in.ledger.HeldEpoch(), Permits: permitEpochs(in.ledger), Floor: mem.raiseFloor(),
			deadline: g.now.Add(a.requeueAfter)})
	} else {
		// Just started (or resumed): the holder's fresh TTL here is for
		// expiry only; the webhook must read live until a renewal is seen.
		r.memory.publishView(lock, View{})
	}
	if err := r.syncStatuses(ctx, mem, endedFirst(g.claims, in.ledger), in); err != nil {
		return ctrl.Result{}, err
	}
	// The permits' renewal Leases follow the statuses: a new permit's
	// holder, told by the lock's Lease, retries a renewal Lease not there
	// yet; its claim is shown Held without waiting for it. One that could
	// not be made or removed is retried (the reconcile's error).
	if err := r.syncPermitLeases(ctx, lock, g, in.ledger, grantTime); err != nil {
		return ctrl.Result{}, err
	}
	wake := a.requeueAfter
	if a.timeoutWake > 0 && (wake == 0 || a.timeoutWake < wake) {
		wake = a.timeoutWake
	}
	return timer(wake), nil
}

// endedFirst orders the status writes so that no observer ever sees more
// Held claims for one lock than it has holders (one, or a semaphore's
// capacity), even if this process stops between two writes: every claim
// that no longer holds (but may still show Held) is written before the
// holders.
func endedFirst(claims []*fkv1.FencedLease, led fkv1.Ledger) []*fkv1.FencedLease {
	out := make([]*fkv1.FencedLease, 0, len(claims))
	var holders []*fkv1.FencedLease
	for _, c := range claims {
		_, permit := led.PermitFor(c.UID)
		if (led.Held() && c.UID == led.HolderUID) || permit {
			holders = append(holders, c)
			continue
		}
		out = append(out, c)
	}
	return append(out, holders...)
}

// writeLease makes the action's one Lease write: a Create when the lock has
// no Lease yet (AlreadyExists if someone else made it first), otherwise an
// Update carrying the resourceVersion we decided on, so a write based on a
// stale read fails with Conflict instead of overwriting a newer grant.
func (r *Reconciler) writeLease(ctx context.Context, lock types.NamespacedName, g gathered, a action, mem *lockMemory) (*coordinationv1.Lease, error) {
	desired := leaseAfter(lock, g.lease, g.ledger, a, metav1.NewMicroTime(r.clock.Now()))
	var err error
	if g.lease == nil {
		err = r.client.Create(ctx, desired)
	} else {
		if desired.UID == "" {
			// Leases allow create-on-update: without the UID precondition an
			// update of a Lease deleted meanwhile would create a ledger at
			// a stale counter.
			return nil, fmt.Errorf("updating Lease %s: no UID to guard the update with", lock)
		}
		err = r.client.Update(ctx, desired)
	}
	if err != nil {
		return nil, err
	}
	mem.raiseFloor(a.epoch)
	mem.wroteLease(leaseVersion{uid: desired.UID, rv: desired.ResourceVersion})
	mem.settle() // whatever the earlier write did, this one is known
	return desired, nil
}

// leaseAfter is the Lease as the action leaves it. It is a pure function of
// its inputs; writeLease adds the resourceVersion guard by updating the very
// object we read. Every write leaves the Lease with no owner references:
// the manager sets none, and those another writer left go (snapshot.
// dropsOwners), in whatever write comes first.
func leaseAfter(lock types.NamespacedName, current *coordinationv1.Lease, led fkv1.Ledger, a action, now metav1.MicroTime) *coordinationv1.Lease {
	var l *coordinationv1.Lease
	if current == nil {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name}}
	} else {
		l = current.DeepCopy()
	}
	after := led
	after.Epoch = a.epoch
	after.TimedOut = a.timedOut
	switch {
	case a.semaphore:
		// A semaphore's Lease names no holder: its permits are listed, and
		// each permit's holder renews a Lease of its own.
		after.Capacity, after.Permits = a.capacity, a.permits
		after.HolderClaim, after.HolderUID, after.HolderUser, after.HolderPodUID, after.PreviousUID = "", "", "", "", ""
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = nil, nil
		if len(a.grants) > 0 {
			l.Spec.AcquireTime = &now
			l.Spec.RenewTime = &now
			l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + int32(len(a.grants)))
		}
	case a.kind == actGrant:
		if led.Held() {
			after.PreviousUID = led.HolderUID
		}
		after.HolderClaim, after.HolderUID = a.holder.Name, a.holder.UID
		after.HolderUser = a.holder.Annotations[fkv1.AnnotationCreatedBy]
		after.HolderPodUID = a.holder.Annotations[fkv1.AnnotationCreatedByPodUID]
		l.Spec.HolderIdentity = ptr.To(a.holder.Spec.HolderIdentity)
		l.Spec.AcquireTime = &now
		l.Spec.RenewTime = &now
		l.Spec.LeaseDurationSeconds = ptr.To(a.leaseDuration)
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	case a.kind == actFree:
		// Released or expired with nobody waiting: keep the epoch.
		after.PreviousUID = led.HolderUID
		after.HolderClaim, after.HolderUID = "", ""
		after.HolderUser, after.HolderPodUID = "", ""
		l.Spec.HolderIdentity = nil
	case a.kind == actRepair:
		if a.holder != nil {
			// The holder stays; keep the Lease's TTL in line with its claim.
			l.Spec.LeaseDurationSeconds = ptr.To(a.leaseDuration)
		}
	}
	after.ApplyTo(l, lock.Name)
	l.OwnerReferences = nil
	if l.DeletionTimestamp == nil {
		controllerutil.AddFinalizer(l, fkv1.LeaseFinalizer)
	}
	return l
}

// recordLeaseWrite logs, counts and records Events for a successful Lease write.
func (r *Reconciler) recordLeaseWrite(ctx context.Context, lock types.NamespacedName, g gathered, a action) {
	logger := log.FromContext(ctx)
	if a.end != holderContinues {
		logger.Info("holder ended", "claim", a.endedName, "claimUID", a.endedUID, "reason", string(a.end), "epoch", g.ledger.Epoch)
		observeHoldEnded(g, a, r.clock.Now())
		switch a.end {
		case holderExpired:
			expirations.Inc()
		case holderForced:
			forcedReleases.Inc()
		case holderReleased:
			releases.Inc()
			if g.lease != nil {
				r.recorder.Eventf(g.lease, nil, corev1.EventTypeNormal, fkv1.ReasonReleased, "Release",
					"Claim %s released lock %s at epoch %d", a.endedName, lock.Name, g.ledger.Epoch)
			}
		}
	}
	if a.kind == actGrant && !a.semaphore {
		grants.Inc()
		observeAcquireWait(a.holder, r.clock.Now())
		logger.Info("granted", "claim", a.holder.Name, "holder", a.holder.Spec.HolderIdentity, "epoch", a.epoch)
	}
	if g.lease != nil && len(g.lease.OwnerReferences) > 0 {
		r.recordOwnersRemoved(ctx, g.lease)
	}
	for _, ref := range a.timedOut {
		if !g.ledger.TimedOutClaim(ref.UID) {
			acquireTimeoutsTotal.Inc()
			logger.Info("acquire timeout: a waiter left the queue without an epoch", "claim", ref.Name, "claimUID", ref.UID)
		}
	}
	if a.repaired {
		floorRepairs.Inc()
		logger.Info("repaired the Lease's epoch counter", "from", g.ledger.Epoch, "to", a.epoch, "valid", g.ledger.EpochValid)
	}
}

// releaseFinalizer lets a Lease an admin deleted go once no claim of its lock
// remains (namespace deletion relies on this). The epoch floor then survives
// only in this process's memory.
func (r *Reconciler) releaseFinalizer(ctx context.Context, lease *coordinationv1.Lease) error {
	updated := lease.DeepCopy()
	if !controllerutil.RemoveFinalizer(updated, fkv1.LeaseFinalizer) {
		return nil
	}
	if err := r.client.Update(ctx, updated); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// ownersOf are the claims the Lease names as holder or previous holder, and
// any claim whose status still says Held.
func ownersOf(claims []*fkv1.FencedLease, led fkv1.Ledger) []*fkv1.FencedLease {
	var out []*fkv1.FencedLease
	for _, c := range claims {
		_, permit := led.PermitFor(c.UID)
		if (c.UID == led.HolderUID && c.UID != "") || (c.UID == led.PreviousUID && c.UID != "") || c.Status.Phase == fkv1.PhaseHeld || permit {
			out = append(out, c)
		}
	}
	return out
}

// syncStatuses patches each claim whose derived status differs from what it
// has, guarded by the claim's resourceVersion so a stale cache cannot move a
// claim backward (for example out of the terminal Expired).
func (r *Reconciler) syncStatuses(ctx context.Context, mem *lockMemory, claims []*fkv1.FencedLease, in statusInputs) error {
	for _, c := range claims {
		if queuedAsBefore(c, in) {
			continue
		}
		want, transition := desiredStatus(c, in)
		if statusEqual(want, c.Status) {
			continue
		}
		// c may share its maps and slices with the cache (listClaims): the
		// reply is decoded into a copy of its own. The patch's base only
		// reads the shared ones, so a shallow copy serves.
		orig := *c
		*c = *c.DeepCopy()
		c.Status = want
		if err := r.client.Status().Patch(ctx, c, client.MergeFromWithOptions(&orig, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("patching status of claim %s/%s: %w", c.Namespace, c.Name, err)
		}
		mem.wroteClaim(c.UID, c.ResourceVersion)
		r.recordClaimTransition(ctx, c, in.lease, transition)
	}
	return nil
}

// createLedger creates the lock's Lease free (no holder, no epoch issued),
// the first write of a new ledger (docs/design.md §2): the grant that
// follows is a guarded update of it, whose epoch is at least the
// resourceVersion of the version it replaces. That number is at least the
// Lease's creation revision, which is above every epoch the lock ever
// issued (a create that succeeds proves every earlier Lease of the lock was
// deleted before it), and any authority can read it, not only the one
// whose create succeeded. It returns nil when the Lease was not created:
// another writer made it first (a foreign Lease, remembered, or ours not
// yet in the cache), or this term is not certainly this process's.
func (r *Reconciler) createLedger(ctx context.Context, lock types.NamespacedName, term uint64, mem *lockMemory) (*coordinationv1.Lease, error) {
	if !r.term.leading() || !r.floor.current(term) {
		return nil, nil
	}
	l := leaseAfter(lock, nil, fkv1.Ledger{}, action{kind: actRepair}, metav1.NewMicroTime(r.clock.Now()))
	switch err := r.client.Create(ctx, l); {
	case apierrors.IsAlreadyExists(err):
		_, err := r.readForeignLease(ctx, lock, mem)
		return nil, err
	case err != nil:
		// Not a refusal: the create may have committed (a lost reply).
		mem.markUncertain("")
		return nil, fmt.Errorf("creating Lease %s: %w", lock, err)
	}
	mem.wroteLease(leaseVersion{uid: l.UID, rv: l.ResourceVersion})
	mem.settle()
	return l, nil
}

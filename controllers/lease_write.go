package controllers

import (
	"context"
	"strconv"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// writeLease makes the decision's one Lease write: a Create when the lock has
// no Lease yet (AlreadyExists if someone else made it first), otherwise an
// Update carrying the resourceVersion we decided on, so a write based on a
// stale read fails with Conflict instead of overwriting a newer grant.
func (r *LockReconciler) writeLease(ctx context.Context, lock types.NamespacedName, current *coordinationv1.Lease, led ledger, d lockDecision) (*coordinationv1.Lease, error) {
	desired := leaseAfter(lock, current, led, d, metav1.NewMicroTime(r.tracker.now()))
	var err error
	if current == nil {
		err = r.Client.Create(ctx, desired)
	} else {
		err = r.Client.Update(ctx, desired)
	}
	if err != nil {
		return nil, err
	}
	r.tracker.raiseFloor(lock, d.epoch)
	return desired, nil
}

// leaseAfter is the Lease as the decision leaves it. It is a pure function of
// its inputs; writeLease adds the resourceVersion guard by updating the very
// object we read.
func leaseAfter(lock types.NamespacedName, current *coordinationv1.Lease, led ledger, d lockDecision, now metav1.MicroTime) *coordinationv1.Lease {
	var l *coordinationv1.Lease
	if current == nil {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name}}
	} else {
		l = current.DeepCopy()
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[fkv1.LabelManagedBy] = fkv1.ManagedByValue
	l.Labels[fkv1.LabelLock] = lock.Name
	if !hasFinalizer(l, fkv1.LeaseFinalizer) && l.DeletionTimestamp == nil {
		l.Finalizers = append(l.Finalizers, fkv1.LeaseFinalizer)
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[fkv1.AnnotationEpoch] = strconv.FormatInt(d.epoch, 10)

	switch {
	case d.newHolder != nil && d.newHolder.UID != led.holderUID:
		// A grant.
		if led.holderUID != "" {
			l.Annotations[fkv1.AnnotationPreviousClaimUID] = string(led.holderUID)
		}
		l.Annotations[fkv1.AnnotationClaim] = d.newHolder.Name
		l.Annotations[fkv1.AnnotationClaimUID] = string(d.newHolder.UID)
		l.Spec.HolderIdentity = ptr.To(d.newHolder.Spec.HolderIdentity)
		l.Spec.AcquireTime = &now
		l.Spec.RenewTime = &now
		l.Spec.LeaseDurationSeconds = ptr.To(d.leaseDuration)
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	case d.newHolder != nil:
		// The holder stays; keep the Lease's TTL in line with its claim.
		l.Spec.LeaseDurationSeconds = ptr.To(d.leaseDuration)
	case d.end != holderContinues:
		// Released or expired with nobody waiting: free the lock, keep the epoch.
		l.Annotations[fkv1.AnnotationPreviousClaimUID] = string(led.holderUID)
		delete(l.Annotations, fkv1.AnnotationClaim)
		delete(l.Annotations, fkv1.AnnotationClaimUID)
		l.Spec.HolderIdentity = nil
	}
	return l
}

// recordLeaseWrite logs, counts and records Events for a successful Lease write.
func (r *LockReconciler) recordLeaseWrite(ctx context.Context, lock types.NamespacedName, before *coordinationv1.Lease, led ledger, d lockDecision) {
	logger := log.FromContext(ctx)
	if d.end != holderContinues {
		logger.Info("holder ended", "claim", d.endedName, "claimUID", d.endedUID, "reason", string(d.end), "epoch", led.epoch)
		switch d.end {
		case holderExpired:
			expirations.Inc()
		case holderReleased:
			releases.Inc()
			if before != nil {
				r.Recorder.Eventf(before, nil, corev1.EventTypeNormal, fkv1.ReasonReleased, "Release",
					"Claim %s released lock %s at epoch %d", d.endedName, lock.Name, led.epoch)
			}
		}
	}
	if d.newHolder != nil && d.newHolder.UID != led.holderUID {
		grants.Inc()
		logger.Info("granted", "claim", d.newHolder.Name, "holder", d.newHolder.Spec.HolderIdentity, "epoch", d.epoch)
	} else if d.epoch != led.epoch || !led.epochValid {
		floorRepairs.Inc()
		logger.Info("repaired the Lease's epoch counter", "from", led.epoch, "to", d.epoch, "valid", led.epochValid)
	}
}

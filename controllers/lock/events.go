package lock

import (
	"context"
	"fmt"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// recordClaimTransition logs a claim's ownership transition and records it
// as an Event on the claim (renewals are not transitions).
func (r *Reconciler) recordClaimTransition(ctx context.Context, c *fkv1.FencedLease, lease *coordinationv1.Lease, transition string) {
	if transition == "" {
		return
	}
	if transition == fkv1.ReasonQueued {
		// Queueing is the Pending phase and its condition, not an Event:
		// an Event per waiter would cost a write per claim of a long queue.
		log.FromContext(ctx).V(1).Info("claim "+transition, "claim", c.Name, "holder", c.Spec.HolderIdentity)
		return
	}
	log.FromContext(ctx).Info("claim "+transition, "claim", c.Name, "holder", c.Spec.HolderIdentity,
		"epoch", c.Status.Epoch, "phase", c.Status.Phase)
	var related runtime.Object // a typed nil would not be nil here
	if lease != nil {
		related = lease
	}
	switch transition {
	case fkv1.ReasonGranted:
		if fkv1.RecordsNoIdentity(c) {
			// The authority grants no such claim (nextReadyWaiter);
			// a Lease an older manager wrote may still name one. Said at
			// the grant, not only at the holder's first refused write.
			r.recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "Grant",
				"Granted epoch %d of lock %s to %s, but this claim records no identity (it was created while the claim-identity "+
					"policy was not in effect): every write presenting the epoch will be refused (but to objects that accept it from any identity); "+
					"release it and create a new claim",
				c.Status.Epoch, c.Spec.LockName, c.Spec.HolderIdentity)
			return
		}
		r.recorder.Eventf(c, related, corev1.EventTypeNormal, transition, "Grant",
			"Granted epoch %d of lock %s to %s", c.Status.Epoch, c.Spec.LockName, c.Spec.HolderIdentity)
	case fkv1.ReasonNoIdentity:
		r.recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "Queue",
			"%s", noIdentityMessage(c.Spec.LockName))
	case fkv1.ReasonExpired:
		r.recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "Expire",
			"Lease with epoch %d on lock %s expired: no renewal observed for %ds", c.Status.Epoch, c.Spec.LockName, c.LeaseDurationSeconds())
	case fkv1.ReasonQueueFull:
		queueFullRejections.Inc()
		r.recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "Queue",
			"Turned away: lock %s already has its maximum of waiting claims", c.Spec.LockName)
	case fkv1.ReasonForcedRelease:
		by, why, _ := fkv1.BreakRequest(c)
		r.recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "ForceRelease",
			"Lock %s forcibly released by user %q at epoch %d: reason %q", c.Spec.LockName, by, c.Status.Epoch, why)
	case transitionEpochLost:
		granted := "the epoch it was granted (which no status recorded)"
		if c.Status.Epoch != 0 {
			granted = fmt.Sprintf("its epoch %d", c.Status.Epoch)
		}
		r.recorder.Eventf(c, related, corev1.EventTypeWarning, fkv1.ReasonSuperseded, "Supersede",
			"Hold of lock %s ended: the Lease's epoch counter no longer showed %s, and a holder's epoch is never changed; "+
				"the lock goes to the next waiter, if any, with a new epoch", c.Spec.LockName, granted)
	case fkv1.ReasonSuperseded:
		r.recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "Supersede",
			"Epoch %d on lock %s superseded: the Lease names another holder", c.Status.Epoch, c.Spec.LockName)
	}
}

// reasonOwnersRemoved is the Event reason for owner references the authority
// removed from a managed Lease.
const reasonOwnersRemoved = "OwnerReferencesRemoved"

// maxOwnersNote bounds the owners an Event note lists (the apiserver refuses
// a note over 1 kB; the log line names them all).
const maxOwnersNote = 800

// recordOwnersRemoved logs the owner references another writer left on
// lease, which the write just made removed, and names them in a Warning
// Event on the Lease.
func (r *Reconciler) recordOwnersRemoved(ctx context.Context, lease *coordinationv1.Lease) {
	owners := make([]string, len(lease.OwnerReferences))
	for i, o := range lease.OwnerReferences {
		owners[i] = ownerString(o)
	}
	log.FromContext(ctx).Info("removed the owner references another writer left on the Lease: only the manager sets them, and it sets none",
		"lease", lease.Name, "owners", owners)
	r.recorder.Eventf(lease, nil, corev1.EventTypeWarning, reasonOwnersRemoved, "RemoveOwners",
		"Removed owner references that another writer left on managed Lease %s (an owner decides when the garbage collector deletes the Lease; "+
			"the manager sets none): %s", lease.Name, listWithin(owners, maxOwnersNote))
}

// ownerString names an owner reference: apiVersion, kind, name and UID.
func ownerString(o metav1.OwnerReference) string {
	return fmt.Sprintf("%s %s/%s (uid %s)", o.APIVersion, o.Kind, o.Name, o.UID)
}

// listWithin joins items with ", " in at most about limit bytes, saying how
// many more were left out.
func listWithin(items []string, limit int) string {
	var b strings.Builder
	for i, it := range items {
		if i > 0 && b.Len()+len(it) > limit {
			fmt.Fprintf(&b, " and %d more", len(items)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		if len(it) > limit {
			it = it[:limit] + "..."
		}
		b.WriteString(it)
	}
	return b.String()
}

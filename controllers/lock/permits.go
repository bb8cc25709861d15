package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// granted are the claims the action grants: the mutex's new holder, or a
// semaphore's new permits.
func (a action) granted() []*fkv1.FencedLease {
	if a.semaphore {
		out := make([]*fkv1.FencedLease, len(a.grants))
		for i, g := range a.grants {
			out[i] = g.claim
		}
		return out
	}
	if a.kind == actGrant && a.holder != nil {
		return []*fkv1.FencedLease{a.holder}
	}
	return nil
}

// permitEndReasons is why each permit the action ends ended, by claim.
func (a action) permitEndReasons() map[types.UID]holderEnd {
	if len(a.permitEnds) == 0 {
		return nil
	}
	out := make(map[types.UID]holderEnd, len(a.permitEnds))
	for _, e := range a.permitEnds {
		out[e.UID] = e.end
	}
	return out
}

// permitEpochs are the epochs of a ledger's live permits, ascending.
func permitEpochs(l fkv1.Ledger) []int64 {
	if len(l.Permits) == 0 {
		return nil
	}
	out := make([]int64, len(l.Permits))
	for i, p := range l.Permits {
		out[i] = p.Epoch
	}
	return out
}

// grantedPermits records, after a semaphore's Lease write, each new
// permit's grant as its first renewal on this process's clock: the renewal
// Lease syncPermitLeases creates for it carries that renewTime.
func (r *Reconciler) grantedPermits(ctx context.Context, lock types.NamespacedName, a action, grantTime metav1.MicroTime, mem *lockMemory) {
	now := r.clock.Now()
	for _, g := range a.grants {
		pod, notReadySince, err := r.holderPod(ctx, lock.Namespace, g.claim, false)
		if err != nil {
			log.FromContext(ctx).V(1).Info("reading a new permit's pod", "claim", g.claim.Name, "error", err.Error())
		}
		signal := renewal{holderUID: g.claim.UID, pod: pod, podNotReadySince: notReadySince}
		if pod == pods.NotAPod {
			signal.renewTime = grantTime.UTC().Format(time.RFC3339Nano)
		}
		mem.grantedPermit(g.epoch, signal, now)
	}
}

// syncPermitLeases keeps one renewal Lease per live permit of led: it
// creates those missing (a new permit's, right after the grant; one a
// crash or an admin left missing, with no renewTime, so that its creation
// is no renewal) and deletes those of permits that ended (epochs at or
// below the counter that led no longer lists: a higher one may be a grant
// this cache has not shown yet). A permit whose Lease cannot be created (a
// foreign Lease of that name) is not renewed and expires.
func (r *Reconciler) syncPermitLeases(ctx context.Context, lock types.NamespacedName, g gathered, led fkv1.Ledger, grantTime metav1.MicroTime) error {
	var errs []error
	live := map[int64]bool{}
	for _, p := range led.Permits {
		live[p.Epoch] = true
		if have := g.permitLeases[p.Epoch]; have != nil && have.Annotations[fkv1.AnnotationClaimUID] == string(p.UID) {
			continue
		}
		fresh := !g.ledger.Exists || !hasPermit(g.ledger, p.Epoch)
		if err := r.client.Create(ctx, permitLease(lock, p, grantTime, fresh)); err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, fmt.Errorf("creating the renewal Lease of permit %d of lock %s: %w", p.Epoch, lock, err))
		} else if apierrors.IsAlreadyExists(err) {
			log.FromContext(ctx).V(1).Info("a permit's renewal Lease exists and is not this permit's; it expires unless its holder is a pod", "epoch", p.Epoch)
		}
	}
	for epoch, l := range g.permitLeases {
		if live[epoch] || epoch > led.Epoch {
			continue
		}
		err := r.client.Delete(ctx, l, client.Preconditions{UID: &l.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("deleting the renewal Lease of ended permit %d of lock %s: %w", epoch, lock, err))
		}
	}
	return errors.Join(errs...)
}

func hasPermit(l fkv1.Ledger, epoch int64) bool {
	_, ok := l.PermitOf(epoch)
	return ok
}

// permitLease is the renewal Lease of permit p: guarded like a lock's
// Lease (only the holder's bound identity advances its renewTime), and
// labelled so the lock's reconciles find it. fresh: a permit granted by
// this write, whose grant is its first renewal (renewTime set).
func permitLease(lock types.NamespacedName, p fkv1.Permit, grantTime metav1.MicroTime, fresh bool) *coordinationv1.Lease {
	epoch := fkv1.FormatEpoch(p.Epoch)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: fkv1.PermitLeaseName(lock.Name, p.Epoch),
			Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock.Name, fkv1.LabelPermitEpoch: epoch},
			Annotations: map[string]string{fkv1.AnnotationEpoch: epoch, fkv1.AnnotationClaim: p.Claim, fkv1.AnnotationClaimUID: string(p.UID)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(p.Holder), LeaseDurationSeconds: ptr.To(p.TTL), AcquireTime: &grantTime},
	}
	if p.User != "" {
		l.Annotations[fkv1.AnnotationHolderUser] = p.User
	}
	if p.PodUID != "" {
		l.Annotations[fkv1.AnnotationHolderPodUID] = p.PodUID
	}
	if fresh {
		l.Spec.RenewTime = &grantTime
	}
	return l
}

// recordPermitWrite logs, counts and records Events for a semaphore's
// successful Lease write: each permit ended and granted.
func (r *Reconciler) recordPermitWrite(ctx context.Context, lock types.NamespacedName, g gathered, a action) {
	logger := log.FromContext(ctx)
	now := r.clock.Now()
	for _, e := range a.permitEnds {
		logger.Info("permit ended", "claim", e.Claim, "claimUID", e.UID, "reason", string(e.end), "epoch", e.Epoch)
		if c := findClaim(g.claims, e.UID); c != nil && c.Status.AcquireTime != nil {
			if label := holdEndedLabel(e.end); label != "" {
				holdDuration.WithLabelValues(label).Observe(max(now.Sub(c.Status.AcquireTime.Time), 0).Seconds())
			}
		}
		switch e.end {
		case holderExpired:
			expirations.Inc()
		case holderForced:
			forcedReleases.Inc()
		case holderReleased:
			releases.Inc()
			if g.lease != nil {
				r.recorder.Eventf(g.lease, nil, corev1.EventTypeNormal, fkv1.ReasonReleased, "Release",
					"Claim %s released its permit of lock %s at epoch %d", e.Claim, lock.Name, e.Epoch)
			}
		}
	}
	for _, gr := range a.grants {
		grants.Inc()
		observeAcquireWait(gr.claim, now)
		logger.Info("granted a permit", "claim", gr.claim.Name, "holder", gr.claim.Spec.HolderIdentity, "epoch", gr.epoch, "maxHolders", a.capacity)
	}
}

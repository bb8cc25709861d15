package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// DefaultConflictRecheck is how often a lock blocked by an unmanaged Lease is
// looked at again (that Lease is outside the informer cache, so its removal
// sends no event).
const DefaultConflictRecheck = 30 * time.Second

// conflictRetry is how soon a reconcile whose guarded Lease write lost a race
// runs again; the winner's write also arrives as a watch event.
const conflictRetry = 50 * time.Millisecond

// LockReconciler is the lease authority for every lock: one reconcile per
// lock (namespace + spec.lockName).
type LockReconciler struct {
	// Client reads from the informer cache and writes to the apiserver.
	Client client.Client
	// APIReader reads live, for the rare paths: a holder claim missing from the
	// cache, and a Lease that is not in the (managed-only) Lease cache.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Clock is the monotonic clock expiry is measured on (injectable for tests).
	Clock clock.PassiveClock
	// ConflictRecheck defaults to DefaultConflictRecheck.
	ConflictRecheck time.Duration

	tracker *renewalTracker
	expect  *writeExpectations
	// conflicts remembers locks blocked by an unmanaged Lease (a sync.Map of
	// types.NamespacedName), so their re-checks read live.
	conflicts sync.Map
}

// +kubebuilder:rbac:groups=fencekeeper.io,resources=fencedleases,verbs=get;list;watch
// +kubebuilder:rbac:groups=fencekeeper.io,resources=fencedleases/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Reconcile brings one lock's Lease and claims in line: heal claim statuses
// from the Lease, make at most one guarded Lease write (grant, release,
// expiry or repair), then derive the claim statuses from the result.
func (r *LockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := req.NamespacedName
	logger := log.FromContext(ctx).WithValues("lock", lock.String())
	ctx = log.IntoContext(ctx, logger)

	claims, err := r.listClaims(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	lease, conflict, err := r.getLease(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	if conflict != "" {
		return r.reconcileConflict(ctx, claims, conflict)
	}
	if len(claims) == 0 && lease != nil && lease.DeletionTimestamp != nil {
		return ctrl.Result{}, r.releaseFinalizer(ctx, lease)
	}
	if len(claims) == 0 && (lease == nil || lease.Annotations[fkv1.AnnotationClaimUID] == "") {
		// An idle lock: nothing to grant, nothing to repair until a claim comes.
		return ctrl.Result{}, nil
	}

	if r.cacheBehindOwnWrites(lease, claims) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}

	led := readLedger(lease, lock.Name)
	if claims, err = r.confirmHolder(ctx, lock, led, claims); err != nil {
		return ctrl.Result{}, err
	}

	// Heal first: the holder's and the previous holder's statuses must
	// reflect this Lease before a write makes the Lease forget them. (Queue
	// entries wait until after the grant: a burst of new waiters must not
	// delay a handoff.)
	if lease != nil {
		if err := r.syncStatuses(ctx, ownersOf(claims, led), statusInputs{lease: lease, ledger: led}); err != nil {
			return ctrl.Result{}, err
		}
	}

	snap, err := r.snapshot(ctx, lock, lease, led, claims)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decide(snap)
	if d.writeLease {
		written, err := r.writeLease(ctx, lock, lease, led, d)
		if apierrors.IsAlreadyExists(err) {
			// The cache had no managed Lease: someone else's, or ours not yet seen.
			if conflict, cerr := r.unmanagedLease(ctx, lock); cerr != nil || conflict != "" {
				if cerr != nil {
					return ctrl.Result{}, cerr
				}
				return r.reconcileConflict(ctx, claims, conflict)
			}
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			logger.V(1).Info("lost a race for the Lease; deciding again", "reason", err.Error())
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("writing Lease %s: %w", lock, err)
		}
		r.recordLeaseWrite(ctx, lock, lease, led, d)
		r.expect.wrote(written.UID, written.ResourceVersion)
		lease = written
	}

	in := statusInputs{lease: lease, ledger: readLedger(lease, lock.Name)}
	if d.end == holderExpired {
		in.expiredUID = string(d.endedUID)
	}
	if err := r.syncStatuses(ctx, claims, in); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: d.requeueAfter}, nil
}

// cacheBehindOwnWrites reports whether the cache has not yet seen a write
// this process made to the Lease or a claim.
func (r *LockReconciler) cacheBehindOwnWrites(lease *coordinationv1.Lease, claims []*fkv1.FencedLease) bool {
	if lease != nil && r.expect.stale(lease.UID, lease.ResourceVersion) {
		return true
	}
	for _, c := range claims {
		if r.expect.stale(c.UID, c.ResourceVersion) {
			return true
		}
	}
	return false
}

func (r *LockReconciler) listClaims(ctx context.Context, lock types.NamespacedName) ([]*fkv1.FencedLease, error) {
	var list fkv1.FencedLeaseList
	if err := r.Client.List(ctx, &list, client.InNamespace(lock.Namespace),
		client.MatchingFields{IndexLockName: lock.Name}); err != nil {
		return nil, fmt.Errorf("listing claims of lock %s: %w", lock, err)
	}
	claims := make([]*fkv1.FencedLease, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			claims = append(claims, &list.Items[i])
		}
	}
	return claims, nil
}

// getLease returns the lock's managed Lease from the cache (which holds
// managed Leases only), or nil. A same-named Lease fencekeeper does not
// manage is found when creating ours fails (see unmanagedLease), so a new
// lock costs no extra read.
func (r *LockReconciler) getLease(ctx context.Context, lock types.NamespacedName) (*coordinationv1.Lease, string, error) {
	var lease coordinationv1.Lease
	err := r.Client.Get(ctx, lock, &lease)
	if err == nil {
		return &lease, "", nil
	}
	if apierrors.IsNotFound(err) {
		if _, known := r.conflicts.Load(lock); known {
			// Known blocked: check live whether the foreign Lease is gone.
			c, err := r.unmanagedLease(ctx, lock)
			if err != nil || c != "" {
				return nil, c, err
			}
		}
		return nil, "", nil
	}
	return nil, "", err
}

// unmanagedLease reads the lock's Lease live and explains the conflict when
// it exists without fencekeeper's label ("" otherwise).
func (r *LockReconciler) unmanagedLease(ctx context.Context, lock types.NamespacedName) (string, error) {
	var lease coordinationv1.Lease
	if err := r.APIReader.Get(ctx, lock, &lease); err != nil {
		if apierrors.IsNotFound(err) {
			r.conflicts.Delete(lock)
			return "", nil
		}
		return "", err
	}
	if isManaged(&lease) {
		r.conflicts.Delete(lock)
		return "", nil
	}
	r.conflicts.Store(lock, true)
	return fmt.Sprintf("Lease %s exists and is not managed by fencekeeper (no label %s=%s); "+
		"fencekeeper will not overwrite it: delete it or use another lock name",
		lock, fkv1.LabelManagedBy, fkv1.ManagedByValue), nil
}

// ownersOf are the claims the Lease names as holder or previous holder, and
// any claim whose status still says Held.
func ownersOf(claims []*fkv1.FencedLease, led ledger) []*fkv1.FencedLease {
	var out []*fkv1.FencedLease
	for _, c := range claims {
		if (c.UID == led.holderUID && c.UID != "") || (c.UID == led.previousUID && c.UID != "") || c.Status.Phase == fkv1.PhaseHeld {
			out = append(out, c)
		}
	}
	return out
}

// confirmHolder makes sure a holder missing from the claim cache is really
// gone (a live read) before it is treated as released: the cache may simply
// not have seen a claim another controller just granted.
func (r *LockReconciler) confirmHolder(ctx context.Context, lock types.NamespacedName, led ledger, claims []*fkv1.FencedLease) ([]*fkv1.FencedLease, error) {
	if led.holderUID == "" || findClaim(claims, led.holderUID) != nil || led.holderName == "" {
		return claims, nil
	}
	var c fkv1.FencedLease
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: led.holderName}, &c)
	switch {
	case apierrors.IsNotFound(err):
		return claims, nil
	case err != nil:
		return nil, fmt.Errorf("confirming holder claim %s/%s: %w", lock.Namespace, led.holderName, err)
	case c.UID == led.holderUID && c.DeletionTimestamp == nil && c.Spec.LockName == lock.Name:
		return append(claims, &c), nil
	}
	return claims, nil
}

func (r *LockReconciler) snapshot(ctx context.Context, lock types.NamespacedName, lease *coordinationv1.Lease, led ledger, claims []*fkv1.FencedLease) (lockSnapshot, error) {
	s := lockSnapshot{ledger: led, claims: claims, now: r.tracker.now()}
	if lease != nil {
		token := ""
		if lease.Spec.RenewTime != nil {
			token = lease.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
		}
		// A pod-held lease is renewed by the pod being live, not by writes.
		var ref *metav1.OwnerReference
		live := podLive
		holder := findClaim(claims, led.holderUID)
		if holder != nil {
			ref = podOwnerRef(holder)
		}
		if ref != nil {
			var err error
			if live, err = r.podLiveness(ctx, lock.Namespace, ref); err != nil {
				return s, err
			}
			token = fmt.Sprintf("pod:%d", live)
			if live == podGone {
				// Released at once: decide as if the claim were gone.
				s.claims = withoutClaim(claims, holder.UID)
			}
		}
		s.renewSeenAt = r.tracker.observe(lock, led.holderUID, token)
		if ref != nil && live == podLive {
			s.renewSeenAt = s.now
		}
		if lease.Spec.LeaseDurationSeconds != nil {
			s.leaseDurationOnLease = *lease.Spec.LeaseDurationSeconds
		}
		r.tracker.raiseFloor(lock, led.epoch)
	}
	for _, c := range claims {
		r.tracker.raiseFloor(lock, c.Status.Epoch)
	}
	s.floor = r.tracker.floor(lock)
	return s, nil
}

// podLiveness reads the holder's pod from the (stripped) pod cache.
func (r *LockReconciler) podLiveness(ctx context.Context, ns string, ref *metav1.OwnerReference) (podLiveness, error) {
	var pod corev1.Pod
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &pod)
	if apierrors.IsNotFound(err) {
		return podGone, nil
	}
	if err != nil {
		return podNotLive, err
	}
	return livenessOf(&pod, string(ref.UID)), nil
}

func withoutClaim(claims []*fkv1.FencedLease, uid types.UID) []*fkv1.FencedLease {
	out := make([]*fkv1.FencedLease, 0, len(claims))
	for _, c := range claims {
		if c.UID != uid {
			out = append(out, c)
		}
	}
	return out
}

// syncStatuses patches each claim whose derived status differs from what it
// has, guarded by the claim's resourceVersion so a stale cache cannot move a
// claim backward (for example out of the terminal Expired).
func (r *LockReconciler) syncStatuses(ctx context.Context, claims []*fkv1.FencedLease, in statusInputs) error {
	for _, c := range claims {
		want, transition := desiredStatus(c, in)
		if equality.Semantic.DeepEqual(want, c.Status) {
			continue
		}
		orig := c.DeepCopy()
		c.Status = want
		if err := r.Client.Status().Patch(ctx, c, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("patching status of claim %s/%s: %w", c.Namespace, c.Name, err)
		}
		r.expect.wrote(c.UID, c.ResourceVersion)
		r.recordClaimTransition(ctx, c, in.lease, transition)
	}
	return nil
}

func (r *LockReconciler) reconcileConflict(ctx context.Context, claims []*fkv1.FencedLease, conflict string) (ctrl.Result, error) {
	lockConflicts.Inc()
	if err := r.syncStatuses(ctx, claims, statusInputs{conflict: conflict}); err != nil {
		return ctrl.Result{}, err
	}
	recheck := r.ConflictRecheck
	if recheck <= 0 {
		recheck = DefaultConflictRecheck
	}
	return ctrl.Result{RequeueAfter: recheck}, nil
}

// releaseFinalizer lets a Lease an admin deleted go once no claim of its lock
// remains (namespace deletion relies on this). The epoch floor then survives
// only in this process's memory.
func (r *LockReconciler) releaseFinalizer(ctx context.Context, lease *coordinationv1.Lease) error {
	if !hasFinalizer(lease, fkv1.LeaseFinalizer) {
		return nil
	}
	updated := lease.DeepCopy()
	updated.Finalizers = removeString(updated.Finalizers, fkv1.LeaseFinalizer)
	if err := r.Client.Update(ctx, updated); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

func (r *LockReconciler) recordClaimTransition(ctx context.Context, c *fkv1.FencedLease, lease *coordinationv1.Lease, transition string) {
	if transition == "" {
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
		r.Recorder.Eventf(c, related, corev1.EventTypeNormal, transition, "Grant",
			"Granted epoch %d of lock %s to %s", c.Status.Epoch, c.Spec.LockName, c.Spec.HolderIdentity)
	case fkv1.ReasonQueued:
		r.Recorder.Eventf(c, related, corev1.EventTypeNormal, transition, "Queue",
			"Queued for lock %s", c.Spec.LockName)
	case fkv1.ReasonExpired:
		r.Recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "Expire",
			"Lease with epoch %d on lock %s expired: no renewal observed for %ds", c.Status.Epoch, c.Spec.LockName, c.LeaseDurationSeconds())
	case fkv1.ReasonSuperseded:
		r.Recorder.Eventf(c, related, corev1.EventTypeWarning, transition, "Supersede",
			"Epoch %d on lock %s superseded: the Lease names another holder", c.Status.Epoch, c.Spec.LockName)
	}
}

func removeString(list []string, s string) []string {
	out := list[:0]
	for _, x := range list {
		if x != s {
			out = append(out, x)
		}
	}
	return out
}

package claimcleanup

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Reconciler deletes each Expired claim After its end.
type Reconciler struct {
	client client.Client
	after  time.Duration
	clock  clock.PassiveClock
}

// NewReconciler returns the clean-up of Expired claims, after ended.
func NewReconciler(c client.Client, after time.Duration, clk clock.PassiveClock) *Reconciler {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Reconciler{client: c, after: after, clock: clk}
}

// +kubebuilder:rbac:groups=fencekeeper.io,resources=fencedleases,verbs=get;list;watch;delete

// Reconcile deletes the claim once it has been Expired for r.after, with
// UID and resourceVersion preconditions: a claim re-created under the same
// name, or changed since it was read, is never the one deleted.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var c fkv1.FencedLease
	if err := r.client.Get(ctx, req.NamespacedName, &c); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	due, ok := DeleteAt(&c, r.after)
	if !ok {
		return ctrl.Result{}, nil
	}
	if wait := due.Sub(r.clock.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	err := r.client.Delete(ctx, &c, client.Preconditions{UID: &c.UID, ResourceVersion: &c.ResourceVersion})
	switch {
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, nil
	case apierrors.IsConflict(err):
		// Changed since the cache showed it: its update event comes next.
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, err
	}
	deleted.Inc()
	log.FromContext(ctx).V(1).Info("deleted an expired claim", "claim", req.String(), "lock", c.Spec.LockName, "epoch", c.Status.Epoch)
	return ctrl.Result{}, nil
}

// DeleteAt is when claim c may be deleted, and whether it ever may: only
// Expired claims not owned by a Pod, after their end. The end is when the
// Held condition turned False; a claim without one (written by an older
// manager) counts from its creation.
func DeleteAt(c *fkv1.FencedLease, after time.Duration) (time.Time, bool) {
	if c.Status.Phase != fkv1.PhaseExpired || c.DeletionTimestamp != nil || ownedByPod(c) {
		return time.Time{}, false
	}
	ended := c.CreationTimestamp.Time
	if held := meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld); held != nil &&
		held.Status == metav1.ConditionFalse && held.LastTransitionTime.After(ended) {
		ended = held.LastTransitionTime.Time
	}
	return ended.Add(after), true
}

func ownedByPod(c *fkv1.FencedLease) bool {
	ref := metav1.GetControllerOf(c)
	return ref != nil && ref.Kind == "Pod" && ref.APIVersion == "v1"
}

// SetupWithManager registers the clean-up; it watches Expired claims only.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	expired := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.(*fkv1.FencedLease).Status.Phase == fkv1.PhaseExpired
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("expired-claim-cleanup").
		For(&fkv1.FencedLease{}, builder.WithPredicates(expired)).
		WithOptions(opts).
		Complete(r)
}

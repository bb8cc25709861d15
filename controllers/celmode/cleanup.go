package celmode

import (
	"context"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// cleanupRequest is the one key every CEL-mode object maps to: each
// reconcile removes them all.
var cleanupRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "cel-mode-objects"}}

// CleanupReconciler deletes the CEL-mode objects it is told of.
type CleanupReconciler struct {
	client client.Client
}

// NewCleanupReconciler returns the cleanup reconciler.
func NewCleanupReconciler(c client.Client) *CleanupReconciler {
	return &CleanupReconciler{client: c}
}

// Reconcile deletes every CEL-mode policy and binding.
func (r *CleanupReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	n, err := celmode.Uninstall(ctx, r.client)
	if n > 0 {
		ctrl.LoggerFrom(ctx).Info("removed the CEL-mode admission policies and bindings: this manager runs in webhook mode", "deleted", n)
	}
	return ctrl.Result{}, err
}

// SetupWithManager registers the reconciler.
func (r *CleanupReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	owned := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if !celmode.Owned(o) {
			return nil
		}
		return []reconcile.Request{cleanupRequest}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("celcleanup").
		WithOptions(opts).
		Watches(&admissionregistrationv1.MutatingAdmissionPolicy{}, owned).
		Watches(&admissionregistrationv1.MutatingAdmissionPolicyBinding{}, owned).
		Watches(&admissionregistrationv1.ValidatingAdmissionPolicy{}, owned).
		Watches(&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, owned).
		Complete(r)
}

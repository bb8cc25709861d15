// Package celcleanup removes, in webhook mode, the admission policies and
// bindings the CEL enforcement mode applied (webhook/celmode), which a
// switch from CEL mode to webhook mode leaves behind (the manager applied
// them, not Helm). Left in place, the mutating policy would consume each
// fenced write's token before the webhook sees it, and the webhook would
// refuse every such write as presenting none.
//
// It watches the four admission-policy kinds (the manager's cache holds
// only fencekeeper's) and deletes what celmode.Owned names, whenever one
// appears: a CEL-mode replica still running during the rollout may apply
// them again until it stops.
package celcleanup

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

// request is the one key every CEL-mode object maps to: each reconcile
// removes them all.
var request = reconcile.Request{NamespacedName: types.NamespacedName{Name: "cel-mode-objects"}}

// Reconciler deletes the CEL-mode objects it is told of.
type Reconciler struct {
	client client.Client
}

// NewReconciler returns the cleanup reconciler.
func NewReconciler(c client.Client) *Reconciler { return &Reconciler{client: c} }

// Reconcile deletes every CEL-mode policy and binding.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	n, err := celmode.Uninstall(ctx, r.client)
	if n > 0 {
		ctrl.LoggerFrom(ctx).Info("removed the CEL-mode admission policies and bindings: this manager runs in webhook mode", "deleted", n)
	}
	return ctrl.Result{}, err
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	owned := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if !celmode.Owned(o) {
			return nil
		}
		return []reconcile.Request{request}
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

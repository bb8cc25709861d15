package celmode

import (
	"context"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// policiesRequest is the one key every policy maps to: each reconcile
// applies them all.
var policiesRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "cel-mode-policies"}}

// PoliciesReconciler applies the CEL-mode policies.
type PoliciesReconciler struct {
	client   client.Client
	policies celmode.Policies
}

// NewPoliciesReconciler returns the reconciler for the rendered policies.
func NewPoliciesReconciler(c client.Client, p celmode.Policies) *PoliciesReconciler {
	return &PoliciesReconciler{client: c, policies: p}
}

// Reconcile applies every policy (a no-op write-free pass when they are as
// rendered); a failure is retried with the controller's backoff.
func (r *PoliciesReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	if err := celmode.Install(ctx, r.client, r.policies); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// SetupWithManager watches the policies and the base binding by name, and
// applies them once at start (nothing may exist to send an event).
func (r *PoliciesReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	names := map[string]bool{}
	for _, o := range r.policies.Objects() {
		names[o.GetName()] = true
	}
	ours := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if !names[o.GetName()] {
			return nil
		}
		return []reconcile.Request{policiesRequest}
	})
	start := make(chan event.GenericEvent, 1)
	start <- event.GenericEvent{Object: &admissionregistrationv1.ValidatingAdmissionPolicy{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("celpolicies").
		WithOptions(opts).
		Watches(&admissionregistrationv1.ValidatingAdmissionPolicy{}, ours).
		Watches(&admissionregistrationv1.MutatingAdmissionPolicy{}, ours).
		Watches(&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, ours).
		WatchesRawSource(source.Channel(start, handler.EnqueueRequestsFromMapFunc(
			func(context.Context, client.Object) []reconcile.Request { return []reconcile.Request{policiesRequest} }))).
		Complete(r)
}

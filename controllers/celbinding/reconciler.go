// Package celbinding keeps the CEL enforcement mode's per-lock admission
// policy bindings in line with the locks that exist (docs/design.md §3,
// webhook/celmode): a lock name gets its MutatingAdmissionPolicyBinding and
// its two ValidatingAdmissionPolicyBindings (fencing and lease-required) as
// soon as a claim or a managed Lease names it, and loses them when neither
// does anywhere in the cluster.
//
// The validating bindings are created first and the mutating one only once
// they are in force on every apiserver (celmode.LoadDelay), and
// removed in the opposite order: a mutating binding alone would consume
// tokens that nothing checks. Until both are in force, presented epochs of
// the lock are refused (nothing consumes them), so a new lock name's first
// writes wait a few seconds.
package celbinding

import (
	"context"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingadmissionpolicies;validatingadmissionpolicies;mutatingadmissionpolicybindings;validatingadmissionpolicybindings,verbs=get;list;watch;create;update;patch;delete

// Reconciler reconciles one lock name (the request's Name; no namespace).
type Reconciler struct {
	client client.Client
}

// NewReconciler returns the binding reconciler.
func NewReconciler(c client.Client) *Reconciler { return &Reconciler{client: c} }

// Reconcile creates or repairs the lock's bindings while a claim or a
// managed Lease names it, and removes them otherwise.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	lock := req.Name
	needed, err := r.needed(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	var wait time.Duration
	if needed {
		wait, err = celmode.EnsureBindings(ctx, r.client, lock, time.Now())
	} else {
		wait, err = celmode.RemoveBindings(ctx, r.client, lock)
	}
	return ctrl.Result{RequeueAfter: wait}, err
}

func (r *Reconciler) needed(ctx context.Context, lock string) (bool, error) {
	var leases coordinationv1.LeaseList
	if err := r.client.List(ctx, &leases, client.MatchingLabels{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock}, client.Limit(1)); err != nil {
		return false, fmt.Errorf("listing Leases of lock %s: %w", lock, err)
	}
	if len(leases.Items) > 0 {
		return true, nil
	}
	var claims fkv1.FencedLeaseList
	if err := r.client.List(ctx, &claims, client.MatchingFields{fkv1.IndexLockName: lock}); err != nil {
		return false, fmt.Errorf("listing claims of lock %s: %w", lock, err)
	}
	return len(claims.Items) > 0, nil
}

// SetupWithManager watches claims, managed Leases and the bindings
// themselves (a binding someone deleted or edited is put back). The claim
// index (fkv1.IndexLockName) is registered by the lock authority.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	byLock := func(lock func(client.Object) string) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if l := lock(o); l != "" {
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: l}}}
			}
			return nil
		})
	}
	leaseLock := func(o client.Object) string {
		if o.GetLabels()[fkv1.LabelManagedBy] != fkv1.ManagedByValue {
			return ""
		}
		return o.GetLabels()[fkv1.LabelLock]
	}
	claimLock := func(o client.Object) string { return o.(*fkv1.FencedLease).Spec.LockName }
	onlyCreateDelete := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return false }}
	return ctrl.NewControllerManagedBy(mgr).
		Named("celbinding").
		WithOptions(opts).
		Watches(&fkv1.FencedLease{}, byLock(claimLock), builder.WithPredicates(onlyCreateDelete)).
		Watches(&coordinationv1.Lease{}, byLock(leaseLock), builder.WithPredicates(onlyCreateDelete)).
		Watches(&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, byLock(celmode.LockOf)).
		Watches(&admissionregistrationv1.MutatingAdmissionPolicyBinding{}, byLock(celmode.LockOf)).
		Complete(r)
}

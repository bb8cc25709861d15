package controllers

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// IndexLockName indexes FencedLeases by spec.lockName.
const IndexLockName = "spec.lockName"

// CacheOptions restricts the Lease informer to Leases fencekeeper manages, so
// node heartbeat and leader-election Leases never enter the cache.
//
// Pods are cached stripped to what the pod-lease decisions need (see
// stripPod): a few hundred bytes per pod.
func CacheOptions() cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Label: labels.SelectorFromSet(labels.Set{fkv1.LabelManagedBy: fkv1.ManagedByValue})},
		&corev1.Pod{}:           {Transform: stripPod},
	}}
}

// asksForLease selects pods that carry (or, on update, carried) the lease annotation.
var asksForLease = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return hasLeaseAnnotation(e.Object) },
	DeleteFunc: func(e event.DeleteEvent) bool { return hasLeaseAnnotation(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return hasLeaseAnnotation(e.ObjectOld) || hasLeaseAnnotation(e.ObjectNew)
	},
	GenericFunc: func(e event.GenericEvent) bool { return hasLeaseAnnotation(e.Object) },
}

func hasLeaseAnnotation(o client.Object) bool { return o.GetAnnotations()[fkv1.AnnotationLease] != "" }

// SetupWithManager registers the pod-lease controller.
func (r *PodLeaseReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &fkv1.FencedLease{}, IndexPodOwner, func(o client.Object) []string {
		if name := podOwner(o.(*fkv1.FencedLease)); name != "" {
			return []string{name}
		}
		return nil
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("podlease").
		For(&corev1.Pod{}, builder.WithPredicates(asksForLease)).
		Owns(&fkv1.FencedLease{}).
		WithOptions(opts).
		Complete(r)
}

// SetupWithManager registers the claim index and the lock controller.
func (r *LockReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	r.tracker = newRenewalTracker(r.Clock)
	r.expect = newWriteExpectations()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &fkv1.FencedLease{}, IndexLockName, func(o client.Object) []string {
		return []string{o.(*fkv1.FencedLease).Spec.LockName}
	}); err != nil {
		return err
	}
	managed := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[fkv1.LabelManagedBy] == fkv1.ManagedByValue
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("lock").
		Watches(&fkv1.FencedLease{}, handler.EnqueueRequestsFromMapFunc(claimToLock)).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(leaseToLock), builder.WithPredicates(managed)).
		// A pod's readiness is the renewal of its lease.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToLock), builder.WithPredicates(asksForLease)).
		WithOptions(opts).
		Complete(r)
}

func claimToLock(_ context.Context, o client.Object) []reconcile.Request {
	c := o.(*fkv1.FencedLease)
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.LockName}}}
}

func leaseToLock(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}}
}

func podToLock(_ context.Context, o client.Object) []reconcile.Request {
	lock := o.GetAnnotations()[fkv1.AnnotationLease]
	if lock == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: lock}}}
}

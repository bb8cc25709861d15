package celmode

import (
	"context"
	"fmt"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/clock"
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
// The proofs: the apiserver instances, from the kubernetes Service's
// EndpointSlices, and a dry-run ConfigMap create sent to each (RBAC cannot
// tell a dry run from a write; the manager may already write admission
// policies, which is more).
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=create

// Retry delays while a proof is pending: first, then doubling up to the cap.
const (
	retryFirst = 200 * time.Millisecond
	retryCap   = 5 * time.Second
	// pendingReport: a proof pending longer than this is logged as an
	// error (shorter ones at V(1): the first tries normally fail while the
	// apiservers load the binding).
	pendingReport = 15 * time.Second
)

// BindingReconciler reconciles one lock name (the request's Name; no
// namespace).
type BindingReconciler struct {
	client client.Client
	live   client.Reader
	prover celmode.Prover
	// clock measures how long a proof has been pending, for the log and
	// nothing else: no binding step waits for a time.
	clock clock.PassiveClock

	mu      sync.Mutex
	pending map[string]pendingProof
}

type pendingProof struct {
	since time.Time
	tries int
}

// Option configures the BindingReconciler.
type Option func(*BindingReconciler)

// WithClock sets the clock (default: the real one).
func WithClock(c clock.PassiveClock) Option { return func(r *BindingReconciler) { r.clock = c } }

// WithProver sets the Prover (default: celmode.NewProver on the manager's
// rest.Config and API reader, set up in SetupWithManager).
func WithProver(p celmode.Prover) Option { return func(r *BindingReconciler) { r.prover = p } }

// NewBindingReconciler returns the binding reconciler.
func NewBindingReconciler(c client.Client, opts ...Option) *BindingReconciler {
	r := &BindingReconciler{client: c, clock: clock.RealClock{}, pending: map[string]pendingProof{}}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Reconcile creates or repairs the lock's bindings while a claim or a
// managed Lease names it, and removes them otherwise. A step waiting for
// proof is retried with RequeueAfter.
func (r *BindingReconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	lock := req.Name
	needed, err := r.needed(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	if needed {
		err = celmode.EnsureBindings(ctx, r.client, r.prover, lock)
	} else {
		err = celmode.RemoveBindings(ctx, r.client, r.live, r.prover, lock)
	}
	if celmode.IsPending(err) {
		return ctrl.Result{RequeueAfter: r.retry(ctx, lock, err)}, nil
	}
	r.mu.Lock()
	delete(r.pending, lock)
	r.mu.Unlock()
	return ctrl.Result{}, err
}

// retry records another pending try for lock and returns the delay.
func (r *BindingReconciler) retry(ctx context.Context, lock string, err error) time.Duration {
	now := r.clock.Now()
	r.mu.Lock()
	p, ok := r.pending[lock]
	if !ok {
		p.since = now
	}
	p.tries++
	r.pending[lock] = p
	r.mu.Unlock()
	delay := retryFirst << min(p.tries-1, 5)
	delay = min(delay, retryCap)
	log := ctrl.LoggerFrom(ctx)
	if waited := now.Sub(p.since); waited >= pendingReport {
		log.Error(err, "a binding step of the lock still waits for proof (a new lock: its presented epochs are refused meanwhile)", "lock", lock, "pendingFor", waited.Round(time.Second), "tries", p.tries)
	} else {
		log.V(1).Info("lock binding waits for proof", "lock", lock, "tries", p.tries, "reason", err.Error())
	}
	return delay
}

func (r *BindingReconciler) needed(ctx context.Context, lock string) (bool, error) {
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
func (r *BindingReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	r.live = mgr.GetAPIReader()
	if r.prover == nil {
		r.prover = celmode.NewProver(mgr.GetConfig(), r.live)
	}
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

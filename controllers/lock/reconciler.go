package lock

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// DefaultForeignLeaseRecheck is how often a lock blocked by a Lease
// fencekeeper does not manage is looked at again.
const DefaultForeignLeaseRecheck = 30 * time.Second

// raceRetry is how soon a reconcile that lost a resourceVersion race (or
// found the cache behind its own write) runs again; the winner's write also
// arrives as a watch event.
const raceRetry = 50 * time.Millisecond

// IndexLockName indexes FencedLeases by spec.lockName (the webhook reads it too).
const IndexLockName = fkv1.IndexLockName

// Options configure the lock authority.
type Options struct {
	// Clock is the monotonic clock expiry is measured on (default: real).
	Clock clock.PassiveClock
	// ForeignLeaseRecheck defaults to DefaultForeignLeaseRecheck.
	ForeignLeaseRecheck time.Duration
	// MaxWaiters per lock: new claims beyond it are turned away (QueueFull).
	// 0 means DefaultMaxWaiters; negative means no limit.
	MaxWaiters int
	// Leadership, with leader election, tells whether this process's term
	// is certainly still its own: no Lease is written outside it (a leader
	// paused past its lease resumes deciding on caches from before the
	// pause, while its successor already acts). nil: no leader election.
	Leadership Leadership
	// Relists, when set, starts a new term whenever the Lease informer
	// lists anew (see Relists); its NewInformer must be the cache's.
	Relists *Relists
}

// Reconciler is the lease authority for every lock: one reconcile per lock
// (namespace + spec.lockName).
type Reconciler struct {
	// client reads from the informer cache and writes to the apiserver.
	client client.Client
	// apiReader reads live, for the rare paths: a holder claim or holder
	// pod missing from the cache, and a Lease that is not in the
	// (managed-only) Lease cache.
	apiReader      client.Reader
	recorder       events.EventRecorder
	foreignRecheck time.Duration
	maxWaiters     int
	// clock is the monotonic clock expiry is measured on.
	clock clock.PassiveClock

	// memory is what this process remembers per lock between reconciles.
	memory *memory
	// term is this process's term as the only authority (term.go).
	term term
	// floor is this term's epoch floor (floor.go).
	floor *termFloor
}

// NewReconciler returns the lock authority.
func NewReconciler(c client.Client, apiReader client.Reader, recorder events.EventRecorder, o Options) *Reconciler {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.ForeignLeaseRecheck <= 0 {
		o.ForeignLeaseRecheck = DefaultForeignLeaseRecheck
	}
	switch {
	case o.MaxWaiters == 0:
		o.MaxWaiters = DefaultMaxWaiters
	case o.MaxWaiters < 0:
		o.MaxWaiters = 0 // no limit
	}
	r := &Reconciler{
		client: c, apiReader: apiReader, recorder: recorder, foreignRecheck: o.ForeignLeaseRecheck, maxWaiters: o.MaxWaiters,
		clock: o.Clock, memory: newMemory(), term: term{leadership: o.Leadership},
	}
	r.floor = newTermFloor(r.storageRevision)
	if o.Relists != nil {
		o.Relists.subscribe(r.NewTerm)
	}
	return r
}

// +kubebuilder:rbac:groups=fencekeeper.io,resources=fencedleases,verbs=get;list;watch
// +kubebuilder:rbac:groups=fencekeeper.io,resources=fencedleases/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Reconcile brings one lock's Lease and claims in line: gather what the
// cache says, decide (a pure function), act (at most one guarded Lease write,
// then the claim statuses that follow from it).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := req.NamespacedName
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("lock", lock.String()))

	// One copy of the lock's memory, written back once, however the
	// reconcile ends.
	// Whether this term may vouch is read before the memory: a term's
	// CatchUp records its expectations before it lets reconciles vouch, so
	// a reconcile that sees the term caught up also sees them.
	caughtUp := r.term.caughtUp.Load()
	loaded := r.memory.load(lock)
	mem := loaded
	defer func() { r.memory.store(lock, loaded, mem) }()

	g, err := r.gather(ctx, lock, &mem)
	g.caughtUp = caughtUp
	if err != nil {
		return ctrl.Result{}, err
	}
	if g.cacheBehind {
		return ctrl.Result{RequeueAfter: raceRetry}, nil
	}
	var ok bool
	if g.termFloor, g.term, ok = r.floor.get(lock); !ok {
		// Nothing is decided before this term's floor is read; the lock is
		// queued again when it is (the timer only covers a lost wake-up).
		return retry(time.Second), nil
	}
	if g.lease == nil && g.foreign == "" && len(g.claims) > 0 {
		// A new ledger: its Lease is created free first, and what is
		// decided is then written as an update of that Lease.
		created, err := r.createLedger(ctx, lock, g.term, &mem)
		if created == nil || err != nil {
			return ctrl.Result{RequeueAfter: raceRetry}, err
		}
		g.setLease(created, lock)
	}
	g.storageRevision = revisionOf(g.lease)
	a := decide(g.snapshot)
	summarizeQueue(&mem, g, a)
	return r.act(ctx, lock, g, a, &mem)
}

// SetupWithManager registers the claim index and the lock controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &fkv1.FencedLease{}, IndexLockName, func(o client.Object) []string {
		return []string{o.(*fkv1.FencedLease).Spec.LockName}
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, pods.IndexNodeName, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" && pods.HasLeaseAnnotation(o) {
			return []string{n}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &coordinationv1.Lease{}, indexPermitOf, permitOf); err != nil {
		return err
	}
	managed := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[fkv1.LabelManagedBy] == fkv1.ManagedByValue
	})
	if err := mgr.Add(r.floor); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("lock").
		WatchesRawSource(source.Channel(r.floor.ready, &handler.EnqueueRequestForObject{})).
		Watches(&fkv1.FencedLease{}, claimEvents()).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(leaseToLock), builder.WithPredicates(managed)).
		// A pod's readiness is the renewal of its lease.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToLock), builder.WithPredicates(pods.AsksForLease)).
		// So is its node's: a lost node stops the renewals of its pods' leases.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.nodeToLocks), builder.WithPredicates(readyChanged)).
		WithOptions(opts).
		Complete(r)
}

func claimToLock(_ context.Context, o client.Object) []reconcile.Request {
	c := o.(*fkv1.FencedLease)
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.LockName}}}
}

func leaseToLock(_ context.Context, o client.Object) []reconcile.Request {
	if lockName, ok := fkv1.IsPermitLease(o.(*coordinationv1.Lease)); ok {
		// A permit's renewal wakes its lock (and the lock of that name, which
		// must not take it for its ledger).
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: lockName}},
			{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}}
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}}
}

// readyChanged passes node events that can change whether the node is Ready.
var readyChanged = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return pods.NodeReady(e.ObjectOld.(*corev1.Node)) != pods.NodeReady(e.ObjectNew.(*corev1.Node))
	},
}

// nodeToLocks wakes the locks of the lease-asking pods on a node.
func (r *Reconciler) nodeToLocks(ctx context.Context, o client.Object) []reconcile.Request {
	var list corev1.PodList
	if err := r.client.List(ctx, &list, client.MatchingFields{pods.IndexNodeName: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing the pods of a node", "node", o.GetName())
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		out = append(out, podToLock(ctx, &list.Items[i])...)
	}
	return out
}

func podToLock(_ context.Context, o client.Object) []reconcile.Request {
	lock := o.GetAnnotations()[fkv1.AnnotationLease]
	if lock == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: lock}}}
}

package podlease

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
	"github.com/fencekeeper/fencekeeper/controllers/lock"
)

// Reconciler turns the fencekeeper.io/lease annotation of a pod into
// a claim owned by the pod, and reports the claim back on the pod: the
// fencekeeper.io/epoch and fencekeeper.io/lease-state annotations (read by
// the app through a downward-API volume) and the fencekeeper.io/lease-held
// condition (usable as a readiness gate). Whether the lease stays alive is
// the lock controller's business: it reads the pod's readiness instead of
// waiting for renewals, so a held pod lease costs no periodic writes.
type Reconciler struct {
	client client.Client
	// apiReader reads pods live, on the rare path where the cache may trail
	// the pod's re-creation (deleteClaims).
	apiReader client.Reader
	recorder  events.EventRecorder
	// leadership, with leader election, tells whether this process's term
	// is certainly still its own (nil: no leader election).
	leadership lock.Leadership
}

// NewReconciler returns the pod bridge. leadership may be nil.
func NewReconciler(c client.Client, apiReader client.Reader, recorder events.EventRecorder, leadership lock.Leadership) *Reconciler {
	return &Reconciler{client: c, apiReader: apiReader, recorder: recorder, leadership: leadership}
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods/status,verbs=patch
// +kubebuilder:rbac:groups=fencekeeper.io,resources=fencedleases,verbs=create;delete

// errTermUncertain stops a reconcile before a write while this process's
// leader-election term is not certainly its own.
var errTermUncertain = errors.New("this replica's leader-election term is not certain")

// certain is checked right before each write. A leader resumed from a pause
// past its lease may hold caches, and a view of the claims, older than what
// the next leader has already reported on the pod: it writes nothing until
// its term is certain again (or it learns that it ended, and stops).
func (r *Reconciler) certain() error {
	if r.leadership != nil && !r.leadership.Current() {
		return errTermUncertain
	}
	return nil
}

// Reconcile brings one pod's claims and lease annotations in line.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("pod", req.String())
	ctx = log.IntoContext(ctx, logger)
	res, err := r.reconcile(ctx, req)
	if errors.Is(err, errTermUncertain) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.certain(); err != nil {
		return ctrl.Result{}, err
	}
	var pod corev1.Pod
	err := r.client.Get(ctx, req.NamespacedName, &pod)
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, r.deleteClaims(ctx, req.Namespace, req.Name, "", request{}, false)
	}
	if err != nil {
		return ctrl.Result{}, err
	}

	ask, invalid := leaseRequest(&pod)
	lock := ask.lock
	wanted := lock != "" && invalid == "" && pods.LivenessOf(&pod, string(pod.UID)) != pods.Gone
	keep := request{}
	if wanted {
		keep = ask
	}
	// Give up claims for another lock, of an older pod with this name, or all
	// of them when the pod stopped asking, is invalid, terminal or deleting.
	retry := pods.LivenessOf(&pod, string(pod.UID)) == pods.Live
	if err := r.deleteClaims(ctx, pod.Namespace, pod.Name, pod.UID, keep, retry); err != nil {
		return ctrl.Result{}, err
	}
	if invalid != "" {
		return afterPodWrite(ctx, r.reportInvalid(ctx, &pod, invalid))
	}
	if !wanted {
		return afterPodWrite(ctx, r.syncPod(ctx, &pod, nil, lock != ""))
	}

	claim, created, err := r.ensureClaim(ctx, &pod, ask)
	if err != nil {
		return ctrl.Result{}, err
	}
	if claim == nil {
		// The name is taken and the cache does not show by what yet: its
		// event brings us back if it is the pod's; look again regardless.
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if claim.Status.Phase == "" && (!created || pod.Annotations[fkv1.AnnotationLeaseState] != fkv1.LeaseStateHeld) {
		// The lock controller has not seen the claim yet; its first status
		// (Held or Pending) brings us back, so the pod is written once. A pod
		// still showing Held when this very reconcile had to create its claim
		// got Held from an earlier claim (deleted by hand, or for another
		// lock): it is told Lost now, not when the lock controller gets to
		// the new one. (A claim found without a status may only be one this
		// cache has not seen granted yet, while another replica has.)
		return ctrl.Result{}, nil
	}
	return afterPodWrite(ctx, r.syncPod(ctx, &pod, claim, true))
}

// afterPodWrite: a pod deleted while we wrote to it (the cache still
// showed it) is how every pod lease ends, not an error; the deletion's own
// event brings us back to release its claims. A pod changed since the cache
// showed it refuses our write (it carries the resourceVersion we decided
// on): we look again after a moment, with what it says by then (its change
// may bring no event: one to a pod that no longer asks for a lease is
// filtered out, yet it may still have to be told Lost).
func afterPodWrite(ctx context.Context, err error) (ctrl.Result, error) {
	switch {
	case apierrors.IsNotFound(err):
		log.FromContext(ctx).V(1).Info("the pod is gone; its claims are released when its deletion is seen", "reason", err.Error())
		return ctrl.Result{}, nil
	case apierrors.IsConflict(err):
		log.FromContext(ctx).V(1).Info("the pod changed since the cache showed it; looking again", "reason", err.Error())
		return ctrl.Result{RequeueAfter: podChangedRetry}, nil
	}
	return ctrl.Result{}, err
}

// podChangedRetry is how long after a refused pod write the pod is looked
// at again: long enough for the cache to show the change, as a rule.
const podChangedRetry = 500 * time.Millisecond

// IndexPodOwner indexes the FencedLeases the bridge looks after (bridgesPod)
// by the name of the pod they were made for.
const IndexPodOwner = "podOwner"

// podClaims lists the claims the bridge looks after for pod name in ns (any
// pod of that name, current or gone; bridgesPod), through an index: no scan
// of the namespace's claims.
func (r *Reconciler) podClaims(ctx context.Context, ns, name string) ([]fkv1.FencedLease, error) {
	var list fkv1.FencedLeaseList
	if err := r.client.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{IndexPodOwner: name}); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// deleteClaims deletes the claims made for pod name in ns (podClaims: never
// a user's claim that merely names the pod as its owner), except the one of
// the pod (uid: the cached pod's, "" when the cache has none) for the lock
// keep (and the capacity it asks for: maxHolders is immutable, so a claim
// of another capacity is replaced). With retry (the pod is live again), an Expired claim is deleted too,
// so the pod contends again with a fresh claim; a pod that is not live keeps
// its Expired claim and shows Lost.
//
// A claim made for a pod of this name other than the cached one belongs to
// an older pod, or to a newer one this cache has not seen yet (another
// manager created its claim): before the first such delete the pod is read
// live, and the live pod's claims are left to the reconcile that sees it.
// Any claim listed here existed before that read, so a pod the read does
// not show is gone for good (UIDs are never reused).
func (r *Reconciler) deleteClaims(ctx context.Context, ns, name string, uid types.UID, keep request, retry bool) error {
	claims, err := r.podClaims(ctx, ns, name)
	if err != nil {
		return err
	}
	var live *types.UID
	for i := range claims {
		c := &claims[i]
		owner := pods.OwnerRef(c).UID
		if keep.lock != "" && owner == uid && c.Spec.LockName == keep.lock && c.MaxHolders() == max(keep.maxHolders, 1) &&
			(c.Status.Phase != fkv1.PhaseExpired || !retry) && madeForUID(c, uid) {
			continue
		}
		if owner != uid {
			if live == nil {
				if live, err = r.livePodUID(ctx, ns, name); err != nil {
					return err
				}
			}
			if owner == *live {
				continue
			}
		}
		if err := r.certain(); err != nil {
			return err
		}
		if err := r.client.Delete(ctx, c, client.Preconditions{UID: &c.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("releasing claim %s/%s: %w", c.Namespace, c.Name, err)
		}
		log.FromContext(ctx).Info("released pod claim", "claim", c.Name, "lock", c.Spec.LockName, "phase", c.Status.Phase)
	}
	return nil
}

// livePodUID reads the UID of pod name in ns from the apiserver ("" when
// there is none).
func (r *Reconciler) livePodUID(ctx context.Context, ns, name string) (*types.UID, error) {
	var pod metav1.PartialObjectMetadata
	pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pod)
	switch {
	case apierrors.IsNotFound(err):
		return ptr.To(types.UID("")), nil
	case err != nil:
		return nil, fmt.Errorf("reading pod %s/%s before releasing claims made for another pod of that name: %w", ns, name, err)
	}
	return ptr.To(pod.UID), nil
}

func madeForUID(c *fkv1.FencedLease, uid types.UID) bool {
	return madeFor(c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}})
}

// madeFor reports whether claim is the one the bridge made for pod: owned by
// the pod and bound to it rather than to a user (the bridge writes that
// binding, and the claim-identity policy writes the same for the manager's
// claims for pods; pods.BridgeRef, which the lock authority also goes by to
// treat a claim as pod-held). A claim that records no binding (made by an
// older manager without the policy, or by someone else) is not: its epoch
// would be refused every write (rule 9), so the bridge replaces it.
func madeFor(claim *fkv1.FencedLease, pod *corev1.Pod) bool {
	ref := pods.BridgeRef(claim)
	return ref != nil && ref.UID == pod.UID
}

// bridgesPod reports whether the bridge looks after claim c for the pod its
// controller reference names: a claim it made (pods.BridgeRef), or one that
// records no creator (an older manager's, made before claims recorded one;
// the bridge replaces it). A claim a user made, with a controller reference
// to a pod, is the user's: it is not pod-held, and it renews, expires or is
// released like any claim (the garbage collector deletes it with the pod).
func bridgesPod(c *fkv1.FencedLease) bool {
	if pods.BridgeRef(c) != nil {
		return true
	}
	return pods.OwnerRef(c) != nil && fkv1.RecordsNoIdentity(c)
}

// ensureClaim returns the pod's claim for lock, creating it if the cache has
// none (created), or nil when the name is taken by a claim the cache does
// not show yet.
func (r *Reconciler) ensureClaim(ctx context.Context, pod *corev1.Pod, req request) (*fkv1.FencedLease, bool, error) {
	lock, ttl := req.lock, req.ttl
	name := podClaimName(pod, lock, req.maxHolders)
	var claim fkv1.FencedLease
	err := r.client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, &claim)
	if err == nil && madeFor(&claim, pod) && claim.MaxHolders() == max(req.maxHolders, 1) {
		return &claim, false, nil
	}
	if err == nil {
		// Someone else created a claim under this pod's claim name: it is not
		// the pod's (another identity would hold the pod's epoch). Give the
		// name back; the next reconcile creates the pod's own claim.
		log.FromContext(ctx).Info("deleting a claim squatting on a pod's claim name", "claim", claim.Name,
			"createdBy", claim.Annotations[fkv1.AnnotationCreatedBy])
		if err := r.certain(); err != nil {
			return nil, false, err
		}
		if err := r.client.Delete(ctx, &claim, client.Preconditions{UID: &claim.UID}); err != nil && !apierrors.IsNotFound(err) {
			return nil, false, fmt.Errorf("deleting claim %s/%s not made for pod %s: %w", claim.Namespace, claim.Name, pod.Name, err)
		}
		return nil, false, fmt.Errorf("claim %s/%s was not made for pod %s; deleted, will retry", claim.Namespace, claim.Name, pod.Name)
	}
	if !apierrors.IsNotFound(err) {
		return nil, false, err
	}
	claim = fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pod.Namespace, Name: name,
			Labels: map[string]string{fkv1.LabelPodUID: string(pod.UID)},
			// Bound to the pod, as the claim-identity policy binds the
			// manager's claims for pods; said here too so that the claim is
			// bound where that policy is not in effect (a claim that binds
			// nobody is refused every write, rule 9).
			Annotations: map[string]string{
				fkv1.AnnotationCreatedBy:       "",
				fkv1.AnnotationCreatedByPodUID: string(pod.UID),
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: pod.Name, LeaseDurationSeconds: ptr.To(ttl)},
	}
	if req.maxHolders > 1 {
		claim.Spec.MaxHolders = ptr.To(req.maxHolders)
	}
	if err := r.certain(); err != nil {
		return nil, false, err
	}
	err = r.client.Create(ctx, &claim)
	switch {
	case apierrors.IsAlreadyExists(err):
		// The cache is behind: what the stored claim says is unknown here.
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("creating claim %s/%s for pod %s: %w", pod.Namespace, name, pod.Name, err)
	}
	return &claim, true, nil
}

// reportInvalid explains a bad request on the pod. A pod that held the lock
// until the request turned bad (its claim was just given up) is told Lost.
func (r *Reconciler) reportInvalid(ctx context.Context, pod *corev1.Pod, msg string) error {
	if pod.Annotations[fkv1.AnnotationLeaseState] == fkv1.LeaseStateHeld {
		if err := r.patchAnnotations(ctx, pod, map[string]string{fkv1.AnnotationLeaseState: fkv1.LeaseStateLost}); err != nil {
			return err
		}
		r.recorder.Eventf(pod, nil, corev1.EventTypeNormal, "Lease"+fkv1.LeaseStateLost, "Lease", "Released: %s", msg)
	}
	changed, err := r.patchCondition(ctx, pod, corev1.ConditionFalse, fkv1.ReasonInvalidLeaseRequest, msg)
	if err == nil && changed {
		r.recorder.Eventf(pod, nil, corev1.EventTypeWarning, fkv1.ReasonInvalidLeaseRequest, "RequestLease", "%s", msg)
	}
	return err
}

// SetupWithManager registers the owner-pod index and the pod-lease controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &fkv1.FencedLease{}, IndexPodOwner, func(o client.Object) []string {
		if c := o.(*fkv1.FencedLease); bridgesPod(c) {
			return []string{pods.OwnerName(c)}
		}
		return nil
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("podlease").
		For(&corev1.Pod{}, builder.WithPredicates(pods.AsksForLease)).
		Owns(&fkv1.FencedLease{}).
		WithOptions(opts).
		Complete(r)
}

package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook/fencing"
)

// FencingPath is where the fencing webhook is served.
const FencingPath = "/fence"

// GarbageCollectorUsers are the identities the garbage collector deletes
// with: its own ServiceAccount (kube-controller-manager with
// --use-service-account-credentials) or kube-controller-manager's identity.
var GarbageCollectorUsers = map[string]bool{
	"system:serviceaccount:kube-system:generic-garbage-collector": true,
	"system:kube-controller-manager":                              true,
}

// Authority is the in-process lock authority, which can vouch that the Lease
// cache is fresh for a lock (see controllers/lock.View): FreshView for a
// mutex, FreshPermits (the live permits' epochs, ascending) for a semaphore.
type Authority interface {
	FreshView(lock types.NamespacedName) (heldEpoch, floor int64, fresh bool)
	FreshPermits(lock types.NamespacedName) (permits []int64, floor int64, fresh bool)
}

// FencingHandler admits writes to fenced objects of any kind. It is a
// mutating webhook: an accepted content write has its epoch token consumed
// and its watermark (fenced-epoch) set, in the same admission hop that
// checked it, inside the apiserver's compare-and-swap loop.
type FencingHandler struct {
	// Cache reads managed Leases from the informer cache.
	Cache client.Reader
	// APIReader reads a Lease live when the cache cannot be shown fresh, and
	// the namespace of a fenced object being deleted.
	APIReader client.Reader
	// Authority, when this process runs the lock authority, shows the cache
	// fresh; without it every check of a presented epoch reads live.
	Authority Authority
	// Mapper finds the kind behind a scaled resource.
	Mapper meta.RESTMapper
}

var _ admission.Handler = &FencingHandler{}

// Handle decodes the request generically, looks up the lock state only when a
// rule needs it, applies fencing.Decide, and rewrites an accepted write.
func (h *FencingHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp, reason := h.handle(ctx, req)
	observe(req, resp.Allowed, reason, time.Since(start))
	return resp
}

func (h *FencingHandler) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	if req.SubResource == "scale" || req.SubResource == "status" {
		if req.Operation != admissionv1.Update {
			return admission.Allowed("fencekeeper checks only UPDATE of " + req.SubResource), "OperationNotChecked"
		}
		old, obj, err := decodeUpdate(req)
		if err != nil {
			return admission.Errored(http.StatusBadRequest, err), "DecodeError"
		}
		if req.SubResource == "scale" {
			return h.handleScale(ctx, req, old, obj)
		}
		return handleStatus(req, old, obj)
	}
	r := fencing.Request{Op: fencing.Operation(req.Operation)}
	var err error
	switch req.Operation {
	case admissionv1.Create, admissionv1.Update:
		if r.New, err = decode(req.Object.Raw); err != nil {
			return admission.Errored(http.StatusBadRequest, err), "DecodeError"
		}
	case admissionv1.Delete:
	default:
		return admission.Allowed("fencekeeper checks only CREATE, UPDATE and DELETE"), "OperationNotChecked"
	}
	if req.Operation != admissionv1.Create {
		if r.Old, err = decode(req.OldObject.Raw); err != nil {
			return admission.Errored(http.StatusBadRequest, err), "DecodeError"
		}
	}
	lockName, fenced := fencing.LockName(r.Old, r.New)
	if !fenced {
		return admission.Allowed("not fenced"), "NotFenced"
	}
	if req.Namespace == "" {
		return denied(fencing.Decision{Code: http.StatusUnprocessableEntity, Reason: fkv1.AdmissionClusterScoped,
			Message: fmt.Sprintf("%s %s is cluster-scoped; locks live in a namespace, so only namespaced objects can be fenced", req.Kind.Kind, req.Name)}), string(fkv1.AdmissionClusterScoped)
	}
	if r.Op == fencing.Delete {
		r.GarbageCollector = GarbageCollectorUsers[req.UserInfo.Username]
		if r.NamespaceTerminating, err = h.namespaceTerminating(ctx, req.Namespace); err != nil {
			return admission.Errored(http.StatusServiceUnavailable, err), "NamespaceReadError"
		}
	}

	return h.decide(ctx, req, r, lockName)
}

// decide looks up the lock when the rules need it and applies them.
func (h *FencingHandler) decide(ctx context.Context, req admission.Request, r fencing.Request, lockName string) (admission.Response, string) {
	var err error
	state := fencing.LockState{Namespace: req.Namespace, Name: lockName}
	if r.Op == fencing.Delete && lockName == "" {
		return admission.Allowed("an empty lock label never fenced this object"), string(fkv1.AdmissionMetadataOnly)
	}
	freeCached := false
	key := types.NamespacedName{Namespace: req.Namespace, Name: lockName}
	if epoch, need := fencing.NeedsLock(r); need && lockName != "" {
		if state, freeCached, err = h.lockState(ctx, key, epoch); err != nil {
			// Fail closed: without the authority's word nothing is written.
			return admission.Errored(http.StatusServiceUnavailable,
				fmt.Errorf("reading lock %s/%s: %w", req.Namespace, lockName, err)), "LockReadError"
		}
	}
	d := fencing.Decide(r, state)
	if d.Allowed && freeCached {
		// A free mutex in the cache refuses safely (a newer grant only
		// issues higher epochs), but an acceptance (policy monotonic) must
		// hold against the live Lease: the lock may be a semaphore by now,
		// under which monotonic admits nothing.
		if state, err = h.liveLockState(ctx, key); err != nil {
			return admission.Errored(http.StatusServiceUnavailable,
				fmt.Errorf("reading lock %s/%s: %w", req.Namespace, lockName, err)), "LockReadError"
		}
		d = fencing.Decide(r, state)
	}
	if epoch, need := fencing.NeedsIdentity(r, d); need {
		bound, err := h.binding(ctx, state, epoch)
		if err != nil {
			return admission.Errored(http.StatusServiceUnavailable, err), "LockReadError"
		}
		who := fencing.Identity{User: req.UserInfo.Username, PodUID: fencing.PodUIDOf(extraOf(req.UserInfo.Extra))}
		if id := fencing.CheckIdentity(state, epoch, who, bound); !id.Allowed {
			d = id
		}
	}
	if !d.Allowed {
		logf.FromContext(ctx).V(1).Info("denied a fenced write", "operation", req.Operation, "kind", req.Kind.Kind,
			"namespace", req.Namespace, "name", req.Name, "user", req.UserInfo.Username, "lock", lockName, "reason", d.Reason, "epoch", d.Epoch)
		return denied(d), string(d.Reason)
	}
	if d.Watermark == 0 || req.SubResource != "" {
		return admission.Allowed(string(d.Reason)), string(d.Reason)
	}
	return consume(req.Object.Raw, r.New, d), string(d.Reason)
}

// decodeUpdate decodes the stored and the written object of an UPDATE.
func decodeUpdate(req admission.Request) (old, obj *unstructured.Unstructured, err error) {
	if obj, err = decode(req.Object.Raw); err != nil {
		return nil, nil, err
	}
	if old, err = decode(req.OldObject.Raw); err != nil {
		return nil, nil, err
	}
	return old, obj, nil
}

// handleStatus keeps the fencing metadata out of reach of status writes
// (fencing.StatusWrite); their content is not checked. A fencing annotation
// added or changed, or a new owner, is refused. This webhook sees the
// request before the kind's status strategy, and clients send objects
// without labels or annotations (custom resources drop metadata sent to
// status anyway), so what the request leaves out of the fencing metadata is
// put back with a JSON patch rather than refused.
func handleStatus(req admission.Request, oldObj, newObj *unstructured.Unstructured) (admission.Response, string) {
	d := fencing.StatusWrite(oldObj, newObj)
	if !d.Allowed {
		return denied(d), string(d.Reason)
	}
	restored := fencing.RestoreFencingMetadata(oldObj, newObj)
	if equality.Semantic.DeepEqual(restored.Object, newObj.Object) {
		return admission.Allowed(string(d.Reason)), string(d.Reason)
	}
	modified, err := json.Marshal(restored.Object)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err), "EncodeError"
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, modified)
	resp.Result = &metav1.Status{Message: string(d.Reason) + ": the fencing metadata is kept as stored"}
	return resp, string(d.Reason)
}

// handleScale checks a write to the scale subresource of a guarded kind like
// a content write of the object itself: the Scale carries no labels, so the
// object is read live (scale writes are rare) to see whether it is fenced,
// and the epoch is presented in the Scale's own annotations. The watermark
// does not move (a Scale write cannot change the object's annotations), so
// fencing.Decide accepts a scale only at the current epoch over a watermark
// that already is that epoch.
func (h *FencingHandler) handleScale(ctx context.Context, req admission.Request, scaleOld, scaleNew *unstructured.Unstructured) (admission.Response, string) {
	if h.Mapper == nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("no REST mapper to read the scaled object")), "LockReadError"
	}
	gvk, err := h.Mapper.KindFor(schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource})
	if err != nil {
		return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("mapping %s: %w", req.Resource.Resource, err)), "LockReadError"
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	if err := h.APIReader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Name}, obj); err != nil {
		return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("reading %s %s/%s: %w", gvk.Kind, req.Namespace, req.Name, err)), "LockReadError"
	}
	lockName, fenced := fencing.LockName(obj, nil)
	if !fenced {
		return admission.Allowed("not fenced"), "NotFenced"
	}
	// The object as the scale write leaves it: a content change when the
	// replicas change, or who owns them (an apply to /scale that keeps the
	// count still takes ownership of the object's spec.replicas, which
	// steers the holder's next apply), presenting the Scale's token.
	newObj := obj.DeepCopy()
	oldReplicas, _, _ := unstructured.NestedInt64(scaleOld.Object, "spec", "replicas")
	newReplicas, _, _ := unstructured.NestedInt64(scaleNew.Object, "spec", "replicas")
	if oldReplicas != newReplicas || fencing.ApplyInputsChanged(scaleOld, scaleNew) {
		newObj.Object["fencekeeper.io/scale"] = newReplicas
	}
	ann := newObj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	delete(ann, fkv1.AnnotationEpoch)
	if token, ok := scaleNew.GetAnnotations()[fkv1.AnnotationEpoch]; ok {
		ann[fkv1.AnnotationEpoch] = token
	}
	newObj.SetAnnotations(ann)
	return h.decide(ctx, req, fencing.Request{Op: fencing.Update, Old: obj, New: newObj, Scale: true}, lockName)
}

// consume rewrites an accepted content write: the token is removed and the
// watermark set to the presented epoch.
func consume(raw []byte, obj *unstructured.Unstructured, d fencing.Decision) admission.Response {
	out := obj.DeepCopy()
	ann := out.GetAnnotations()
	delete(ann, fkv1.AnnotationEpoch)
	ann[fkv1.AnnotationFencedEpoch] = fkv1.FormatEpoch(d.Watermark)
	if m, ok := ann[fkv1.AnnotationDeleteEpoch]; ok && m != fkv1.FormatEpoch(d.Watermark) {
		// A mark by an earlier epoch must not outlive a newer write.
		delete(ann, fkv1.AnnotationDeleteEpoch)
	}
	out.SetAnnotations(ann)
	modified, err := json.Marshal(out.Object)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(raw, modified)
	resp.Result = &metav1.Status{Message: string(d.Reason)}
	return resp
}

// lockState reads the lock's Lease from the cache when the authority in this
// process vouches for the cache (same holder, lease not lapsed on its clock,
// nothing newer issued), and live otherwise: a replica must not admit on a
// view older than the request.
//
// A free mutex in the cache is used without the authority's word (it is
// vouched for only as far as refusals go: see vouched); freeCached says so,
// and decide confirms an acceptance against the live Lease.
func (h *FencingHandler) lockState(ctx context.Context, key types.NamespacedName, presented int64) (state fencing.LockState, freeCached bool, err error) {
	var lease coordinationv1.Lease
	err = h.Cache.Get(ctx, key, &lease)
	if err != nil && !apierrors.IsNotFound(err) {
		return fencing.LockState{}, false, err
	}
	state = stateOf(key, &lease, err == nil)
	if state.Exists && presented <= state.Issued && h.vouched(key, state) {
		return state, state.HeldEpoch == 0 && !state.Semaphore(), nil
	}
	state, err = h.liveLockState(ctx, key)
	return state, false, err
}

// liveLockState reads the lock's Lease from the apiserver.
func (h *FencingHandler) liveLockState(ctx context.Context, key types.NamespacedName) (fencing.LockState, error) {
	liveReads.Inc()
	var lease coordinationv1.Lease
	err := h.APIReader.Get(ctx, key, &lease)
	if err != nil && !apierrors.IsNotFound(err) {
		return fencing.LockState{}, err
	}
	return stateOf(key, &lease, err == nil), nil
}

// vouched reports whether the authority's fresh view agrees with the cache.
// A free lock in the cache needs no vouching: it admits nothing under policy
// current, and the issued bound is checked against it. A semaphore's cached
// permits are used only when the authority vouches for exactly that set
// (no permit is vouched for when none is live: such a lock reads live).
func (h *FencingHandler) vouched(key types.NamespacedName, state fencing.LockState) bool {
	if h.Authority == nil {
		return false
	}
	if state.Semaphore() {
		permits, floor, fresh := h.Authority.FreshPermits(key)
		return fresh && slices.Equal(permits, state.PermitEpochs()) && floor <= state.Issued
	}
	held, floor, fresh := h.Authority.FreshView(key)
	if state.HeldEpoch == 0 {
		return floor <= state.Issued
	}
	return fresh && held == state.HeldEpoch && floor <= state.Issued
}

// binding is the identity epoch's holder claim is bound to: the Lease's
// record for the current epoch (of a semaphore: the permit entry's), the
// claim (from the cache) for an older one of a mutex. A semaphore's epoch
// that no live permit holds has no binding (Decide never accepts one).
func (h *FencingHandler) binding(ctx context.Context, state fencing.LockState, epoch int64) (fencing.Binding, error) {
	if b, ok := state.LeaseBinding(epoch); ok {
		return b, nil
	}
	if state.Semaphore() {
		return fencing.Binding{}, nil
	}
	var claims fkv1.FencedLeaseList
	if err := h.Cache.List(ctx, &claims, client.InNamespace(state.Namespace), client.MatchingFields{fkv1.IndexLockName: state.Name}); err != nil {
		return fencing.Binding{}, fmt.Errorf("listing the claims of lock %s: %w", state, err)
	}
	var found []fencing.Binding
	for _, c := range claims.Items {
		if c.Status.Epoch == epoch {
			found = append(found, fencing.Binding{User: c.Annotations[fkv1.AnnotationCreatedBy], PodUID: c.Annotations[fkv1.AnnotationCreatedByPodUID], Known: true})
		}
	}
	if len(found) != 1 {
		// Gone, or claimed by two (a status written by hand): the holder of
		// the epoch is not known, and CheckIdentity refuses.
		return fencing.Binding{}, nil
	}
	return found[0], nil
}

func extraOf[V ~[]string](m map[string]V) map[string][]string {
	out := make(map[string][]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// namespaceTerminating reads the namespace live: deletes of fenced objects
// are rare, and namespace deletion must never be blocked by a stale cache.
func (h *FencingHandler) namespaceTerminating(ctx context.Context, name string) (bool, error) {
	var ns corev1.Namespace
	if err := h.APIReader.Get(ctx, types.NamespacedName{Name: name}, &ns); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("reading namespace %s: %w", name, err)
	}
	return ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating, nil
}

// A Lease that renews a semaphore's permit, or that names another lock,
// is no ledger of this lock: it counts as no lock.
func stateOf(key types.NamespacedName, lease *coordinationv1.Lease, found bool) fencing.LockState {
	if !found {
		lease = nil
	}
	if lease != nil {
		if _, permit := fkv1.IsPermitLease(lease); permit || (lease.Labels[fkv1.LabelLock] != "" && lease.Labels[fkv1.LabelLock] != key.Name) {
			lease = nil
		}
	}
	return fencing.StateOf(key.Namespace, key.Name, fkv1.ReadLedger(lease, key.Name))
}

func decode(raw []byte) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("decoding the object: %w", err)
	}
	return u, nil
}

func denied(d fencing.Decision) admission.Response {
	reason := metav1.StatusReasonInvalid
	if d.Code == http.StatusForbidden {
		reason = metav1.StatusReasonForbidden
	}
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: d.Code, Reason: reason, Message: d.Message,
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{
				Type:    metav1.CauseType(d.Reason.CauseType()),
				Message: d.Message,
				Field:   causeField(d.Reason),
			}}},
		},
	}}
}

// causeField names the field a denial is about.
func causeField(r fkv1.AdmissionReason) string {
	switch r {
	case fkv1.AdmissionLockLabelImmutable, fkv1.AdmissionEmptyLockLabel:
		return "metadata.labels[" + fkv1.LabelLock + "]"
	case fkv1.AdmissionInvalidPolicy:
		return "metadata.annotations[" + fkv1.AnnotationFencePolicy + "]"
	case fkv1.AdmissionDeleteNotMarked:
		return "metadata.annotations[" + fkv1.AnnotationDeleteEpoch + "]"
	case fkv1.AdmissionClusterScoped:
		return "metadata.namespace"
	}
	return "metadata.annotations[" + fkv1.AnnotationEpoch + "]"
}

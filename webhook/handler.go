package webhook

import (
	"context"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook/fencing"
)

// FencingPath is where the fencing webhook is served.
const FencingPath = "/validate-fenced"

// FencingHandler admits writes to fenced objects of any kind.
type FencingHandler struct {
	// Cache reads managed Leases from the informer cache.
	Cache client.Reader
	// APIReader reads a Lease live when the cache is behind.
	APIReader client.Reader
}

var _ admission.Handler = &FencingHandler{}

// Handle decodes the request generically, looks up the lock state only when a
// rule needs it, and applies fencing.Decide.
func (h *FencingHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp, reason := h.handle(ctx, req)
	observe(req, resp.Allowed, reason, time.Since(start))
	return resp
}

func (h *FencingHandler) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	var op fencing.Operation
	switch req.Operation {
	case admissionv1.Create:
		op = fencing.Create
	case admissionv1.Update:
		op = fencing.Update
	default:
		return admission.Allowed("fencekeeper checks only CREATE and UPDATE"), "OperationNotChecked"
	}
	obj, err := decode(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err), "DecodeError"
	}
	var old *unstructured.Unstructured
	if op == fencing.Update {
		if old, err = decode(req.OldObject.Raw); err != nil {
			return admission.Errored(http.StatusBadRequest, err), "DecodeError"
		}
	}
	lockName := fencing.LockName(old, obj)
	if lockName == "" {
		return admission.Allowed("not fenced"), "NotFenced"
	}
	if req.Namespace == "" {
		return denied(fencing.Decision{Code: http.StatusUnprocessableEntity, Reason: fkv1.AdmissionClusterScoped,
			Message: fmt.Sprintf("%s %s is cluster-scoped; locks live in a namespace, so only namespaced objects can be fenced", req.Kind.Kind, req.Name)}), string(fkv1.AdmissionClusterScoped)
	}

	state := fencing.LockState{Namespace: req.Namespace, Name: lockName}
	if epoch, need := fencing.NeedsLock(op, old, obj); need {
		if state, err = h.lockState(ctx, types.NamespacedName{Namespace: req.Namespace, Name: lockName}, epoch); err != nil {
			// Fail closed: without the authority's word nothing is written.
			return admission.Errored(http.StatusServiceUnavailable,
				fmt.Errorf("reading lock %s/%s: %w", req.Namespace, lockName, err)), "LockReadError"
		}
	}
	d := fencing.Decide(op, old, obj, state)
	if d.Allowed {
		return admission.Allowed(string(d.Reason)), string(d.Reason)
	}
	logf.FromContext(ctx).V(1).Info("denied a fenced write", "kind", req.Kind.Kind, "namespace", req.Namespace,
		"name", req.Name, "user", req.UserInfo.Username, "lock", lockName, "reason", d.Reason, "epoch", d.Epoch)
	return denied(d), string(d.Reason)
}

// lockState reads the lock's Lease from the cache, and live only when the
// cache has not seen the presented epoch issued (or the Lease at all).
func (h *FencingHandler) lockState(ctx context.Context, key types.NamespacedName, presented int64) (fencing.LockState, error) {
	var lease coordinationv1.Lease
	err := h.Cache.Get(ctx, key, &lease)
	if err != nil && !apierrors.IsNotFound(err) {
		return fencing.LockState{}, err
	}
	state := stateOf(key, &lease, err == nil)
	if state.Exists && presented <= state.Issued {
		return state, nil
	}
	liveReads.Inc()
	lease = coordinationv1.Lease{}
	err = h.APIReader.Get(ctx, key, &lease)
	if err != nil && !apierrors.IsNotFound(err) {
		return fencing.LockState{}, err
	}
	return stateOf(key, &lease, err == nil), nil
}

func stateOf(key types.NamespacedName, lease *coordinationv1.Lease, found bool) fencing.LockState {
	if !found {
		lease = nil
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
	switch d.Code {
	case http.StatusConflict:
		reason = metav1.StatusReasonConflict
	case http.StatusForbidden:
		reason = metav1.StatusReasonForbidden
	}
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: d.Code, Reason: reason, Message: d.Message,
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{
				Type:    metav1.CauseType(d.Reason.CauseType()),
				Message: d.Message,
				Field:   "metadata.annotations[" + fkv1.AnnotationEpoch + "]",
			}}},
		},
	}}
}

// Package fencing decides whether a write to a fenced object is allowed: the
// rules of docs/design.md §3 as pure functions of (operation, old object, new
// object, lock state), so they can be table-tested and fuzzed without an
// apiserver. The admission handler around them only decodes and looks up.
package fencing

import (
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Operation is the admission operation.
type Operation string

// Operations the webhook is called for.
const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
)

// LockState is what the authority (the lock's backing Lease) says.
type LockState struct {
	// Namespace and Name of the lock.
	Namespace, Name string
	// Exists is false when the lock has no managed Lease.
	Exists bool
	// Issued is the last epoch issued for the lock.
	Issued int64
	// HeldEpoch is the epoch of the current holder, 0 when the lock is free.
	HeldEpoch int64
	// Holder is the current holder's identity ("" when free).
	Holder string
}

// StateOf is the lock state a ledger records. A Lease that never granted, or
// one with a damaged counter, counts as no lock: nothing may be presented
// against it until the authority repairs it.
func StateOf(namespace, name string, l fkv1.Ledger) LockState {
	s := LockState{Namespace: namespace, Name: name}
	if !l.Exists || !l.EpochValid || l.Epoch < 1 {
		return s
	}
	s.Exists, s.Issued = true, l.Epoch
	if l.Held() {
		s.HeldEpoch, s.Holder = l.Epoch, l.HolderIdentity
	}
	return s
}

func (l LockState) String() string { return l.Namespace + "/" + l.Name }

func (l LockState) holderText() string {
	if l.HeldEpoch == 0 {
		return fmt.Sprintf("lock is free, last epoch %d", l.Issued)
	}
	return fmt.Sprintf("current holder %s, epoch %d", l.Holder, l.HeldEpoch)
}

// Decision is an admission verdict.
type Decision struct {
	Allowed bool
	Reason  fkv1.AdmissionReason
	// Code is the HTTP status of a denial: 409 for stale or not-current
	// epochs, 403 for a forged one, 422 for malformed input.
	Code    int32
	Message string
	// Epoch is the presented epoch (0 when there is none or it is malformed).
	Epoch int64
}

func allow(r fkv1.AdmissionReason, epoch int64) Decision {
	return Decision{Allowed: true, Reason: r, Epoch: epoch}
}

func deny(code int32, r fkv1.AdmissionReason, epoch int64, format string, args ...any) Decision {
	return Decision{Reason: r, Code: code, Epoch: epoch, Message: fmt.Sprintf(format, args...)}
}

// LockName returns the lock an object is fenced by ("" if none): the new
// object's label, or the old one's when the write removes it.
func LockName(old, obj *unstructured.Unstructured) string {
	if obj != nil {
		if l := obj.GetLabels()[fkv1.LabelLock]; l != "" {
			return l
		}
	}
	if old != nil {
		return old.GetLabels()[fkv1.LabelLock]
	}
	return ""
}

// NeedsLock reports whether Decide will consult the lock state, and the
// epoch it will be checked against; the handler reads the Lease only then.
func NeedsLock(op Operation, old, obj *unstructured.Unstructured) (int64, bool) {
	if op == Update && !ContentChanged(old, obj) {
		return 0, false
	}
	e, err := fkv1.ParseEpoch(obj.GetAnnotations()[fkv1.AnnotationEpoch])
	if err != nil {
		return 0, false
	}
	return e, true
}

// Decide applies the rules of docs/design.md §3 to one write. old is nil on CREATE.
func Decide(op Operation, old, obj *unstructured.Unstructured, lock LockState) Decision {
	lockRef := lock.String()

	// Rule 5: the fencing label and the epoch annotation stay.
	if op == Update && old != nil {
		oldLock, newLock := old.GetLabels()[fkv1.LabelLock], obj.GetLabels()[fkv1.LabelLock]
		if oldLock != "" && newLock != oldLock {
			return deny(http.StatusUnprocessableEntity, fkv1.AdmissionLockLabelImmutable, 0,
				"the %s label of a fenced object cannot be removed or changed (it is %q; wanted %q)", fkv1.LabelLock, oldLock, newLock)
		}
		if _, had := old.GetAnnotations()[fkv1.AnnotationEpoch]; had {
			if _, has := obj.GetAnnotations()[fkv1.AnnotationEpoch]; !has {
				return deny(http.StatusUnprocessableEntity, fkv1.AdmissionEpochRemoved, 0,
					"the %s annotation of an object fenced by lock %s cannot be removed", fkv1.AnnotationEpoch, lockRef)
			}
		}
	}

	// Rule 6: metadata-only maintenance passes.
	if op == Update && !ContentChanged(old, obj) {
		return allow(fkv1.AdmissionMetadataOnly, 0)
	}

	// Rule 1: a content change carries a valid epoch.
	raw, ok := obj.GetAnnotations()[fkv1.AnnotationEpoch]
	if !ok {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionMissingEpoch, 0,
			"missing epoch for lock %s: a write to an object fenced by this lock must carry annotation %s with the writer's epoch",
			lockRef, fkv1.AnnotationEpoch)
	}
	epoch, err := fkv1.ParseEpoch(raw)
	if err != nil {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionMalformedEpoch, 0,
			"malformed epoch for lock %s: %v", lockRef, err)
	}

	policy, err := effectivePolicy(op, old, obj)
	if err != nil {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionInvalidPolicy, epoch, "%v", err)
	}

	// Rule 2: never below the object's watermark.
	if op == Update && old != nil {
		if stored, err := fkv1.ParseEpoch(old.GetAnnotations()[fkv1.AnnotationEpoch]); err == nil && epoch < stored {
			return deny(http.StatusConflict, fkv1.AdmissionStaleEpoch, epoch,
				"stale epoch %d for lock %s: object already accepted epoch %d (%s)", epoch, lockRef, stored, lock.holderText())
		}
	}

	// Rule 3: never above what the authority issued.
	if !lock.Exists || epoch > lock.Issued {
		issued := "no epoch was ever issued for it"
		if lock.Exists {
			issued = fmt.Sprintf("the last epoch issued is %d", lock.Issued)
		}
		return deny(http.StatusForbidden, fkv1.AdmissionFutureEpoch, epoch,
			"epoch %d for lock %s was never issued: %s", epoch, lockRef, issued)
	}

	// Rule 4: by default, only the current holder writes.
	if policy == fkv1.FencePolicyCurrent && epoch != lock.HeldEpoch {
		return deny(http.StatusConflict, fkv1.AdmissionNotCurrentEpoch, epoch,
			"stale epoch %d for lock %s: it is not the lock's current epoch (%s)", epoch, lockRef, lock.holderText())
	}
	return allow(fkv1.AdmissionEpochAccepted, epoch)
}

// effectivePolicy is the stored object's policy on UPDATE (so a stale writer
// cannot relax the rules with its own write), the new object's on CREATE.
func effectivePolicy(op Operation, old, obj *unstructured.Unstructured) (string, error) {
	src := obj
	if op == Update && old != nil {
		src = old
	}
	p, ok := src.GetAnnotations()[fkv1.AnnotationFencePolicy]
	if op == Update && old != nil {
		// A new policy value must itself be valid.
		if np, set := obj.GetAnnotations()[fkv1.AnnotationFencePolicy]; set && np != fkv1.FencePolicyCurrent && np != fkv1.FencePolicyMonotonic {
			return "", fmt.Errorf("invalid %s %q: use %q or %q", fkv1.AnnotationFencePolicy, np, fkv1.FencePolicyCurrent, fkv1.FencePolicyMonotonic)
		}
	}
	switch {
	case !ok || p == fkv1.FencePolicyCurrent:
		return fkv1.FencePolicyCurrent, nil
	case p == fkv1.FencePolicyMonotonic:
		return fkv1.FencePolicyMonotonic, nil
	}
	return "", fmt.Errorf("invalid %s %q: use %q or %q", fkv1.AnnotationFencePolicy, p, fkv1.FencePolicyCurrent, fkv1.FencePolicyMonotonic)
}

// ContentChanged reports whether an update changes anything outside metadata
// and status, or any fencekeeper.io/ label or annotation.
func ContentChanged(old, obj *unstructured.Unstructured) bool {
	if old == nil || obj == nil {
		return true
	}
	if !equality.Semantic.DeepEqual(content(old.Object), content(obj.Object)) {
		return true
	}
	return !equality.Semantic.DeepEqual(fenceKeys(old.GetLabels()), fenceKeys(obj.GetLabels())) ||
		!equality.Semantic.DeepEqual(fenceKeys(old.GetAnnotations()), fenceKeys(obj.GetAnnotations()))
}

func content(o map[string]any) map[string]any {
	out := make(map[string]any, len(o))
	for k, v := range o {
		switch k {
		case "metadata", "status", "apiVersion", "kind":
			continue
		}
		out[k] = v
	}
	return out
}

func fenceKeys(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if strings.HasPrefix(k, fkv1.Prefix) {
			out[k] = v
		}
	}
	return out
}

// Package fencing decides whether a write to a fenced object is allowed: the
// six rules of DESIGN §3 as pure functions of (operation, old object, new
// object, lock state), so they can be table-tested and fuzzed without an
// apiserver. The admission handler around them only decodes and looks up.
package fencing

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// AnnotationFencePolicy selects the fencing policy of one object.
const AnnotationFencePolicy = fkv1.Prefix + "fence-policy"

// Policies.
const (
	// PolicyCurrent (default): the epoch must be the lock's current held epoch.
	PolicyCurrent = "current"
	// PolicyMonotonic: only the per-object watermark and the issued bound apply.
	PolicyMonotonic = "monotonic"
)

// Operation is the admission operation.
type Operation string

// Operations the webhook is called for.
const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
)

// Reason is the machine-readable cause of a decision.
type Reason string

// Reasons.
const (
	ReasonContentWithEpoch   Reason = "EpochAccepted"
	ReasonMetadataOnly       Reason = "MetadataOnly"
	ReasonMissingEpoch       Reason = "MissingEpoch"
	ReasonMalformedEpoch     Reason = "MalformedEpoch"
	ReasonStaleEpoch         Reason = "StaleEpoch"
	ReasonNotCurrentEpoch    Reason = "NotCurrentEpoch"
	ReasonFutureEpoch        Reason = "FutureEpoch"
	ReasonLockLabelImmutable Reason = "LockLabelImmutable"
	ReasonEpochRemoved       Reason = "EpochAnnotationRemoved"
	ReasonInvalidPolicy      Reason = "InvalidFencePolicy"
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
	Reason  Reason
	// Code is the HTTP status of a denial: 409 for stale or not-current
	// epochs, 403 for a forged one, 422 for malformed input.
	Code    int32
	Message string
	// Epoch is the presented epoch (0 when there is none or it is malformed).
	Epoch int64
}

func allow(r Reason, epoch int64) Decision { return Decision{Allowed: true, Reason: r, Epoch: epoch} }

func deny(code int32, r Reason, epoch int64, format string, args ...any) Decision {
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
	e, err := ParseEpoch(obj.GetAnnotations()[fkv1.AnnotationEpoch])
	if err != nil {
		return 0, false
	}
	return e, true
}

// Decide applies DESIGN §3's rules to one write. old is nil on CREATE.
func Decide(op Operation, old, obj *unstructured.Unstructured, lock LockState) Decision {
	lockRef := lock.String()

	// Rule 5: the fencing label and the epoch annotation stay.
	if op == Update && old != nil {
		oldLock, newLock := old.GetLabels()[fkv1.LabelLock], obj.GetLabels()[fkv1.LabelLock]
		if oldLock != "" && newLock != oldLock {
			return deny(http.StatusUnprocessableEntity, ReasonLockLabelImmutable, 0,
				"the %s label of a fenced object cannot be removed or changed (it is %q; wanted %q)", fkv1.LabelLock, oldLock, newLock)
		}
		if _, had := old.GetAnnotations()[fkv1.AnnotationEpoch]; had {
			if _, has := obj.GetAnnotations()[fkv1.AnnotationEpoch]; !has {
				return deny(http.StatusUnprocessableEntity, ReasonEpochRemoved, 0,
					"the %s annotation of an object fenced by lock %s cannot be removed", fkv1.AnnotationEpoch, lockRef)
			}
		}
	}

	// Rule 6: metadata-only maintenance passes.
	if op == Update && !ContentChanged(old, obj) {
		return allow(ReasonMetadataOnly, 0)
	}

	// Rule 1: a content change carries a valid epoch.
	raw, ok := obj.GetAnnotations()[fkv1.AnnotationEpoch]
	if !ok {
		return deny(http.StatusUnprocessableEntity, ReasonMissingEpoch, 0,
			"missing epoch for lock %s: a write to an object fenced by this lock must carry annotation %s with the writer's epoch",
			lockRef, fkv1.AnnotationEpoch)
	}
	epoch, err := ParseEpoch(raw)
	if err != nil {
		return deny(http.StatusUnprocessableEntity, ReasonMalformedEpoch, 0,
			"malformed epoch for lock %s: %v", lockRef, err)
	}

	policy, err := effectivePolicy(op, old, obj)
	if err != nil {
		return deny(http.StatusUnprocessableEntity, ReasonInvalidPolicy, epoch, "%v", err)
	}

	// Rule 2: never below the object's watermark.
	if op == Update && old != nil {
		if stored, err := ParseEpoch(old.GetAnnotations()[fkv1.AnnotationEpoch]); err == nil && epoch < stored {
			return deny(http.StatusConflict, ReasonStaleEpoch, epoch,
				"stale epoch %d for lock %s: object already accepted epoch %d (%s)", epoch, lockRef, stored, lock.holderText())
		}
	}

	// Rule 3: never above what the authority issued.
	if !lock.Exists || epoch > lock.Issued {
		issued := "no epoch was ever issued for it"
		if lock.Exists {
			issued = fmt.Sprintf("the last epoch issued is %d", lock.Issued)
		}
		return deny(http.StatusForbidden, ReasonFutureEpoch, epoch,
			"epoch %d for lock %s was never issued: %s", epoch, lockRef, issued)
	}

	// Rule 4: by default, only the current holder writes.
	if policy == PolicyCurrent && epoch != lock.HeldEpoch {
		return deny(http.StatusConflict, ReasonNotCurrentEpoch, epoch,
			"stale epoch %d for lock %s: it is not the lock's current epoch (%s)", epoch, lockRef, lock.holderText())
	}
	return allow(ReasonContentWithEpoch, epoch)
}

// effectivePolicy is the stored object's policy on UPDATE (so a stale writer
// cannot relax the rules with its own write), the new object's on CREATE.
func effectivePolicy(op Operation, old, obj *unstructured.Unstructured) (string, error) {
	src := obj
	if op == Update && old != nil {
		src = old
	}
	p, ok := src.GetAnnotations()[AnnotationFencePolicy]
	if op == Update && old != nil {
		// A new policy value must itself be valid.
		if np, set := obj.GetAnnotations()[AnnotationFencePolicy]; set && np != PolicyCurrent && np != PolicyMonotonic {
			return "", fmt.Errorf("invalid %s %q: use %q or %q", AnnotationFencePolicy, np, PolicyCurrent, PolicyMonotonic)
		}
	}
	switch {
	case !ok || p == PolicyCurrent:
		return PolicyCurrent, nil
	case p == PolicyMonotonic:
		return PolicyMonotonic, nil
	}
	return "", fmt.Errorf("invalid %s %q: use %q or %q", AnnotationFencePolicy, p, PolicyCurrent, PolicyMonotonic)
}

// ParseEpoch parses an epoch: decimal digits only, no sign, no spaces, no
// leading zero, in 1..2^63-1.
func ParseEpoch(s string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("epoch is empty; want a decimal integer in 1..%d", int64(math.MaxInt64))
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("epoch %q is not a decimal integer in 1..%d", s, int64(math.MaxInt64))
		}
	}
	if s[0] == '0' {
		return 0, fmt.Errorf("epoch %q must be in 1..%d without leading zeros", s, int64(math.MaxInt64))
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("epoch %q is out of range 1..%d", s, int64(math.MaxInt64))
	}
	return v, nil
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

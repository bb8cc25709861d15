// Package fencing decides whether a write to a fenced object is allowed: the
// rules of docs/design.md §3 as pure functions of (request, lock state), so
// they can be table-tested and fuzzed without an apiserver. The admission
// handler around them only decodes, looks up and applies the decision's
// rewrite (consume the token, set the watermark).
package fencing

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Operation is the admission operation.
type Operation string

// Operations the webhook is called for.
const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
	Delete Operation = "DELETE"
)

// Request is one admission request as the rules see it.
type Request struct {
	Op Operation
	// Old is the stored object (nil on CREATE); New the object as it would be
	// stored (nil on DELETE).
	Old, New *unstructured.Unstructured
	// NamespaceTerminating is true when the object's namespace is being
	// deleted (read only for DELETE).
	NamespaceTerminating bool
	// GarbageCollector is true when the garbage collector sends the request.
	GarbageCollector bool
	// Scale is true for a write to the scale subresource, seen as an update
	// of the object (Old, New) that cannot move its watermark.
	Scale bool
}

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
	// HolderBinding is the identity the current holder claim is bound to.
	HolderBinding Binding
	// Capacity is a semaphore lock's maxHolders (docs/design.md §9); 0 or 1
	// is a mutex, whose holder is HeldEpoch. A semaphore has no single
	// holder (HeldEpoch is 0): its live permits are Permits.
	Capacity int32
	// Permits are a semaphore lock's live permits, ascending by epoch, each
	// with the identity its claim is bound to (as the Lease records it).
	Permits []PermitState
}

// PermitState is one live permit of a semaphore lock.
type PermitState struct {
	Epoch   int64
	Holder  string
	Binding Binding
}

// StateOf is the lock state a ledger records. A Lease that never granted, or
// one with a damaged counter, capacity or permit entries, counts as no lock:
// nothing may be presented against it until the authority repairs it. A
// semaphore's state names no holder, only its live permits.
func StateOf(namespace, name string, l fkv1.Ledger) LockState {
	s := LockState{Namespace: namespace, Name: name}
	if !l.Exists || !l.EpochValid || l.Epoch < 1 || l.CapacityInvalid || l.PermitsInvalid || (len(l.Permits) > 0 && !l.IsSemaphore()) {
		// Permits without a capacity above 1 are damaged too: read as a
		// free mutex they would let monotonic objects take ended epochs.
		return s
	}
	s.Exists, s.Issued = true, l.Epoch
	if l.IsSemaphore() {
		s.Capacity = l.Capacity
		for _, p := range l.Permits {
			s.Permits = append(s.Permits, PermitState{Epoch: p.Epoch, Holder: p.Holder,
				Binding: Binding{User: p.User, PodUID: p.PodUID, Known: true}})
		}
		return s
	}
	if l.Held() {
		s.HeldEpoch, s.Holder = l.Epoch, l.HolderIdentity
		s.HolderBinding = Binding{User: l.HolderUser, PodUID: l.HolderPodUID, Known: true}
	}
	return s
}

func (l LockState) String() string { return l.Namespace + "/" + l.Name }

// Semaphore reports whether the lock admits more than one holder.
func (l LockState) Semaphore() bool { return l.Capacity > 1 }

// PermitEpochs are the epochs of a semaphore's live permits, ascending.
func (l LockState) PermitEpochs() []int64 {
	out := make([]int64, 0, len(l.Permits))
	for _, p := range l.Permits {
		out = append(out, p.Epoch)
	}
	return out
}

// holds reports whether epoch is one the lock holds now: a mutex's current
// held epoch, or a live permit's of a semaphore.
func (l LockState) holds(epoch int64) bool {
	if l.Semaphore() {
		_, ok := l.permitOf(epoch)
		return ok
	}
	return epoch != 0 && epoch == l.HeldEpoch
}

func (l LockState) permitOf(epoch int64) (PermitState, bool) {
	for _, p := range l.Permits {
		if p.Epoch == epoch {
			return p, true
		}
	}
	return PermitState{}, false
}

// currentEpochText and currentHolderText name what rules 6 and 7 ask for:
// the lock's current epoch and holder, or for a semaphore a live permit's.
func (l LockState) currentEpochText() string {
	if l.Semaphore() {
		return "a live permit's epoch"
	}
	return "the lock's current epoch"
}

func (l LockState) currentHolderText() string {
	if l.Semaphore() {
		return "a live permit's holder"
	}
	return "the lock's current holder"
}

func (l LockState) holderText() string {
	if l.Semaphore() {
		if len(l.Permits) == 0 {
			return fmt.Sprintf("semaphore of %d holders: no permit is live, last epoch %d", l.Capacity, l.Issued)
		}
		live := make([]string, len(l.Permits))
		for i, p := range l.Permits {
			live[i] = fmt.Sprintf("epoch %d (%s)", p.Epoch, p.Holder)
		}
		return fmt.Sprintf("semaphore of %d holders, live permits: %s", l.Capacity, strings.Join(live, ", "))
	}
	if l.HeldEpoch == 0 {
		return fmt.Sprintf("lock is free, last epoch %d", l.Issued)
	}
	return fmt.Sprintf("current holder %s, epoch %d", l.Holder, l.HeldEpoch)
}

// Decision is an admission verdict.
type Decision struct {
	Allowed bool
	Reason  fkv1.AdmissionReason
	// Code is the HTTP status of a denial: 403 for a fencing refusal, 422
	// for malformed input. Never 409: kubectl and client-go's retry helpers
	// retry a Conflict, so a stale write would be repeated for seconds
	// before it fails.
	Code    int32
	Message string
	// Epoch is the presented epoch (0 when there is none or it is malformed).
	Epoch int64
	// Watermark, on an allowed content write, is the fenced-epoch the stored
	// object gets (the presented epoch); the token is consumed with it. A
	// scale sets none.
	Watermark int64
}

func allow(r fkv1.AdmissionReason, epoch int64) Decision {
	return Decision{Allowed: true, Reason: r, Epoch: epoch}
}

func deny(code int32, r fkv1.AdmissionReason, epoch int64, format string, args ...any) Decision {
	return Decision{Reason: r, Code: code, Epoch: epoch, Message: fmt.Sprintf(format, args...)}
}

// LockName returns the lock an object is fenced by and whether it carries
// the fencing label at all (an empty value is fenced, and refused): the new
// object's label, or the old one's when the write removes it.
func LockName(old, obj *unstructured.Unstructured) (string, bool) {
	for _, u := range []*unstructured.Unstructured{obj, old} {
		if u == nil {
			continue
		}
		if l, ok := u.GetLabels()[fkv1.LabelLock]; ok {
			return l, true
		}
	}
	return "", false
}

// Presented returns the epoch token this request presents, if any. The
// stored object never carries a token (admission consumes it), so a token on
// the new object was sent with this request. Objects written before tokens
// were consumed (or given one back by another mutating webhook) store one; a
// token equal to that stored one cannot be told from one the request merely
// inherited, so it is not presented.
func Presented(r Request) (raw string, ok bool) {
	if r.New == nil {
		return "", false
	}
	raw, ok = r.New.GetAnnotations()[fkv1.AnnotationEpoch]
	if ok && r.Old != nil {
		if stored, had := r.Old.GetAnnotations()[fkv1.AnnotationEpoch]; had && stored == raw {
			return "", false
		}
	}
	return raw, ok
}

// legacyConversion reports whether an update only renames a stored token
// (objects written before tokens were consumed) into the watermark:
// fencekeeper.io/epoch N removed, fencekeeper.io/fenced-epoch N added,
// nothing else changed. It moves no watermark, so it needs no epoch.
func legacyConversion(r Request) bool {
	if r.Op != Update || r.Old == nil || r.New == nil {
		return false
	}
	oa, na := r.Old.GetAnnotations(), r.New.GetAnnotations()
	token, had := oa[fkv1.AnnotationEpoch]
	_, hadWM := oa[fkv1.AnnotationFencedEpoch]
	_, stillToken := na[fkv1.AnnotationEpoch]
	if !had || hadWM || stillToken || na[fkv1.AnnotationFencedEpoch] != token {
		return false
	}
	renamed := r.New.DeepCopy()
	a := renamed.GetAnnotations()
	delete(a, fkv1.AnnotationFencedEpoch)
	a[fkv1.AnnotationEpoch] = token
	renamed.SetAnnotations(a)
	return !ContentChanged(r.Old, renamed)
}

// NeedsLock reports whether Decide will consult the lock state, and the
// epoch it will be checked against; the handler reads the Lease only then.
func NeedsLock(r Request) (int64, bool) {
	if r.Op == Delete {
		return markOf(r.Old), r.Old != nil && !r.NamespaceTerminating && !r.GarbageCollector
	}
	if r.Op == Update && !ContentChanged(r.Old, r.New) {
		return 0, false
	}
	raw, ok := Presented(r)
	if !ok {
		return 0, false
	}
	e, err := fkv1.ParseEpoch(raw)
	if err != nil {
		return 0, false
	}
	return e, true
}

// Decide applies the rules of docs/design.md §3 to one write.
func Decide(r Request, lock LockState) Decision {
	if r.Op == Delete {
		return decideDelete(r, lock)
	}
	lockRef := lock.String()

	// Rule 5: the fencing label is never emptied, removed or changed. Objects
	// that already carry an empty value (older versions treated it as
	// unfenced) may keep it or drop it.
	newLock, labeled := r.New.GetLabels()[fkv1.LabelLock]
	oldLock, hadLabel := "", false
	if r.Op == Update && r.Old != nil {
		oldLock, hadLabel = r.Old.GetLabels()[fkv1.LabelLock]
	}
	if hadLabel && oldLock == "" && (!labeled || newLock == "") {
		return allow(fkv1.AdmissionMetadataOnly, 0)
	}
	if labeled && newLock == "" {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionEmptyLockLabel, 0,
			"the %s label must name a lock; an empty value is not allowed", fkv1.LabelLock)
	}
	if hadLabel && newLock != oldLock {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionLockLabelImmutable, 0,
			"the %s label of a fenced object cannot be removed or changed (it is %q; wanted %q)", fkv1.LabelLock, oldLock, newLock)
	}
	if legacyConversion(r) {
		return allow(fkv1.AdmissionMetadataOnly, 0)
	}

	// Rule 8: metadata-only maintenance passes.
	if r.Op == Update && !ContentChanged(r.Old, r.New) {
		return allow(fkv1.AdmissionMetadataOnly, 0)
	}

	// Rule 1: a content change presents a valid epoch in this request.
	raw, ok := Presented(r)
	if !ok {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionMissingEpoch, 0,
			"missing epoch for lock %s: every content write to an object fenced by this lock must present the writer's epoch "+
				"in annotation %s (it is consumed by each write and never stored, so re-stamp it on every patch, edit or apply)",
			lockRef, fkv1.AnnotationEpoch)
	}
	epoch, err := fkv1.ParseEpoch(raw)
	if err != nil {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionMalformedEpoch, 0,
			"malformed epoch for lock %s: %v", lockRef, err)
	}

	policy, err := effectivePolicy(r)
	if err != nil {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionInvalidPolicy, epoch, "%v", err)
	}
	// A semaphore's holders write concurrently, so the watermark rule does
	// not apply to its objects; monotonic (rules 1-3 only) would then accept
	// every epoch ever issued. An object of a semaphore lock cannot be
	// written carrying it (the write that removes it is judged as current).
	if lock.Semaphore() && r.New.GetAnnotations()[fkv1.AnnotationFencePolicy] == fkv1.FencePolicyMonotonic {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionInvalidPolicy, epoch,
			"%s %q is not allowed on objects of lock %s, a semaphore of %d holders: its holders write concurrently, so the "+
				"object's watermark (rule 2) does not apply, and without it %q would accept every epoch ever issued for the lock; "+
				"remove the annotation (only a live permit's epoch is accepted)",
			fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic, lockRef, lock.Capacity, fkv1.FencePolicyMonotonic)
	}

	// Rule 2: never below the object's watermark (not for a semaphore,
	// whose holders write concurrently by design).
	if r.Op == Update && isFenced(r.Old) && !lock.Semaphore() {
		if stored := watermarkOf(r.Old); epoch < stored {
			return deny(http.StatusForbidden, fkv1.AdmissionStaleEpoch, epoch,
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

	// Rule 4 for a semaphore, its only policy: a live permit holds the
	// presented epoch.
	if lock.Semaphore() && !lock.holds(epoch) {
		return deny(http.StatusForbidden, fkv1.AdmissionNotCurrentEpoch, epoch,
			"stale epoch %d for lock %s: no live permit holds it (%s)", epoch, lockRef, lock.holderText())
	}
	// Rule 4: by default, only the current holder writes.
	if !lock.Semaphore() && policy == fkv1.FencePolicyCurrent && epoch != lock.HeldEpoch {
		why := lock.holderText()
		if lock.HeldEpoch == 0 && epoch == lock.Issued {
			// The writer's own lease ended and nobody holds the lock since:
			// the commonest surprise (nothing renewed a hand-made claim).
			why = fmt.Sprintf("lock is free: the lease of epoch %d ended (expired without renewal for its TTL, or released); acquire the lock again for a new epoch", epoch)
		}
		return deny(http.StatusForbidden, fkv1.AdmissionNotCurrentEpoch, epoch,
			"stale epoch %d for lock %s: it is not the lock's current epoch (%s)", epoch, lockRef, why)
	}
	// Rules 6 and 7: what a stale epoch must not leave behind for itself
	// under monotonic is checked against the current epoch, whatever the
	// policy.
	if d, refused := needsCurrent(r, epoch, lock); refused {
		return d
	}
	// A deletion mark names the epoch that writes it.
	if m, set := r.New.GetAnnotations()[fkv1.AnnotationDeleteEpoch]; set && m != fkv1.FormatEpoch(epoch) &&
		(r.Old == nil || r.Old.GetAnnotations()[fkv1.AnnotationDeleteEpoch] != m) {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionInvalidDeleteMark, epoch,
			"%s must be the epoch this write presents (%d), not %q", fkv1.AnnotationDeleteEpoch, epoch, m)
	}
	// Fencing an object cannot adopt what it got while unfenced: anyone who
	// could write it then could have planted it for the holder to inherit.
	if what, ok := inheritedFromUnfenced(r, epoch); ok {
		return deny(http.StatusUnprocessableEntity, fkv1.AdmissionInheritedFromUnfenced, epoch,
			"the write that fences this object with lock %s keeps %s", lockRef, what)
	}
	d := allow(fkv1.AdmissionEpochAccepted, epoch)
	if !r.Scale {
		d.Watermark = epoch
	}
	return d
}

// needsCurrent refuses, under every policy, the writes that only the
// current holder (of a semaphore: a live permit) may make: adding an owner
// or changing one's uid (an owner decides when the garbage collector
// deletes the object, rule 6), and a scale (rule 7). A scale cannot move
// the watermark (its body is not the object), so it is accepted only when
// the watermark already is the presented epoch: a scale by epoch 42 over
// watermark 41 would leave 41 free to write or delete under monotonic.
func needsCurrent(r Request, epoch int64, lock LockState) (Decision, bool) {
	lockRef := lock.String()
	switch {
	case r.Op == Update && r.Old != nil && addsOwner(r.Old, r.New) && !lock.holds(epoch):
		return deny(http.StatusForbidden, fkv1.AdmissionNotCurrentEpoch, epoch,
			"stale epoch %d for lock %s: adding an owner reference, or changing one's uid, needs %s "+
				"under every fence policy, since an owner decides when the garbage collector deletes the object (%s)",
			epoch, lockRef, lock.currentEpochText(), lock.holderText()), true
	case !r.Scale:
		return Decision{}, false
	case !lock.holds(epoch):
		return deny(http.StatusForbidden, fkv1.AdmissionNotCurrentEpoch, epoch,
			"stale epoch %d for lock %s: a scale is accepted only from %s, under every fence policy (%s)",
			epoch, lockRef, lock.currentHolderText(), lock.holderText()), true
	case watermarkOf(r.Old) != epoch:
		return deny(http.StatusForbidden, fkv1.AdmissionScaleBeforeFencedWrite, epoch,
			"scale presenting epoch %d of lock %s refused: the object's watermark (%s) is %d, and a scale cannot move it; "+
				"make one fenced write of the object presenting epoch %d first (any content change, or re-applying it with %s=%d), then scale",
			epoch, lockRef, fkv1.AnnotationFencedEpoch, watermarkOf(r.Old), epoch, fkv1.AnnotationEpoch, epoch), true
	}
	return Decision{}, false
}

// inheritedFromUnfenced finds, on an update that adds the fencing label,
// what the new object keeps from the unfenced one that relaxes the rules:
// fence-identity any, fence-policy monotonic, a deletion mark for the
// presented epoch (a mark of another epoch is dropped by the rewrite), an
// owner reference (the garbage collector deletes a fenced object whose owner
// is gone), or a deletion in progress (removing the last finalizer, a
// metadata-only write, would complete it).
func inheritedFromUnfenced(r Request, epoch int64) (what string, found bool) {
	if r.Op != Update || r.Old == nil || isFenced(r.Old) || !isFenced(r.New) {
		return "", false
	}
	const remove = ", which the object carried while it was unfenced (anyone who could write it then could have set it): " +
		"remove it in this write and set it again with a later fenced write, or create the object fenced with it"
	if ts := r.Old.GetDeletionTimestamp(); ts != nil {
		return fmt.Sprintf("a deletion requested at %s while it was unfenced: an object being deleted cannot be fenced; "+
			"create it fenced once it is gone", ts.UTC().Format(time.RFC3339)), true
	}
	oldA, newA := r.Old.GetAnnotations(), r.New.GetAnnotations()
	for _, k := range []struct{ key, value string }{
		{fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny},
		{fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic},
		{fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(epoch)},
	} {
		if v, ok := oldA[k.key]; ok && v == k.value && newA[k.key] == v {
			return fmt.Sprintf("annotation %s=%q", k.key, v) + remove, true
		}
	}
	had := owners(r.Old)
	for _, o := range r.New.GetOwnerReferences() {
		if had[ownerOf(o)] {
			return fmt.Sprintf("owner reference %s %s (uid %s)", o.Kind, o.Name, o.UID) + remove, true
		}
	}
	return "", false
}

// decideDelete is rule 6: a fenced object is deleted by namespace deletion,
// by the garbage collector, or by the current holder after a fenced write
// marked it (AnnotationDeleteEpoch equal to the watermark). The mark must be
// the lock's current held epoch (of a semaphore: a live permit's) under
// every policy: monotonic relaxes writes, not deletes.
func decideDelete(r Request, lock LockState) Decision {
	switch {
	case r.NamespaceTerminating:
		return allow(fkv1.AdmissionNamespaceDeletion, 0)
	case r.GarbageCollector:
		return allow(fkv1.AdmissionGarbageCollection, 0)
	}
	lockRef := lock.String()
	how := fmt.Sprintf("to delete it, %s first writes annotation %s=<its epoch> with a fenced write "+
		"(presenting the same epoch in %s), then deletes", lock.currentHolderText(), fkv1.AnnotationDeleteEpoch, fkv1.AnnotationEpoch)
	mark := markOf(r.Old)
	if mark == 0 {
		return deny(http.StatusForbidden, fkv1.AdmissionDeleteNotMarked, 0,
			"object fenced by lock %s is not marked for deletion: %s", lockRef, how)
	}
	if stored := watermarkOf(r.Old); mark != stored {
		return deny(http.StatusForbidden, fkv1.AdmissionStaleEpoch, mark,
			"stale delete for lock %s: marked by epoch %d but the object has since accepted epoch %d (%s); %s",
			lockRef, mark, stored, lock.holderText(), how)
	}
	if !lock.holds(mark) {
		return deny(http.StatusForbidden, fkv1.AdmissionNotCurrentEpoch, mark,
			"stale delete for lock %s: marked by epoch %d, which is not %s (%s); %s",
			lockRef, mark, lock.currentEpochText(), lock.holderText(), how)
	}
	return allow(fkv1.AdmissionDeleteMarked, mark)
}

// effectivePolicy is the stored object's policy on UPDATE (so a stale writer
// cannot relax the rules with its own write) and always current on CREATE
// (so delete + re-create cannot roll a watermark back). A new policy value
// must itself be valid.
func effectivePolicy(r Request) (string, error) {
	if np, set := r.New.GetAnnotations()[fkv1.AnnotationFencePolicy]; set && np != fkv1.FencePolicyCurrent && np != fkv1.FencePolicyMonotonic {
		return "", fmt.Errorf("invalid %s %q: use %q or %q", fkv1.AnnotationFencePolicy, np, fkv1.FencePolicyCurrent, fkv1.FencePolicyMonotonic)
	}
	if r.Op == Create || r.Old == nil || !isFenced(r.Old) {
		// Fencing an object (creating it, or adding the label) is checked as
		// current: its unfenced past says nothing.
		return fkv1.FencePolicyCurrent, nil
	}
	return policyOf(r.Old)
}

func policyOf(u *unstructured.Unstructured) (string, error) {
	p, ok := u.GetAnnotations()[fkv1.AnnotationFencePolicy]
	switch {
	case !ok || p == fkv1.FencePolicyCurrent:
		return fkv1.FencePolicyCurrent, nil
	case p == fkv1.FencePolicyMonotonic:
		return fkv1.FencePolicyMonotonic, nil
	}
	return "", fmt.Errorf("invalid %s %q: use %q or %q", fkv1.AnnotationFencePolicy, p, fkv1.FencePolicyCurrent, fkv1.FencePolicyMonotonic)
}

// watermarkOf is the stored object's watermark: its fenced-epoch, or for an
// object written before tokens were consumed, its stored token (0: none).
func watermarkOf(u *unstructured.Unstructured) int64 {
	if u == nil {
		return 0
	}
	a := u.GetAnnotations()
	raw, ok := a[fkv1.AnnotationFencedEpoch]
	if !ok {
		raw = a[fkv1.AnnotationEpoch]
	}
	e, err := fkv1.ParseEpoch(raw)
	if err != nil {
		return 0
	}
	return e
}

func isFenced(u *unstructured.Unstructured) bool {
	l, ok := u.GetLabels()[fkv1.LabelLock]
	return ok && l != ""
}

func markOf(u *unstructured.Unstructured) int64 {
	if u == nil {
		return 0
	}
	e, err := fkv1.ParseEpoch(u.GetAnnotations()[fkv1.AnnotationDeleteEpoch])
	if err != nil {
		return 0
	}
	return e
}

// ContentChanged reports whether an update changes anything outside metadata
// and status, any fencekeeper.io/ label or annotation, or an annotation that
// holds content at the version written (contentAnnotation).
func ContentChanged(old, obj *unstructured.Unstructured) bool {
	if old == nil || obj == nil {
		return true
	}
	if !equality.Semantic.DeepEqual(content(old.Object), content(obj.Object)) {
		return true
	}
	// A new owner can have the garbage collector delete the object.
	if addsOwner(old, obj) {
		return true
	}
	// Who owns which field decides what the holder's next apply prunes.
	if ApplyInputsChanged(old, obj) {
		return true
	}
	return !equality.Semantic.DeepEqual(keysWhere(old.GetLabels(), fenceKey), keysWhere(obj.GetLabels(), fenceKey)) ||
		!equality.Semantic.DeepEqual(keysWhere(old.GetAnnotations(), contentAnnotation), keysWhere(obj.GetAnnotations(), contentAnnotation))
}

// hpaV1Prefix: autoscaling/v1 keeps the HorizontalPodAutoscaler spec fields
// it cannot express (spec.behavior, metrics other than CPU, tolerances) in
// annotations under this prefix, and the apiserver stores what they say as
// those fields. Written through autoscaling/v1, they are content. Its
// status fields there are not (status is not fenced).
const hpaV1Prefix = "autoscaling.alpha.kubernetes.io/"

var hpaV1Status = map[string]bool{hpaV1Prefix + "current-metrics": true, hpaV1Prefix + "conditions": true}

// contentAnnotation reports whether a change of annotation k is a content
// change: the fencekeeper.io/ ones, and those that carry spec fields
// (hpaV1Prefix; policies.yaml says the same in CEL).
func contentAnnotation(k string) bool {
	return fenceKey(k) || k == lastApplied || (strings.HasPrefix(k, hpaV1Prefix) && !hpaV1Status[k])
}

// lastApplied is what kubectl's client-side apply diffs against: changed,
// it decides what the holder's next `kubectl apply` removes.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

func fenceKey(k string) bool { return strings.HasPrefix(k, fkv1.Prefix) }

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

// keysWhere is the part of m whose keys keep says.
func keysWhere(m map[string]string, keep func(string) bool) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if keep(k) {
			out[k] = v
		}
	}
	return out
}

// addsOwner reports whether obj names an owner that old does not. An owner
// is its whole reference, not only its UID: the garbage collector looks it
// up by apiVersion, kind and name, and deletes the dependent when that
// finds nothing (or another UID), so renaming an owner in place is adding
// one that does not exist.
func addsOwner(old, obj *unstructured.Unstructured) bool {
	had := owners(old)
	for _, o := range obj.GetOwnerReferences() {
		if !had[ownerOf(o)] {
			return true
		}
	}
	return false
}

// owner is what identifies an owner reference to the garbage collector.
type owner struct {
	apiVersion, kind, name string
	uid                    types.UID
}

func ownerOf(o metav1.OwnerReference) owner { return owner{o.APIVersion, o.Kind, o.Name, o.UID} }

func owners(u *unstructured.Unstructured) map[owner]bool {
	had := map[owner]bool{}
	for _, o := range u.GetOwnerReferences() {
		had[ownerOf(o)] = true
	}
	return had
}

// StatusWrite decides a write to the status subresource of a fenced
// object. Its content is not fenced (rule 7), but some built-in kinds
// (Deployments, StatefulSets, Jobs, ...) keep the metadata a status write
// sends, so it must not change what fences the object: a fencekeeper.io/
// annotation added or set to another value, or a new owner (the garbage
// collector would delete the object for an owner that does not exist), is
// refused. What a status write leaves out (a client sending an object
// without labels or annotations, which custom resources drop anyway) is not
// refused: a caller that sees the request before the kind's status rules
// puts it back with RestoreFencingMetadata.
func StatusWrite(old, obj *unstructured.Unstructured) Decision {
	if old == nil || obj == nil {
		return Decision{Allowed: true, Reason: fkv1.AdmissionMetadataOnly}
	}
	oldA := old.GetAnnotations()
	for k, v := range obj.GetAnnotations() {
		if w, ok := oldA[k]; contentAnnotation(k) && (!ok || w != v) {
			return statusDenial("annotation " + k)
		}
	}
	if addsOwner(old, obj) {
		return statusDenial("owners")
	}
	// A custom resource's status strategy keeps the new managedFields of
	// top-level fields it does not reset: ownership of content.
	if ApplyInputsChanged(old, obj) {
		return statusDenial("field ownership (managedFields outside status)")
	}
	return Decision{Allowed: true, Reason: fkv1.AdmissionMetadataOnly}
}

func statusDenial(what string) Decision {
	return Decision{Code: http.StatusForbidden, Reason: fkv1.AdmissionStatusChangesFencing,
		Message: "a write to the status subresource cannot change the " + what + " of a fenced object: write the object itself, presenting your epoch"}
}

// RestoreFencingMetadata returns obj with the lock label (present or
// absent, with its value) and every annotation that is content
// (contentAnnotation: the fencekeeper.io/ ones, last-applied-configuration,
// ...) exactly as old has them.
func RestoreFencingMetadata(old, obj *unstructured.Unstructured) *unstructured.Unstructured {
	out := obj.DeepCopy()
	labels := out.GetLabels()
	if v, ok := old.GetLabels()[fkv1.LabelLock]; ok {
		if labels == nil {
			labels = map[string]string{}
		}
		labels[fkv1.LabelLock] = v
	} else {
		delete(labels, fkv1.LabelLock)
	}
	out.SetLabels(labels)
	ann := map[string]string{}
	for k, v := range out.GetAnnotations() {
		if !contentAnnotation(k) {
			ann[k] = v
		}
	}
	for k, v := range old.GetAnnotations() {
		if contentAnnotation(k) {
			ann[k] = v
		}
	}
	if len(ann) == 0 {
		ann = nil
	}
	out.SetAnnotations(ann)
	return out
}

package fencing

import (
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

const lockLabel = "fencekeeper.io/lock"

// stored builds a fenced ConfigMap as the apiserver stores it: data and the
// watermark ("-" = none), plus metadata tweaks.
func stored(data, watermark string, tweak ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "report-2026-07", "namespace": "reports"},
		"data":     map[string]any{"report.csv": data},
	}}
	u.SetLabels(map[string]string{lockLabel: "report-2026-07"})
	if watermark != "-" {
		u.SetAnnotations(map[string]string{fkv1.AnnotationFencedEpoch: watermark})
	}
	for _, t := range tweak {
		t(u)
	}
	return u
}

// write is the object a request would store: old (nil for a create) with new
// data and the presented token ("-" = none), plus tweaks. It keeps whatever
// else old carries, as a patch or a read-modify-write does.
func write(old *unstructured.Unstructured, data, token string, tweak ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	var u *unstructured.Unstructured
	if old == nil {
		u = stored(data, "-")
	} else {
		u = old.DeepCopy()
		u.Object["data"] = map[string]any{"report.csv": data}
	}
	if token != "-" {
		withAnnotation(fkv1.AnnotationEpoch, token)(u)
	}
	for _, t := range tweak {
		t(u)
	}
	return u
}

func withAnnotation(k, v string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		a := u.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[k] = v
		u.SetAnnotations(a)
	}
}

func withoutAnnotation(k string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		a := u.GetAnnotations()
		delete(a, k)
		u.SetAnnotations(a)
	}
}

// withLabel sets a label; "<none>" removes it.
func withLabel(k, v string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		l := u.GetLabels()
		if v == "<none>" {
			delete(l, k)
		} else {
			l[k] = v
		}
		u.SetLabels(l)
	}
}

// W2 holds epoch 42; 42 is also the last issued.
var heldBy42 = LockState{Namespace: "reports", Name: "report-2026-07", Exists: true, Issued: 42, HeldEpoch: 42, Holder: "W2"}

// scale is a write to the scale subresource as the handler sees it: the
// stored object, changed, presenting token ("-" = none).
func scale(old *unstructured.Unstructured, token string) Request {
	obj := old.DeepCopy()
	obj.Object["fencekeeper.io/scale"] = int64(5)
	if token != "-" {
		withAnnotation(fkv1.AnnotationEpoch, token)(obj)
	}
	return Request{Op: Update, Old: old, New: obj, Scale: true}
}

func applyBy(manager, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
}

func updateBy(manager, fields string) metav1.ManagedFieldsEntry {
	e := applyBy(manager, fields)
	e.Operation = metav1.ManagedFieldsOperationUpdate
	return e
}

func managed(entries ...metav1.ManagedFieldsEntry) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) { u.SetManagedFields(entries) }
}

func update(old, obj *unstructured.Unstructured) Request {
	return Request{Op: Update, Old: old, New: obj}
}
func create(obj *unstructured.Unstructured) Request { return Request{Op: Create, New: obj} }
func del(old *unstructured.Unstructured) Request    { return Request{Op: Delete, Old: old} }

func TestDecide(t *testing.T) {
	free := heldBy42
	free.HeldEpoch, free.Holder = 0, ""
	monotonic := withAnnotation(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)
	optOut := withAnnotation(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)
	markAt := func(e string) func(*unstructured.Unstructured) { return withAnnotation(fkv1.AnnotationDeleteEpoch, e) }
	ownedBy := func(uid string) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "bait", UID: types.UID(uid)}})
		}
	}
	deleting := func(u *unstructured.Unstructured) {
		u.SetFinalizers([]string{"example.com/x"})
		u.SetDeletionTimestamp(&metav1.Time{Time: time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)})
	}
	at42 := stored("v12", "42")
	at40 := stored("v10", "40")
	cases := []struct {
		name      string
		req       Request
		lock      LockState
		allow     bool
		reason    fkv1.AdmissionReason
		code      int32
		msg       string
		watermark int64
	}{
		// Rule 1: every content write presents its own, valid epoch.
		{name: "create with the current epoch", req: create(write(nil, "v12", "42")), lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "create without an epoch", req: create(write(nil, "v12", "-")), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch, code: 422, msg: "missing epoch for lock reports/report-2026-07"},
		{name: "update without an epoch (merge patch, kubectl edit)", req: update(at42, write(at42, "v13", "-")), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch, code: 422, msg: "re-stamp it on every patch"},
		{name: "the stored watermark is never a token", req: update(at42, write(at42, "v13", "-")), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "epoch abc", req: update(at40, write(at40, "v12", "abc")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch, code: 422, msg: `epoch "abc" is not a decimal integer`},
		{name: "epoch -1", req: update(at40, write(at40, "v12", "-1")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch 0", req: update(at40, write(at40, "v12", "0")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch +5", req: update(at40, write(at40, "v12", "+5")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch ' 5'", req: update(at40, write(at40, "v12", " 5")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch 2^63", req: update(at40, write(at40, "v12", "9223372036854775808")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch, msg: "out of range"},
		{name: "epoch empty", req: update(at40, write(at40, "v12", "")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch 042", req: update(at40, write(at40, "v12", "042")), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},

		// Rule 2: the per-object watermark.
		{name: "equal to the watermark", req: update(at42, write(at42, "v13", "42")), lock: heldBy42, allow: true, watermark: 42},
		{name: "one below the watermark (the paused W1)", req: update(at42, write(at42, "v11", "41")), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch, code: http.StatusForbidden,
			msg: "stale epoch 41 for lock reports/report-2026-07: object already accepted epoch 42 (current holder W2, epoch 42)"},
		{name: "one below the watermark under monotonic", req: update(stored("v12", "42", monotonic), write(stored("v12", "42", monotonic), "v11", "41")), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch, code: 403},
		{name: "a full update from a stale copy (old watermark in the body)", req: update(at42, write(stored("v11", "41"), "v11", "41")), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch},
		{name: "one above the watermark raises it", req: update(stored("v11", "41"), write(stored("v11", "41"), "v12", "42")), lock: heldBy42, allow: true, watermark: 42},
		{name: "presenting an epoch without other changes is a content write", req: update(at42, write(at42, "v12", "41")), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch},

		// Rule 3: the issued bound.
		{name: "one above the issued epoch (forged)", req: update(at40, write(at40, "v12", "43")), lock: heldBy42, reason: fkv1.AdmissionFutureEpoch, code: http.StatusForbidden,
			msg: "epoch 43 for lock reports/report-2026-07 was never issued: the last epoch issued is 42"},
		{name: "forged under monotonic", req: update(stored("v11", "41", monotonic), write(stored("v11", "41", monotonic), "v12", "43")), lock: heldBy42, reason: fkv1.AdmissionFutureEpoch},
		{name: "unknown lock", req: create(write(nil, "v1", "1")), lock: LockState{Namespace: "reports", Name: "report-2026-07"}, reason: fkv1.AdmissionFutureEpoch, msg: "no epoch was ever issued"},

		// Rule 4: current versus monotonic.
		{name: "untouched object, stale holder, policy current", req: update(at40, write(at40, "v11", "41")), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch, code: 403,
			msg: "stale epoch 41 for lock reports/report-2026-07: it is not the lock's current epoch (current holder W2, epoch 42)"},
		{name: "untouched object, stale holder, policy monotonic", req: update(stored("v10", "40", monotonic), write(stored("v10", "40", monotonic), "v11", "41")), lock: heldBy42, allow: true, watermark: 41},
		{name: "lock free: nobody writes under current, and the last holder is told its lease ended", req: update(at42, write(at42, "v13", "42")), lock: free, reason: fkv1.AdmissionNotCurrentEpoch,
			msg: "stale epoch 42 for lock reports/report-2026-07: it is not the lock's current epoch (lock is free: the lease of epoch 42 ended (expired without renewal for its TTL, or released); acquire the lock again for a new epoch)"},
		{name: "lock free: an older holder is told the last epoch", req: update(at40, write(at40, "v13", "41")), lock: free, reason: fkv1.AdmissionNotCurrentEpoch, msg: "lock is free, last epoch 42"},
		{name: "lock free: monotonic still accepts the last epoch", req: update(stored("v12", "42", monotonic), write(stored("v12", "42", monotonic), "v13", "42")), lock: free, allow: true, watermark: 42},
		{name: "a stale writer cannot relax the policy with its own write", req: update(at40, write(at40, "v11", "41", monotonic)), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch},
		{name: "create always uses current: delete + re-create cannot roll a watermark back", req: create(write(nil, "v1", "41", monotonic)), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch},
		{name: "invalid policy", req: create(write(nil, "v1", "42", withAnnotation(fkv1.AnnotationFencePolicy, "lenient"))), lock: heldBy42, reason: fkv1.AdmissionInvalidPolicy, code: 422},

		// Rule 5: the label stays, is never empty; the watermark is admission's.
		{name: "fencing label removed", req: update(at42, write(at42, "v12", "42", withLabel(lockLabel, "<none>"))), lock: heldBy42, reason: fkv1.AdmissionLockLabelImmutable, code: 422},
		{name: "fencing label pointed at another lock", req: update(at42, write(at42, "v12", "42", withLabel(lockLabel, "other"))), lock: heldBy42, reason: fkv1.AdmissionLockLabelImmutable},
		{name: "fencing label emptied", req: update(at42, write(at42, "v12", "42", withLabel(lockLabel, ""))), lock: heldBy42, reason: fkv1.AdmissionEmptyLockLabel, code: 422},
		{name: "created with an empty fencing label", req: create(write(nil, "v1", "42", withLabel(lockLabel, ""))), lock: heldBy42, reason: fkv1.AdmissionEmptyLockLabel},
		{name: "fencing an unfenced object needs an epoch", req: update(stored("v12", "-", withLabel(lockLabel, "<none>")), write(stored("v12", "-"), "v12", "-")), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "setting the watermark without a token", req: update(at40, write(at40, "v10", "-", withAnnotation(fkv1.AnnotationFencedEpoch, "42"))), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "removing the watermark without a token", req: update(at40, write(at40, "v10", "-", withoutAnnotation(fkv1.AnnotationFencedEpoch))), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "a writer's own watermark is replaced by the presented epoch", req: update(at40, write(at40, "v11", "42", withAnnotation(fkv1.AnnotationFencedEpoch, "99"))), lock: heldBy42, allow: true, watermark: 42},

		// Objects stored before tokens were consumed carry a token: it is never presented by inheritance.
		{name: "legacy object: an inherited (even current) token is not presented", req: update(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "42")), write(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "42")), "v13", "-")), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "legacy object: a stale MergeFrom whose diff drops the token is refused",
			req:  update(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "42")), write(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "42")), "v11 by W1", "-")),
			lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "legacy object: its stored token is the watermark", req: update(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "42")), write(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "42")), "v11", "41")), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch},
		{name: "legacy object: renaming the token into the watermark, nothing else, is metadata-only",
			req: update(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "41")), stored("v12", "41")), lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "legacy object: a rename that also changes data needs an epoch",
			req: update(stored("v12", "-", withAnnotation(fkv1.AnnotationEpoch, "41")), stored("v13", "41")), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},

		// Review findings: owners, late fencing, empty labels, delete marks.
		{name: "adding an owner (the garbage collector could delete it) needs an epoch",
			req: update(at42, write(at42, "v12", "-", func(u *unstructured.Unstructured) {
				u.Object["metadata"].(map[string]any)["ownerReferences"] = []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "ghost-uid"}}
			})), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "renaming an owner in place (same UID: the garbage collector finds none and deletes the object) needs an epoch",
			req: update(stored("v12", "42", ownedBy("owner-uid")), write(stored("v12", "42", ownedBy("owner-uid")), "v12", "-", func(u *unstructured.Unstructured) {
				u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "elsewhere", UID: "owner-uid"}})
			})), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "fencing an unfenced object is checked as current, whatever its old annotations say",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>"), monotonic), write(stored("v1", "-", monotonic), "stale by W1", "41")),
			lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch},
		{name: "fencing an object that carried fence-identity any while unfenced",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>"), optOut), write(stored("v1", "-", optOut), "v2", "42")),
			lock: heldBy42, reason: fkv1.AdmissionInheritedFromUnfenced, code: 422, msg: `keeps annotation fencekeeper.io/fence-identity="any", which the object carried while it was unfenced`},
		{name: "fencing an object that carried fence-policy monotonic while unfenced",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>"), monotonic), write(stored("v1", "-", monotonic), "v2", "42")),
			lock: heldBy42, reason: fkv1.AdmissionInheritedFromUnfenced, msg: "fencekeeper.io/fence-policy"},
		{name: "fencing an object that carried a deletion mark for the presented epoch while unfenced",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>"), markAt("42")), write(stored("v1", "-", markAt("42")), "v2", "42")),
			lock: heldBy42, reason: fkv1.AdmissionInheritedFromUnfenced, msg: "fencekeeper.io/delete-epoch"},
		{name: "fencing an object that carried a deletion mark of another epoch: the rewrite drops it",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>"), markAt("41")), write(stored("v1", "-", markAt("41")), "v2", "42")),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "fencing an object and removing what it carried unfenced in the same write",
			req: update(stored("v1", "-", withLabel(lockLabel, "<none>"), optOut, monotonic),
				write(stored("v1", "-"), "v2", "42", withoutAnnotation(fkv1.AnnotationFenceIdentity), withoutAnnotation(fkv1.AnnotationFencePolicy))),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "fencing an object with relaxations the fencing write sets itself",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>")), write(stored("v1", "-"), "v2", "42", optOut, monotonic)),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "fencing an object that carried an owner while unfenced (the garbage collector would delete it once that owner is gone)",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>"), ownedBy("bait-uid")), write(stored("v1", "-", ownedBy("bait-uid")), "v2", "42")),
			lock: heldBy42, reason: fkv1.AdmissionInheritedFromUnfenced, code: 422, msg: "owner reference ConfigMap bait (uid bait-uid)"},
		{name: "fencing an object and giving it an owner in the same write (the holder's own)",
			req:  update(stored("v1", "-", withLabel(lockLabel, "<none>")), write(stored("v1", "-"), "v2", "42", ownedBy("mine-uid"))),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "fencing an object whose deletion was requested while unfenced (removing the last finalizer would complete it)",
			req: update(stored("v1", "-", withLabel(lockLabel, "<none>"), deleting),
				write(stored("v1", "-", deleting), "v2", "42")),
			lock: heldBy42, reason: fkv1.AdmissionInheritedFromUnfenced, code: 422, msg: "an object being deleted cannot be fenced"},
		{name: "fencing an object that carried fence-policy current while unfenced (not a relaxation)",
			req: update(stored("v1", "-", withLabel(lockLabel, "<none>"), withAnnotation(fkv1.AnnotationFencePolicy, fkv1.FencePolicyCurrent)),
				write(stored("v1", "-", withAnnotation(fkv1.AnnotationFencePolicy, fkv1.FencePolicyCurrent)), "v2", "42")),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "a fenced object keeps its opt-out and policy on later writes",
			req:  update(stored("v1", "42", optOut, monotonic), write(stored("v1", "42", optOut, monotonic), "v2", "42")),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "an object that already has an empty label may keep it for metadata writes",
			req: update(stored("v1", "-", withLabel(lockLabel, "")), write(stored("v1", "-", withLabel(lockLabel, "")), "v1", "-", withAnnotation("note", "x"))), lock: heldBy42, allow: true},
		{name: "an object that already has an empty label may drop it",
			req: update(stored("v1", "-", withLabel(lockLabel, "")), write(stored("v1", "-", withLabel(lockLabel, "<none>")), "v1", "-")), lock: heldBy42, allow: true},
		{name: "a deletion mark must be the presented epoch",
			req: update(at42, write(at42, "v12", "42", withAnnotation(fkv1.AnnotationDeleteEpoch, "43"))), lock: heldBy42, reason: fkv1.AdmissionInvalidDeleteMark, code: 422},

		// Rule 6: DELETE is fenced.
		{name: "delete of an unmarked object", req: del(at42), lock: heldBy42, reason: fkv1.AdmissionDeleteNotMarked, code: 403, msg: "first writes annotation fencekeeper.io/delete-epoch"},
		{name: "delete marked by the current holder", req: del(stored("v12", "42", withAnnotation(fkv1.AnnotationDeleteEpoch, "42"))), lock: heldBy42, allow: true, reason: fkv1.AdmissionDeleteMarked},
		{name: "delete marked by a holder since superseded (policy current)", req: del(stored("v12", "41", withAnnotation(fkv1.AnnotationDeleteEpoch, "41"))), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch, code: 403},
		{name: "delete marked, then written by a newer holder", req: del(stored("v13", "42", monotonic, withAnnotation(fkv1.AnnotationDeleteEpoch, "41"))), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch},
		{name: "delete marked under monotonic by the last writer, since superseded (the mark needs the current epoch under every policy)",
			req: del(stored("v12", "41", monotonic, withAnnotation(fkv1.AnnotationDeleteEpoch, "41"))), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch},
		{name: "delete marked under monotonic by the current holder", req: del(stored("v12", "42", monotonic, withAnnotation(fkv1.AnnotationDeleteEpoch, "42"))), lock: heldBy42, allow: true, reason: fkv1.AdmissionDeleteMarked},
		{name: "delete by namespace deletion", req: Request{Op: Delete, Old: at42, NamespaceTerminating: true}, lock: heldBy42, allow: true, reason: fkv1.AdmissionNamespaceDeletion},
		{name: "delete by the garbage collector", req: Request{Op: Delete, Old: at42, GarbageCollector: true}, lock: heldBy42, allow: true, reason: fkv1.AdmissionGarbageCollection},

		// Rule 7: a scale cannot move the watermark.
		{name: "scale by the current holder over its own watermark", req: scale(stored("v12", "42", monotonic), "42"), lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted},
		{name: "scale by the current holder over an older watermark (it would leave 41 free to write under monotonic)",
			req: scale(stored("v12", "41", monotonic), "42"), lock: heldBy42, reason: fkv1.AdmissionScaleBeforeFencedWrite, code: 403, msg: "make one fenced write of the object presenting epoch 42 first"},
		{name: "scale by the current holder over an older watermark, policy current", req: scale(stored("v12", "41"), "42"), lock: heldBy42, reason: fkv1.AdmissionScaleBeforeFencedWrite},
		{name: "scale by a superseded holder under monotonic (the paused W1)", req: scale(stored("v12", "41", monotonic), "41"), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch, msg: "a scale is accepted only from the lock's current holder"},
		{name: "scale without an epoch", req: scale(stored("v12", "42"), "-"), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},

		// Rule 6: an owner decides when the garbage collector deletes; adding one needs the current epoch.
		{name: "a superseded holder adds an owner under monotonic", req: update(stored("v12", "41", monotonic), write(stored("v12", "41", monotonic), "v12", "41", ownedBy("bait-uid"))),
			lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch, msg: "adding an owner reference"},
		{name: "a superseded holder changes an owner's uid under monotonic", req: update(stored("v12", "41", monotonic, ownedBy("a")), write(stored("v12", "41", monotonic, ownedBy("a")), "v12", "41", ownedBy("b"))),
			lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch},
		{name: "the current holder adds an owner under monotonic", req: update(stored("v12", "41", monotonic), write(stored("v12", "41", monotonic), "v12", "42", ownedBy("mine"))),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "a superseded holder writes under monotonic keeping the owners", req: update(stored("v12", "40", monotonic, ownedBy("a")), write(stored("v12", "40", monotonic, ownedBy("a")), "v13", "41")),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 41},

		// Rule 8: what steers the holder's next apply is content.
		{name: "last-applied-configuration changed without an epoch", req: update(at42, write(at42, "v12", "-", withAnnotation(lastApplied, `{"data":{}}`))), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "managedFields: a data field moved into the holder's apply entry without an epoch",
			req: update(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{}}}`), updateBy("other", `{"f:data":{"f:x":{}}}`))),
				write(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{},"f:x":{}}}`))), "v12", "-")),
			lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "managedFields: another manager's ownership of a data field dropped without an epoch",
			req: update(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{},"f:x":{}}}`), updateBy("other", `{"f:data":{"f:x":{}}}`))),
				write(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{},"f:x":{}}}`))), "v12", "-")),
			lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "managedFields: a label's owner changes (kubectl label), and an empty entry is dropped",
			req: update(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{}},"f:metadata":{"f:labels":{"f:team":{}}}}`), updateBy("idle", `{"f:metadata":{}}`))),
				write(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{}}}`), updateBy("kubectl-label", `{"f:metadata":{"f:labels":{"f:team":{}}}}`))), "v12", "-", withLabel("team", "x"))),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "managedFields: updaters folded into ancient-changes",
			req: update(stored("v12", "42", managed(updateBy("old-1", `{"f:data":{"f:a":{}}}`), updateBy("old-2", `{"f:data":{"f:b":{}}}`))),
				write(stored("v12", "42", managed(updateBy("ancient-changes", `{"f:data":{"f:a":{},"f:b":{}}}`), updateBy("gc", `{"f:metadata":{"f:ownerReferences":{}}}`))), "v12", "-")),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},

		{name: "managedFields: another manager co-owns fence-policy (the holder's apply that drops it would not remove it)",
			req: update(stored("v12", "42", monotonic, managed(applyBy("w2", `{"f:data":{"f:a":{}},"f:metadata":{"f:annotations":{"f:fencekeeper.io/fence-policy":{}}}}`))),
				write(stored("v12", "42", monotonic, managed(applyBy("w2", `{"f:data":{"f:a":{}},"f:metadata":{"f:annotations":{"f:fencekeeper.io/fence-policy":{}}}}`),
					applyBy("mallory", `{"f:metadata":{"f:annotations":{"f:fencekeeper.io/fence-policy":{}}}}`))), "v12", "-")),
			lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "managedFields: the holder's ownership of an owner the object keeps is taken away",
			req: update(stored("v12", "42", ownedBy("a"), managed(applyBy("w2", `{"f:metadata":{"f:ownerReferences":{"k:{\"uid\":\"a\"}":{}}}}`))),
				write(stored("v12", "42", ownedBy("a"), managed(updateBy("mallory", `{"f:metadata":{"f:ownerReferences":{"k:{\"uid\":\"a\"}":{}}}}`))), "v12", "-")),
			lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},
		{name: "managedFields: the holder's apply that leaves out its token (consumed, never stored) drops its ownership of it",
			req: update(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{}},"f:metadata":{"f:annotations":{"f:fencekeeper.io/epoch":{},"f:fencekeeper.io/fenced-epoch":{}}}}`))),
				write(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{}}}`))), "v12", "-")),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "managedFields: the garbage collector removes an owner, and its ownership with it",
			req: update(stored("v12", "42", ownedBy("a"), managed(applyBy("w2", `{"f:data":{"f:a":{}},"f:metadata":{"f:ownerReferences":{"k:{\"uid\":\"a\"}":{}}}}`))),
				write(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{}}}`))), "v12", "-", func(u *unstructured.Unstructured) { u.SetOwnerReferences(nil) })),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "managedFields: the holder's apply entry relabelled to another API version",
			req: update(stored("v12", "42", managed(applyBy("w2", `{"f:data":{"f:a":{}}}`))),
				write(stored("v12", "42", managed(func() metav1.ManagedFieldsEntry {
					e := applyBy("w2", `{"f:data":{"f:a":{}}}`)
					e.APIVersion = "v2"
					return e
				}())), "v12", "-")),
			lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},

		// Rule 8: metadata-only maintenance.
		{name: "finalizer removed", req: update(stored("v10", "40", func(u *unstructured.Unstructured) { u.SetFinalizers([]string{"example.com/x"}) }), at40.DeepCopy()),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "ownerReference removed (garbage collector)",
			req: update(stored("v10", "40", func(u *unstructured.Unstructured) {
				u.Object["metadata"].(map[string]any)["ownerReferences"] = []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u1"}}
			}), at40.DeepCopy()),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "unrelated label added", req: update(at40, write(at40, "v10", "-", withLabel("team", "finance"))), lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "status-only update", req: update(at40, write(at40, "v10", "-", func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"phase": "Published"} })),
			lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "metadata-only on a lock that is free", req: update(at42, write(at42, "v12", "-", withAnnotation("note", "x"))), lock: free, allow: true, reason: fkv1.AdmissionMetadataOnly},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.req, tc.lock)
			if d.Allowed != tc.allow {
				t.Fatalf("allowed = %v, want %v (%s: %s)", d.Allowed, tc.allow, d.Reason, d.Message)
			}
			if tc.reason != "" && d.Reason != tc.reason {
				t.Errorf("reason = %s, want %s (%s)", d.Reason, tc.reason, d.Message)
			}
			if tc.code != 0 && d.Code != tc.code {
				t.Errorf("code = %d, want %d", d.Code, tc.code)
			}
			if tc.msg != "" && !strings.Contains(d.Message, tc.msg) {
				t.Errorf("message %q does not contain %q", d.Message, tc.msg)
			}
			if d.Watermark != tc.watermark {
				t.Errorf("watermark = %d, want %d", d.Watermark, tc.watermark)
			}
			if !d.Allowed && (d.Code == 0 || d.Message == "") {
				t.Errorf("a denial needs a code and a message: %+v", d)
			}
		})
	}
}

func TestContentChangedAnnotations(t *testing.T) {
	withAnnotation := func(k, v string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"maxReplicas": int64(3)}}}
		if k != "" {
			u.SetAnnotations(map[string]string{k: v})
		}
		return u
	}
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{"fencekeeper.io/fence-identity", true},
		// autoscaling/v1 carries these HorizontalPodAutoscaler spec fields
		// in annotations; the apiserver stores them as the fields.
		{"autoscaling.alpha.kubernetes.io/behavior", true},
		{"autoscaling.alpha.kubernetes.io/metrics", true},
		{"autoscaling.alpha.kubernetes.io/scale-up-tolerance", true},
		// ... and these status fields, which are not fenced.
		{"autoscaling.alpha.kubernetes.io/conditions", false},
		{"autoscaling.alpha.kubernetes.io/current-metrics", false},
		{"example.com/note", false},
	} {
		if got := ContentChanged(withAnnotation("", ""), withAnnotation(tc.key, "x")); got != tc.want {
			t.Errorf("adding annotation %s: ContentChanged = %v, want %v", tc.key, got, tc.want)
		}
		if got := ContentChanged(withAnnotation(tc.key, "x"), withAnnotation(tc.key, "y")); got != tc.want {
			t.Errorf("changing annotation %s: ContentChanged = %v, want %v", tc.key, got, tc.want)
		}
		if got := ContentChanged(withAnnotation(tc.key, "x"), withAnnotation("", "")); got != tc.want {
			t.Errorf("removing annotation %s: ContentChanged = %v, want %v", tc.key, got, tc.want)
		}
	}
}

// A semaphore of 3 holders (docs/design.md §9): live permits 40 (worker-a)
// and 42 (worker-c); 41 (worker-b) has ended; 42 is the last issued.
var semaphore3 = LockState{Namespace: "reports", Name: "report-2026-07", Exists: true, Issued: 42, Capacity: 3,
	Permits: []PermitState{
		{Epoch: 40, Holder: "worker-a", Binding: Binding{User: "alice", Known: true}},
		{Epoch: 42, Holder: "worker-c", Binding: Binding{User: "carol", Known: true}},
	}}

func TestDecideSemaphore(t *testing.T) {
	none := semaphore3
	none.Permits = nil
	monotonic := withAnnotation(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)
	markAt := func(e string) func(*unstructured.Unstructured) { return withAnnotation(fkv1.AnnotationDeleteEpoch, e) }
	ownedBy := func(uid string) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "bait", UID: types.UID(uid)}})
		}
	}
	at42 := stored("v12", "42")
	at40 := stored("v10", "40")
	cases := []struct {
		name      string
		req       Request
		lock      LockState
		allow     bool
		reason    fkv1.AdmissionReason
		code      int32
		msg       string
		watermark int64
	}{
		// Rule 4 is the only policy: a live permit holds the presented epoch.
		{name: "create by a live permit", req: create(write(nil, "v1", "40")), lock: semaphore3, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 40},
		{name: "update by a live permit", req: update(at40, write(at40, "v11", "42")), lock: semaphore3, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "an ended permit's epoch, between two live ones", req: update(at40, write(at40, "v11", "41")), lock: semaphore3,
			reason: fkv1.AdmissionNotCurrentEpoch, code: 403,
			msg: "stale epoch 41 for lock reports/report-2026-07: no live permit holds it (semaphore of 3 holders, live permits: epoch 40 (worker-a), epoch 42 (worker-c))"},
		{name: "an epoch below every live permit", req: create(write(nil, "v1", "7")), lock: semaphore3, reason: fkv1.AdmissionNotCurrentEpoch, code: 403},
		{name: "no permit is live", req: update(at42, write(at42, "v13", "42")), lock: none, reason: fkv1.AdmissionNotCurrentEpoch,
			msg: "no permit is live, last epoch 42"},
		// Rule 2 does not apply: holders write concurrently.
		{name: "a live permit below the object's watermark (another holder wrote last)", req: update(at42, write(at42, "v13", "40")), lock: semaphore3,
			allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 40},
		// Rule 3 unchanged.
		{name: "above the last issued (forged)", req: update(at40, write(at40, "v11", "43")), lock: semaphore3, reason: fkv1.AdmissionFutureEpoch, code: 403,
			msg: "the last epoch issued is 42"},
		{name: "rule 1 unchanged: no epoch", req: update(at40, write(at40, "v11", "-")), lock: semaphore3, reason: fkv1.AdmissionMissingEpoch, code: 422},
		{name: "rule 8 unchanged: metadata-only maintenance", req: update(at40, write(at40, "v10", "-", withLabel("team", "x"))), lock: none, allow: true, reason: fkv1.AdmissionMetadataOnly},
		// monotonic is refused: without rule 2 it would accept every epoch ever issued.
		{name: "stored monotonic, an ended permit's epoch", req: update(stored("v10", "40", monotonic), write(stored("v10", "40", monotonic), "v11", "41")), lock: semaphore3,
			reason: fkv1.AdmissionInvalidPolicy, code: 422, msg: "would accept every epoch ever issued"},
		{name: "stored monotonic, a live permit keeping it", req: update(stored("v10", "40", monotonic), write(stored("v10", "40", monotonic), "v11", "42")), lock: semaphore3,
			reason: fkv1.AdmissionInvalidPolicy, code: 422, msg: "a semaphore of 3 holders"},
		{name: "a live permit sets monotonic", req: update(at40, write(at40, "v11", "42", monotonic)), lock: semaphore3, reason: fkv1.AdmissionInvalidPolicy, code: 422},
		{name: "create with monotonic", req: create(write(nil, "v1", "42", monotonic)), lock: semaphore3, reason: fkv1.AdmissionInvalidPolicy, code: 422},
		{name: "a live permit removes a stored monotonic (judged as current)", req: update(stored("v10", "40", monotonic), write(stored("v10", "40", monotonic), "v11", "42", withoutAnnotation(fkv1.AnnotationFencePolicy))),
			lock: semaphore3, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 42},
		{name: "an ended permit removes a stored monotonic", req: update(stored("v10", "40", monotonic), write(stored("v10", "40", monotonic), "v11", "41", withoutAnnotation(fkv1.AnnotationFencePolicy))),
			lock: semaphore3, reason: fkv1.AdmissionNotCurrentEpoch},
		// Rule 6: owners and deletion marks need a live permit's epoch.
		{name: "an ended permit adds an owner", req: update(at40, write(at40, "v10", "41", ownedBy("bait"))), lock: semaphore3, reason: fkv1.AdmissionNotCurrentEpoch,
			msg: "no live permit holds it"},
		{name: "a live permit adds an owner", req: update(at42, write(at42, "v12", "40", ownedBy("mine"))), lock: semaphore3, allow: true, reason: fkv1.AdmissionEpochAccepted, watermark: 40},
		{name: "delete marked by a live permit", req: del(stored("v12", "40", markAt("40"))), lock: semaphore3, allow: true, reason: fkv1.AdmissionDeleteMarked},
		{name: "delete marked by an ended permit", req: del(stored("v12", "41", markAt("41"))), lock: semaphore3, reason: fkv1.AdmissionNotCurrentEpoch, code: 403,
			msg: "marked by epoch 41, which is not a live permit's epoch"},
		{name: "delete marked by a live permit, no longer the watermark", req: del(stored("v12", "42", markAt("40"))), lock: semaphore3, reason: fkv1.AdmissionStaleEpoch},
		{name: "delete of an unmarked object", req: del(at42), lock: semaphore3, reason: fkv1.AdmissionDeleteNotMarked, msg: "a live permit's holder first writes"},
		{name: "delete when no permit is live", req: del(stored("v12", "42", markAt("42"))), lock: none, reason: fkv1.AdmissionNotCurrentEpoch},
		{name: "delete by the garbage collector", req: Request{Op: Delete, Old: at42, GarbageCollector: true}, lock: none, allow: true, reason: fkv1.AdmissionGarbageCollection},
		{name: "a deletion mark must be the presented epoch", req: update(at40, write(at40, "v11", "42", markAt("40"))), lock: semaphore3, reason: fkv1.AdmissionInvalidDeleteMark},
		// Rule 7: a scale by a live permit, over its own watermark.
		{name: "scale by a live permit over its own watermark", req: scale(stored("v12", "40"), "40"), lock: semaphore3, allow: true, reason: fkv1.AdmissionEpochAccepted},
		{name: "scale by a live permit over another's watermark", req: scale(stored("v12", "42"), "40"), lock: semaphore3, reason: fkv1.AdmissionScaleBeforeFencedWrite},
		{name: "scale by an ended permit over its own watermark", req: scale(stored("v12", "41"), "41"), lock: semaphore3, reason: fkv1.AdmissionNotCurrentEpoch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.req, tc.lock)
			if d.Allowed != tc.allow {
				t.Fatalf("allowed = %v, want %v (%s: %s)", d.Allowed, tc.allow, d.Reason, d.Message)
			}
			if tc.reason != "" && d.Reason != tc.reason {
				t.Errorf("reason = %s, want %s (%s)", d.Reason, tc.reason, d.Message)
			}
			if tc.code != 0 && d.Code != tc.code {
				t.Errorf("code = %d, want %d", d.Code, tc.code)
			}
			if tc.msg != "" && !strings.Contains(d.Message, tc.msg) {
				t.Errorf("message %q does not contain %q", d.Message, tc.msg)
			}
			if d.Watermark != tc.watermark {
				t.Errorf("watermark = %d, want %d", d.Watermark, tc.watermark)
			}
			if !d.Allowed && (d.Code == 0 || d.Message == "") {
				t.Errorf("a denial needs a code and a message: %+v", d)
			}
		})
	}
}

// StateOf reads a semaphore's capacity and permits from its ledger; a
// malformed capacity or permit entry is no lock, as a damaged counter is.
func TestStateOfSemaphore(t *testing.T) {
	ledger := fkv1.Ledger{Exists: true, Epoch: 12, EpochValid: true, Capacity: 3,
		Permits: []fkv1.Permit{
			{Epoch: 11, Claim: "w1", UID: "u1", Holder: "worker-1", PodUID: "p1"},
			{Epoch: 12, Claim: "w2", UID: "u2", Holder: "worker-2", User: "alice"},
		}}
	s := StateOf("reports", "warehouse", ledger)
	if !s.Exists || !s.Semaphore() || s.Issued != 12 || s.HeldEpoch != 0 || s.Capacity != 3 {
		t.Fatalf("state %+v", s)
	}
	if got := s.PermitEpochs(); len(got) != 2 || got[0] != 11 || got[1] != 12 {
		t.Fatalf("permit epochs %v", got)
	}
	if b, ok := s.LeaseBinding(12); !ok || b != (Binding{User: "alice", Known: true}) {
		t.Fatalf("binding of permit 12: %+v %v", b, ok)
	}
	if b, ok := s.LeaseBinding(11); !ok || b != (Binding{PodUID: "p1", Known: true}) {
		t.Fatalf("binding of permit 11: %+v %v", b, ok)
	}
	if _, ok := s.LeaseBinding(10); ok {
		t.Fatal("an epoch no permit holds has a binding")
	}
	// Holder annotations on a semaphore's Lease name no holder.
	withHolder := ledger
	withHolder.HolderUID, withHolder.HolderIdentity, withHolder.HolderUser = "u9", "mallory", "mallory"
	if s := StateOf("reports", "warehouse", withHolder); s.HeldEpoch != 0 || s.Holder != "" {
		t.Fatalf("a semaphore's state names holder %q at %d", s.Holder, s.HeldEpoch)
	}
	for name, l := range map[string]fkv1.Ledger{
		"malformed capacity": func() fkv1.Ledger { l := ledger; l.Capacity, l.CapacityInvalid = 0, true; return l }(),
		"malformed permits":  func() fkv1.Ledger { l := ledger; l.Permits, l.PermitsInvalid = nil, true; return l }(),
		"malformed permits on a mutex": func() fkv1.Ledger {
			l := ledger
			l.Capacity, l.Permits, l.PermitsInvalid, l.HolderUID = 1, nil, true, "u1"
			return l
		}(),
	} {
		if s := StateOf("reports", "warehouse", l); s.Exists || s.Issued != 0 || s.Semaphore() {
			t.Errorf("%s: state %+v, want no lock", name, s)
		}
		if d := Decide(update(stored("v1", "12"), write(stored("v1", "12"), "v2", "12")), StateOf("reports", "warehouse", l)); d.Allowed || d.Reason != fkv1.AdmissionFutureEpoch {
			t.Errorf("%s: a write presenting 12 got %v/%s, want FutureEpoch", name, d.Allowed, d.Reason)
		}
	}
	// A mutex's state is what it was: permits of a mutex Lease are ignored.
	mutex := fkv1.Ledger{Exists: true, Epoch: 42, EpochValid: true, HolderUID: "u", HolderIdentity: "W2", HolderUser: "bob",
		Capacity: 1}
	if s := StateOf("reports", "report-2026-07", mutex); s.Semaphore() || s.HeldEpoch != 42 || s.Holder != "W2" || s.HolderBinding != (Binding{User: "bob", Known: true}) || s.Permits != nil {
		t.Fatalf("mutex state %+v", s)
	}
}

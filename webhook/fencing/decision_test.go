package fencing

import (
	"net/http"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

const lockLabel = "fencekeeper.io/lock"
const epochAnn = "fencekeeper.io/epoch"

// cm builds a fenced ConfigMap: data value, epoch annotation ("-" = none),
// extra metadata tweaks.
func cm(data, epoch string, tweak ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "report-2026-07", "namespace": "reports"},
		"data":     map[string]any{"report.csv": data},
	}}
	u.SetLabels(map[string]string{lockLabel: "report-2026-07"})
	if epoch != "-" {
		u.SetAnnotations(map[string]string{epochAnn: epoch})
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

func withLabel(k, v string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		l := u.GetLabels()
		if v == "" {
			delete(l, k)
		} else {
			l[k] = v
		}
		u.SetLabels(l)
	}
}

// W2 holds epoch 42; 42 is also the last issued.
var heldBy42 = LockState{Namespace: "reports", Name: "report-2026-07", Exists: true, Issued: 42, HeldEpoch: 42, Holder: "W2"}

func TestDecide(t *testing.T) {
	free := heldBy42
	free.HeldEpoch, free.Holder = 0, ""
	monotonic := withAnnotation(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)
	cases := []struct {
		name   string
		op     Operation
		old    *unstructured.Unstructured
		obj    *unstructured.Unstructured
		lock   LockState
		allow  bool
		reason fkv1.AdmissionReason
		code   int32
		msg    string
	}{
		// Rule 1: content changes carry a valid epoch.
		{name: "create with the current epoch", op: Create, obj: cm("v12", "42"), lock: heldBy42, allow: true, reason: fkv1.AdmissionEpochAccepted},
		{name: "create without an epoch", op: Create, obj: cm("v12", "-"), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch, code: 422, msg: "missing epoch for lock reports/report-2026-07"},
		{name: "update without an epoch", op: Update, old: cm("v11", "-"), obj: cm("v12", "-"), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch, code: 422},
		{name: "epoch abc", op: Update, old: cm("v11", "41"), obj: cm("v12", "abc"), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch, code: 422, msg: `epoch "abc" is not a decimal integer`},
		{name: "epoch -1", op: Update, old: cm("v11", "41"), obj: cm("v12", "-1"), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch 0", op: Update, old: cm("v11", "41"), obj: cm("v12", "0"), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch +5", op: Update, old: cm("v11", "41"), obj: cm("v12", "+5"), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch ' 5'", op: Update, old: cm("v11", "41"), obj: cm("v12", " 5"), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch 2^63", op: Update, old: cm("v11", "41"), obj: cm("v12", "9223372036854775808"), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch, msg: "out of range"},
		{name: "epoch empty", op: Update, old: cm("v11", "41"), obj: cm("v12", ""), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},
		{name: "epoch 042", op: Update, old: cm("v11", "41"), obj: cm("v12", "042"), lock: heldBy42, reason: fkv1.AdmissionMalformedEpoch},

		// Rule 2: the per-object watermark.
		{name: "equal to the watermark", op: Update, old: cm("v12", "42"), obj: cm("v13", "42"), lock: heldBy42, allow: true},
		{name: "one below the watermark (the paused W1)", op: Update, old: cm("v12", "42"), obj: cm("v11", "41"), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch, code: http.StatusConflict,
			msg: "stale epoch 41 for lock reports/report-2026-07: object already accepted epoch 42 (current holder W2, epoch 42)"},
		{name: "one below the watermark under monotonic", op: Update, old: cm("v12", "42", monotonic), obj: cm("v11", "41", monotonic), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch, code: 409},
		{name: "one above the watermark", op: Update, old: cm("v11", "41"), obj: cm("v12", "42"), lock: heldBy42, allow: true},
		{name: "bumping only the epoch annotation down is a content change", op: Update, old: cm("v12", "42"), obj: cm("v12", "41"), lock: heldBy42, reason: fkv1.AdmissionStaleEpoch},

		// Rule 3: the issued bound.
		{name: "equal to the issued epoch", op: Update, old: cm("v11", "41"), obj: cm("v12", "42"), lock: heldBy42, allow: true},
		{name: "one above the issued epoch (forged)", op: Update, old: cm("v11", "41"), obj: cm("v12", "43"), lock: heldBy42, reason: fkv1.AdmissionFutureEpoch, code: http.StatusForbidden,
			msg: "epoch 43 for lock reports/report-2026-07 was never issued: the last epoch issued is 42"},
		{name: "forged under monotonic", op: Update, old: cm("v11", "41", monotonic), obj: cm("v12", "43", monotonic), lock: heldBy42, reason: fkv1.AdmissionFutureEpoch},
		{name: "unknown lock", op: Create, obj: cm("v1", "1"), lock: LockState{Namespace: "reports", Name: "report-2026-07"}, reason: fkv1.AdmissionFutureEpoch, msg: "no epoch was ever issued"},

		// Rule 4: current versus monotonic.
		{name: "untouched object, stale holder, policy current", op: Update, old: cm("v10", "40"), obj: cm("v11", "41"), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch, code: 409,
			msg: "stale epoch 41 for lock reports/report-2026-07: it is not the lock's current epoch (current holder W2, epoch 42)"},
		{name: "untouched object, stale holder, policy monotonic", op: Update, old: cm("v10", "40", monotonic), obj: cm("v11", "41", monotonic), lock: heldBy42, allow: true},
		{name: "lock free: nobody writes under current", op: Update, old: cm("v10", "42"), obj: cm("v11", "42"), lock: free, reason: fkv1.AdmissionNotCurrentEpoch, msg: "lock is free, last epoch 42"},
		{name: "lock free: monotonic still accepts the last epoch", op: Update, old: cm("v10", "42", monotonic), obj: cm("v11", "42", monotonic), lock: free, allow: true},
		{name: "a stale writer cannot relax the policy with its own write", op: Update, old: cm("v10", "40"), obj: cm("v11", "41", monotonic), lock: heldBy42, reason: fkv1.AdmissionNotCurrentEpoch},
		{name: "create under monotonic with an old epoch", op: Create, obj: cm("v1", "41", monotonic), lock: heldBy42, allow: true},
		{name: "invalid policy", op: Create, obj: cm("v1", "42", withAnnotation(fkv1.AnnotationFencePolicy, "lenient")), lock: heldBy42, reason: fkv1.AdmissionInvalidPolicy, code: 422},

		// Rule 5: the label and the epoch annotation stay.
		{name: "fencing label removed", op: Update, old: cm("v12", "42"), obj: cm("v12", "42", withLabel(lockLabel, "")), lock: heldBy42, reason: fkv1.AdmissionLockLabelImmutable, code: 422},
		{name: "fencing label pointed at another lock", op: Update, old: cm("v12", "42"), obj: cm("v12", "42", withLabel(lockLabel, "other")), lock: heldBy42, reason: fkv1.AdmissionLockLabelImmutable},
		{name: "epoch annotation removed", op: Update, old: cm("v12", "42"), obj: cm("v12", "-"), lock: heldBy42, reason: fkv1.AdmissionEpochRemoved, code: 422},
		{name: "fencing an unfenced object needs an epoch", op: Update, old: cm("v12", "-", withLabel(lockLabel, "")), obj: cm("v12", "-"), lock: heldBy42, reason: fkv1.AdmissionMissingEpoch},

		// Rule 6: metadata-only maintenance.
		{name: "finalizer removed with an old epoch", op: Update,
			old: cm("v12", "40", func(u *unstructured.Unstructured) { u.SetFinalizers([]string{"example.com/x"}) }),
			obj: cm("v12", "40"), lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "ownerReference removed (garbage collector)", op: Update,
			old: cm("v12", "40", func(u *unstructured.Unstructured) {
				u.SetOwnerReferences(nil)
				u.Object["metadata"].(map[string]any)["ownerReferences"] = []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u1"}}
			}),
			obj: cm("v12", "40"), lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "unrelated label added", op: Update, old: cm("v12", "40"), obj: cm("v12", "40", withLabel("team", "finance")), lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "status-only update", op: Update, old: cm("v12", "40"),
			obj: cm("v12", "40", func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"phase": "Published"} }), lock: heldBy42, allow: true, reason: fkv1.AdmissionMetadataOnly},
		{name: "metadata-only on a lock that is free", op: Update, old: cm("v12", "42"), obj: cm("v12", "42", withAnnotation("note", "x")), lock: free, allow: true, reason: fkv1.AdmissionMetadataOnly},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.op, tc.old, tc.obj, tc.lock)
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
			if !d.Allowed && (d.Code == 0 || d.Message == "") {
				t.Errorf("a denial needs a code and a message: %+v", d)
			}
		})
	}
}

// FuzzDecide: any epoch strings and data never panic, and an unparsable
// presented epoch on a content change is never allowed.
func FuzzDecide(f *testing.F) {
	for _, s := range []string{"42", "41", "43", "abc", "-1", "0", "+5", " 5", "9223372036854775808", "", "042", "1e3", "٤٢"} {
		f.Add(s, "41", "v12", true, int64(42))
	}
	f.Fuzz(func(t *testing.T, epoch, stored, data string, update bool, held int64) {
		var old *unstructured.Unstructured
		op := Create
		if update {
			op, old = Update, cm("old", stored)
		}
		obj := cm(data, epoch)
		lock := heldBy42
		lock.HeldEpoch = held
		d := Decide(op, old, obj, lock)
		_, err := fkv1.ParseEpoch(epoch)
		if err != nil && d.Allowed && ContentChanged(old, obj) {
			t.Fatalf("allowed unparsable epoch %q: %+v", epoch, d)
		}
		if d.Allowed && d.Reason == fkv1.AdmissionEpochAccepted {
			if d.Epoch < 1 || d.Epoch > lock.Issued {
				t.Fatalf("allowed epoch %d outside 1..%d", d.Epoch, lock.Issued)
			}
			if s, err := fkv1.ParseEpoch(stored); update && err == nil && d.Epoch < s {
				t.Fatalf("allowed epoch %d below watermark %d", d.Epoch, s)
			}
		}
	})
}

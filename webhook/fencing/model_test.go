package fencing

import (
	"math/big"
	"regexp"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A reference model of docs/design.md §3, written apart from Decide and
// without any of its helpers: it states the rules on plain values, and the
// fuzz target checks that Decide agrees with it on every input.

var epochGrammar = regexp.MustCompile(`^[1-9][0-9]*$`)

var maxEpoch = big.NewInt(9223372036854775807)

// modelEpoch parses with big integers and a regexp: 1..2^63-1, digits only.
func modelEpoch(s string) (int64, bool) {
	if !epochGrammar.MatchString(s) {
		return 0, false
	}
	n, ok := new(big.Int).SetString(s, 10)
	if !ok || n.Cmp(maxEpoch) > 0 {
		return 0, false
	}
	return n.Int64(), true
}

// modelInput is one fuzzed situation in plain values.
type modelInput struct {
	op                         Operation
	storedWatermark            string // "" = none
	storedPolicy, newPolicy    string // "" = none
	token                      string // "" with hasToken false = none
	hasToken                   bool
	contentChanged             bool
	deleteMark                 string
	issued, held               int64
	lockExists                 bool
	nsTerminating, gcRequester bool
	// storedUnfenced: the update adds the lock label to an object that had
	// none (only for updates).
	storedUnfenced bool
	// scale: the update is a write to the scale subresource (only for
	// updates of fenced objects).
	scale bool
}

// model returns (allowed, reason) per the contract.
func model(in modelInput) (bool, fkv1.AdmissionReason) {
	if !in.lockExists {
		in.issued, in.held = 0, 0
	}
	if in.op == Delete {
		switch {
		case in.nsTerminating:
			return true, fkv1.AdmissionNamespaceDeletion
		case in.gcRequester:
			return true, fkv1.AdmissionGarbageCollection
		}
		mark, ok := modelEpoch(in.deleteMark)
		if !ok {
			return false, fkv1.AdmissionDeleteNotMarked
		}
		wm, _ := modelEpoch(in.storedWatermark)
		if mark != wm {
			return false, fkv1.AdmissionStaleEpoch
		}
		if mark != in.held { // under every policy
			return false, fkv1.AdmissionNotCurrentEpoch
		}
		return true, fkv1.AdmissionDeleteMarked
	}
	if in.storedUnfenced {
		// Adding the label is a content change, and the unfenced past says
		// nothing: no watermark, policy current.
		in.contentChanged = true
	}
	if in.op == Update && !in.contentChanged && !in.hasToken {
		return true, fkv1.AdmissionMetadataOnly
	}
	if !in.hasToken {
		return false, fkv1.AdmissionMissingEpoch
	}
	e, ok := modelEpoch(in.token)
	if !ok {
		return false, fkv1.AdmissionMalformedEpoch
	}
	valid := func(p string) bool { return p == "" || p == "current" || p == "monotonic" }
	if !valid(in.newPolicy) || (in.op == Update && !in.storedUnfenced && !valid(in.storedPolicy)) {
		return false, fkv1.AdmissionInvalidPolicy
	}
	if in.op == Update && !in.storedUnfenced {
		if wm, ok := modelEpoch(in.storedWatermark); ok && e < wm {
			return false, fkv1.AdmissionStaleEpoch
		}
	}
	if !in.lockExists || e > in.issued {
		return false, fkv1.AdmissionFutureEpoch
	}
	monotonic := in.op == Update && !in.storedUnfenced && in.storedPolicy == "monotonic"
	if !monotonic && e != in.held {
		return false, fkv1.AdmissionNotCurrentEpoch
	}
	// A scale cannot move the watermark: only the current holder scales,
	// and only over its own watermark.
	if in.scale && e != in.held {
		return false, fkv1.AdmissionNotCurrentEpoch
	}
	if wm, _ := modelEpoch(in.storedWatermark); in.scale && wm != e {
		return false, fkv1.AdmissionScaleBeforeFencedWrite
	}
	// A deletion mark a write sets names that write's epoch (an update's
	// mark here is the stored one, unchanged).
	if in.op == Create && in.deleteMark != "" && in.deleteMark != strconv.FormatInt(e, 10) {
		return false, fkv1.AdmissionInvalidDeleteMark
	}
	// The write that fences an object keeps none of the relaxations anyone
	// could have set on it before: monotonic, or a mark for this epoch (the
	// build keeps the stored mark on the new object).
	if in.storedUnfenced && ((in.storedPolicy == "monotonic" && in.newPolicy == in.storedPolicy) ||
		(in.deleteMark != "" && in.deleteMark == strconv.FormatInt(e, 10))) {
		return false, fkv1.AdmissionInheritedFromUnfenced
	}
	return true, fkv1.AdmissionEpochAccepted
}

// build turns the model's input into the objects Decide sees.
func (in modelInput) build() (Request, LockState) {
	ann := func(wm, policy string) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			if wm != "" {
				withAnnotation(fkv1.AnnotationFencedEpoch, wm)(u)
			}
			if policy != "" {
				withAnnotation(fkv1.AnnotationFencePolicy, policy)(u)
			}
			if in.deleteMark != "" {
				withAnnotation(fkv1.AnnotationDeleteEpoch, in.deleteMark)(u)
			}
		}
	}
	old := stored("v1", "-", ann(in.storedWatermark, in.storedPolicy))
	if in.storedUnfenced {
		old.SetLabels(nil)
	}
	data := "v1"
	if in.contentChanged {
		data = "v2"
	}
	present := func(u *unstructured.Unstructured) {
		if in.hasToken {
			withAnnotation(fkv1.AnnotationEpoch, in.token)(u)
		}
	}
	var r Request
	switch in.op {
	case Create:
		r = create(write(nil, data, "-", ann("", in.newPolicy), present))
	case Update:
		obj := write(old, data, "-", present)
		obj.SetLabels(map[string]string{lockLabel: "report-2026-07"})
		if in.newPolicy != in.storedPolicy {
			if in.newPolicy == "" {
				withoutAnnotation(fkv1.AnnotationFencePolicy)(obj)
			} else {
				withAnnotation(fkv1.AnnotationFencePolicy, in.newPolicy)(obj)
			}
			if !in.hasToken {
				// A policy change is a fencekeeper.io change: content.
				in.contentChanged = true
			}
		}
		r = update(old, obj)
		r.Scale = in.scale
	case Delete:
		r = Request{Op: Delete, Old: old, NamespaceTerminating: in.nsTerminating, GarbageCollector: in.gcRequester}
	}
	lock := LockState{Namespace: "reports", Name: "report-2026-07", Exists: in.lockExists}
	if in.lockExists {
		lock.Issued, lock.HeldEpoch, lock.Holder = in.issued, in.held, "W2"
	}
	return r, lock
}

func FuzzDecideAgainstModel(f *testing.F) {
	// Seeds: the rows of the seed story and the grammar's edges.
	for _, tok := range []string{"42", "41", "43", "abc", "-1", "0", "+5", " 5", "9223372036854775807", "9223372036854775808", "", "042", "1e3", "٤٢"} {
		f.Add(uint8(1), "42", "", "", tok, true, true, "", int64(42), int64(42), true, false, false)
	}
	f.Add(uint8(0), "", "", "monotonic", "41", true, true, "", int64(42), int64(42), true, false, false)
	f.Add(uint8(1), "40", "monotonic", "monotonic", "41", true, true, "", int64(42), int64(42), true, false, false)
	f.Add(uint8(1), "42", "", "", "", false, true, "", int64(42), int64(42), true, false, false)
	f.Add(uint8(1), "42", "", "", "", false, false, "", int64(42), int64(0), true, false, false)
	f.Add(uint8(2), "42", "", "", "", false, false, "42", int64(42), int64(42), true, false, false)
	f.Add(uint8(2), "41", "", "", "", false, false, "41", int64(42), int64(42), true, false, false)
	f.Add(uint8(2), "42", "monotonic", "", "", false, false, "41", int64(42), int64(42), true, false, false)
	f.Add(uint8(2), "42", "", "", "", false, false, "", int64(42), int64(42), true, true, false)
	f.Add(uint8(2), "42", "", "", "", false, false, "", int64(42), int64(42), true, false, true)
	f.Add(uint8(1), "42", "lenient", "lenient", "42", true, true, "", int64(42), int64(42), true, false, false)
	// Fencing an unfenced object: an opt-out planted before (op 3+1 = an
	// update of an unfenced object), with and without the holder's epoch.
	f.Add(uint8(4), "99", "monotonic", "monotonic", "42", true, true, "", int64(42), int64(42), true, false, false)
	f.Add(uint8(4), "", "monotonic", "", "42", true, true, "", int64(42), int64(42), true, false, false)
	f.Add(uint8(4), "", "", "", "42", true, true, "42", int64(42), int64(42), true, false, false)
	f.Add(uint8(4), "", "", "", "42", true, true, "41", int64(42), int64(42), true, false, false)
	f.Add(uint8(4), "", "lenient", "lenient", "42", true, false, "", int64(42), int64(42), true, false, false)
	// Scales (op 6+1): by the new holder over an older watermark, by the
	// stale one under monotonic, and by the holder over its own.
	f.Add(uint8(7), "41", "monotonic", "monotonic", "42", true, true, "", int64(42), int64(42), true, false, false)
	f.Add(uint8(7), "41", "monotonic", "monotonic", "41", true, true, "", int64(42), int64(42), true, false, false)
	f.Add(uint8(7), "42", "", "", "42", true, true, "", int64(42), int64(42), true, false, false)
	f.Fuzz(func(t *testing.T, op uint8, wm, storedPolicy, newPolicy, token string, hasToken, changed bool, mark string, issued, held int64, exists, nsTerm, gc bool) {
		in := modelInput{op: []Operation{Create, Update, Delete}[int(op)%3], storedWatermark: wm, storedPolicy: storedPolicy,
			newPolicy: newPolicy, token: token, hasToken: hasToken, contentChanged: changed, deleteMark: mark,
			issued: issued, held: held, lockExists: exists, nsTerminating: nsTerm, gcRequester: gc,
			storedUnfenced: int(op)%6 >= 3, scale: int(op)%12 >= 6}
		if in.op != Update {
			in.storedUnfenced = false
		}
		if in.op != Update || in.storedUnfenced {
			in.scale = false
		}
		if in.op == Create {
			in.storedWatermark, in.storedPolicy = "", ""
		}
		if in.op != Update {
			// The policy annotation of a create is the new object's; of a delete, the stored one's.
			if in.op == Create {
				in.storedPolicy = ""
			}
		}
		if in.op == Delete && !validPolicy(in.storedPolicy) {
			in.storedPolicy = ""
		}
		if in.op == Update && in.newPolicy != in.storedPolicy && !in.hasToken {
			in.contentChanged = true
		}
		r, lock := in.build()
		d := Decide(r, lock)
		wantAllowed, wantReason := model(in)
		if d.Allowed != wantAllowed || d.Reason != wantReason {
			t.Fatalf("input %+v: Decide = %v/%s (%s), model = %v/%s", in, d.Allowed, d.Reason, d.Message, wantAllowed, wantReason)
		}
		if d.Allowed && d.Reason == fkv1.AdmissionEpochAccepted {
			if e, _ := modelEpoch(token); !in.scale && d.Watermark != e || in.scale && d.Watermark != 0 {
				t.Fatalf("watermark %d, want the presented %d", d.Watermark, e)
			}
		}
	})
}

func validPolicy(p string) bool { return p == "" || p == "current" || p == "monotonic" }

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
	// capacity above 1 makes the lock a semaphore (docs/design.md §9),
	// whose live permits are permits (held is then unused); damaged: its
	// capacity or permit entries do not parse.
	capacity int32
	permits  []int64
	damaged  bool
}

// model returns (allowed, reason) per the contract.
func model(in modelInput) (bool, fkv1.AdmissionReason) {
	semaphore := in.capacity > 1
	if semaphore && (in.damaged || in.issued < 1) {
		// A ledger that cannot be read is no lock.
		in.lockExists = false
	}
	if !in.lockExists {
		in.issued, in.held, semaphore = 0, 0, false
	}
	// live: the presented epoch is one the lock holds now. A semaphore has
	// no single holder: a live permit holds it.
	live := func(e int64) bool {
		if semaphore {
			for _, p := range in.permits {
				if p == e {
					return true
				}
			}
			return false
		}
		return e == in.held
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
		if !live(mark) { // under every policy
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
	// An object of a semaphore lock never carries monotonic: with no
	// watermark rule it would accept every epoch ever issued.
	if semaphore && in.newPolicy == "monotonic" {
		return false, fkv1.AdmissionInvalidPolicy
	}
	// A semaphore's holders write concurrently: no watermark rule.
	if in.op == Update && !in.storedUnfenced && !semaphore {
		if wm, ok := modelEpoch(in.storedWatermark); ok && e < wm {
			return false, fkv1.AdmissionStaleEpoch
		}
	}
	if !in.lockExists || e > in.issued {
		return false, fkv1.AdmissionFutureEpoch
	}
	monotonic := in.op == Update && !in.storedUnfenced && in.storedPolicy == "monotonic" && !semaphore
	if !monotonic && !live(e) {
		return false, fkv1.AdmissionNotCurrentEpoch
	}
	// A scale cannot move the watermark: only the current holder scales,
	// and only over its own watermark.
	if in.scale && !live(e) {
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
	if in.capacity > 1 {
		// A semaphore's state comes from its ledger, as the handler reads
		// it; the holder annotations a semaphore's Lease should not carry
		// are set to show they are ignored.
		l := fkv1.Ledger{Exists: in.lockExists, Epoch: in.issued, EpochValid: true, Capacity: in.capacity, CapacityInvalid: in.damaged,
			PermitsInvalid: in.damaged, HolderUID: "uid-w2", HolderIdentity: "W2"}
		if !in.damaged {
			for _, e := range in.permits {
				l.Permits = append(l.Permits, fkv1.Permit{Epoch: e, Claim: "c", UID: "u", Holder: "h", User: permitUser(e)})
			}
		}
		lock = StateOf("reports", "report-2026-07", l)
	}
	return r, lock
}

func permitUser(epoch int64) string { return "user-" + strconv.FormatInt(epoch, 10) }

// permitsOf: bit i of mask is a live permit at epoch issued-i (when >= 1).
func permitsOf(issued int64, mask uint8) []int64 {
	var ps []int64
	for i := 7; i >= 0; i-- {
		if mask&(1<<i) != 0 && issued-int64(i) >= 1 && issued-int64(i) <= issued {
			ps = append(ps, issued-int64(i))
		}
	}
	return ps
}

func FuzzDecideAgainstModel(f *testing.F) {
	// Every seed of a mutex ends with capacity 0, no permits, not damaged.
	// Seeds: the rows of the seed story and the grammar's edges.
	for _, tok := range []string{"42", "41", "43", "abc", "-1", "0", "+5", " 5", "9223372036854775807", "9223372036854775808", "", "042", "1e3", "٤٢"} {
		f.Add(uint8(1), "42", "", "", tok, true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	}
	f.Add(uint8(0), "", "", "monotonic", "41", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(1), "40", "monotonic", "monotonic", "41", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(1), "42", "", "", "", false, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(1), "42", "", "", "", false, false, "", int64(42), int64(0), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(2), "42", "", "", "", false, false, "42", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(2), "41", "", "", "", false, false, "41", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(2), "42", "monotonic", "", "", false, false, "41", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(2), "42", "", "", "", false, false, "", int64(42), int64(42), true, true, false, uint8(0), uint8(0), false)
	f.Add(uint8(2), "42", "", "", "", false, false, "", int64(42), int64(42), true, false, true, uint8(0), uint8(0), false)
	f.Add(uint8(1), "42", "lenient", "lenient", "42", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	// Fencing an unfenced object: an opt-out planted before (op 3+1 = an
	// update of an unfenced object), with and without the holder's epoch.
	f.Add(uint8(4), "99", "monotonic", "monotonic", "42", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(4), "", "monotonic", "", "42", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(4), "", "", "", "42", true, true, "42", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(4), "", "", "", "42", true, true, "41", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(4), "", "lenient", "lenient", "42", true, false, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	// Scales (op 6+1): by the new holder over an older watermark, by the
	// stale one under monotonic, and by the holder over its own.
	f.Add(uint8(7), "41", "monotonic", "monotonic", "42", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(7), "41", "monotonic", "monotonic", "41", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	f.Add(uint8(7), "42", "", "", "42", true, true, "", int64(42), int64(42), true, false, false, uint8(0), uint8(0), false)
	// Semaphores of 3 (capacity 3), live permits at 42 and 40 (mask 0b101):
	// a live permit below the watermark, an ended one between, monotonic
	// stored, set and removed, marks, scales, and a damaged ledger.
	sem := func(op uint8, wm, storedPolicy, newPolicy, token string, hasToken, changed bool, mark string, damaged bool) {
		f.Add(op, wm, storedPolicy, newPolicy, token, hasToken, changed, mark, int64(42), int64(0), true, false, false, uint8(3), uint8(0b101), damaged)
	}
	sem(1, "42", "", "", "40", true, true, "", false)
	sem(1, "40", "", "", "41", true, true, "", false)
	sem(1, "40", "", "", "42", true, true, "", false)
	sem(0, "", "", "", "42", true, true, "", false)
	sem(0, "", "", "monotonic", "42", true, true, "", false)
	sem(1, "40", "monotonic", "monotonic", "41", true, true, "", false)
	sem(1, "40", "monotonic", "monotonic", "42", true, true, "", false)
	sem(1, "40", "monotonic", "", "42", true, true, "", false)
	sem(1, "40", "monotonic", "", "41", true, true, "", false)
	sem(2, "40", "", "", "", false, false, "40", false)
	sem(2, "41", "", "", "", false, false, "41", false)
	sem(2, "42", "", "", "", false, false, "40", false)
	sem(7, "40", "", "", "40", true, true, "", false)
	sem(7, "42", "", "", "40", true, true, "", false)
	sem(7, "41", "", "", "41", true, true, "", false)
	sem(1, "40", "", "", "42", true, true, "", true)
	sem(4, "", "monotonic", "monotonic", "42", true, true, "", false)
	f.Add(uint8(1), "40", "", "", "42", true, true, "", int64(42), int64(0), true, false, false, uint8(3), uint8(0), false)
	f.Fuzz(func(t *testing.T, op uint8, wm, storedPolicy, newPolicy, token string, hasToken, changed bool, mark string, issued, held int64, exists, nsTerm, gc bool,
		capacity, permitMask uint8, damaged bool) {
		in := modelInput{op: []Operation{Create, Update, Delete}[int(op)%3], storedWatermark: wm, storedPolicy: storedPolicy,
			newPolicy: newPolicy, token: token, hasToken: hasToken, contentChanged: changed, deleteMark: mark,
			issued: issued, held: held, lockExists: exists, nsTerminating: nsTerm, gcRequester: gc,
			storedUnfenced: int(op)%6 >= 3, scale: int(op)%12 >= 6,
			capacity: int32(capacity % (fkv1.MaxMaxHolders + 1)), damaged: damaged}
		if in.capacity > 1 {
			in.permits = permitsOf(issued, permitMask)
		}
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
		// Rule 9 of a semaphore: the identity checked is the permit entry's
		// for the accepted epoch.
		if d.Allowed && in.capacity > 1 && (d.Reason == fkv1.AdmissionEpochAccepted || d.Reason == fkv1.AdmissionDeleteMarked) {
			if b, ok := lock.LeaseBinding(d.Epoch); !ok || !b.Known || b.User != permitUser(d.Epoch) {
				t.Fatalf("input %+v: accepted epoch %d, binding %+v (%v), want user %s", in, d.Epoch, b, ok, permitUser(d.Epoch))
			}
		}
	})
}

func validPolicy(p string) bool { return p == "" || p == "current" || p == "monotonic" }

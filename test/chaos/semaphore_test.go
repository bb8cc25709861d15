package chaos

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// semHistory builds hand-made semaphore histories (capacity 3).
type semHistory struct{ t0 time.Time }

func (s semHistory) at(ms int) time.Time { return s.t0.Add(time.Duration(ms) * time.Millisecond) }

// permits is a Lease version: its counter and its permits, "EPOCH:UID:HOLDER".
func (s semHistory) permits(rv, counter int64, ms int, ps ...string) Event {
	var list []LivePermit
	for _, p := range ps {
		list = append(list, ParsePermits(p)...)
	}
	return Event{Kind: KindPermits, RV: rv, Object: SemaphoreLock, Epoch: counter, Permits: FormatPermits(list), At: s.at(ms)}
}

func (s semHistory) claim(rv int64, who, uid string, epoch int64, held bool, ms int) Event {
	return Event{Kind: KindSemClaim, RV: rv, Object: "claim-" + who, Who: who, Holder: uid, Epoch: epoch, Held: held, At: s.at(ms)}
}

func (s semHistory) gone(rv int64, who, uid string, epoch int64, ms int) Event {
	e := s.claim(rv, who, uid, epoch, false, ms)
	e.Deleted = true
	return e
}

func (s semHistory) write(rv int64, obj string, epoch int64, who string, ms int) Event {
	return Event{Kind: KindWrite, RV: rv, Object: obj, Epoch: epoch, DataEpoch: epoch, Who: who, Current: true, At: s.at(ms)}
}

// good is a safe history: three permits at once, writes of all three
// holders to one object in any epoch order, s1's permit ending and s4's
// granted in one Lease write (s1's status written first), s1's write in
// flight then accepted inside the window, s2's claim deleted before its
// permit leaves the Lease.
func (s semHistory) good() []Event {
	return []Event{
		s.permits(10, 0, 0),
		s.permits(11, 102, 1, "100:u1:s1", "101:u2:s2", "102:u3:s3"),
		s.claim(12, "s1", "u1", 100, true, 2), s.claim(13, "s2", "u2", 101, true, 3), s.claim(14, "s3", "u3", 102, true, 4),
		s.write(15, "pool-a", 100, "s1", 10), s.write(16, "pool-b", 101, "s2", 11),
		s.write(17, "pool-a", 102, "s3", 12), s.write(18, "pool-a", 100, "s1", 13),
		s.permits(20, 103, 3000, "101:u2:s2", "102:u3:s3", "103:u4:s4"),
		s.claim(21, "s1", "u1", 100, false, 3001), s.claim(22, "s4", "u4", 103, true, 3002),
		s.write(23, "pool-c", 100, "s1", 3100), // in flight when its permit ended: inside the window
		s.write(24, "pool-c", 103, "s4", 3200),
		s.gone(25, "s2", "u2", 101, 3300),
		s.permits(26, 103, 3400, "102:u3:s3", "103:u4:s4"),
		s.write(27, "pool-b", 102, "s3", 3500),
	}
}

func TestCheckSemaphore(t *testing.T) {
	s := semHistory{t0: time.Unix(1000, 0)}
	good := s.good()
	with := func(more ...Event) []Event { return append(append([]Event(nil), good...), more...) }
	without := func(rv int64, more ...Event) []Event {
		var out []Event
		for _, e := range good {
			if e.RV != rv {
				out = append(out, e)
			}
		}
		return append(out, more...)
	}
	monotonic := s.write(30, "pool-a", 103, "s4", 9000)
	monotonic.Current = false
	notToken := s.write(30, "pool-a", 103, "s4", 9000)
	notToken.DataEpoch = 102
	unreadable := s.permits(30, 103, 9000)
	unreadable.PermitsInvalid = true
	cases := []struct {
		name string
		h    []Event
		want string // the only rule flagged, "" for none
	}{
		{"a safe history", good, ""},
		{"a claim deleted (not Expired) no longer counts as Held", without(21, s.gone(21, "s1", "u1", 100, 3001)), ""},
		// (1) never more than 3 permits
		{"a Lease version lists four permits", with(s.permits(30, 105, 9000, "102:u3:s3", "103:u4:s4", "104:u5:s5", "105:u6:s6")), RuleTooManyPermits},
		{"four claims Held at once (the ended holder's status never written)", without(21), RuleTooManyHeld},
		// (2) each epoch permitted to one claim, once
		{"a permit epoch listed for another claim", with(s.permits(30, 103, 9000, "102:u3:s3", "103:u9:s9")), RulePermitTwoClaims},
		{"an ended permit listed again", with(s.permits(30, 103, 9000, "100:u1:s1", "102:u3:s3", "103:u4:s4")), RulePermitRegranted},
		{"a new permit at an epoch already issued", with(s.permits(30, 103, 9000, "90:u7:s7", "102:u3:s3", "103:u4:s4")), RulePermitNotNew},
		{"a permit above the Lease's own counter", with(s.permits(30, 103, 9000, "102:u3:s3", "103:u4:s4", "105:u7:s7")), RulePermitAboveCounter},
		{"one claim listed with two permits at once", with(s.permits(30, 104, 9000, "102:u3:s3", "103:u4:s4", "104:u3:s3")), RuleClaimTwoPermits},
		{"a claim granted again after its permit ended (counted, not flagged)", with(s.permits(30, 104, 9000, "102:u3:s3", "103:u4:s4", "104:u1:s1")), ""},
		{"a claim Held with an epoch never permitted it", with(s.claim(30, "s9", "u9", 104, true, 9000)), RuleHeldNotPermitted},
		{"a claim Held with another claim's permit", with(s.claim(30, "s9", "u9", 103, true, 9000)), RuleHeldNotPermitted},
		{"the counter went back", with(s.permits(30, 102, 9000)), RuleLeaseWentBack},
		{"permit entries that do not parse", with(unreadable), RulePermitsUnreadable},
		// (3) every accepted write presented a live permit's epoch
		{"an ended permit's write accepted past the window", with(s.write(30, "pool-a", 100, "s1", 9000)), RuleStalePermit},
		{"a write with an epoch not yet issued", with(s.write(30, "pool-a", 104, "s4", 9000)), RuleNotAPermit},
		{"a write with an epoch no permit held", with(s.write(30, "pool-a", 99, "s1", 9000)), RuleNotAPermit},
		{"a write accepted before its permit was listed", append([]Event{s.permits(10, 0, 0), s.write(11, "pool-a", 100, "s1", 1)}, s.permits(12, 100, 2, "100:u1:s1")), RuleNotAPermit},
		{"a live permit's epoch written by another holder", with(s.write(30, "pool-a", 103, "s3", 9000)), RuleWrongWriter},
		{"the holder's own write", with(s.write(30, "pool-a", 103, "s4", 9000)), ""},
		{"an object stored policy monotonic", with(monotonic), RuleSemaphoreMonotonic},
		{"data names another epoch than its token", with(notToken), RuleDataNotToken},
		{"the same history out of order (sorted by RV)", append(append([]Event(nil), good[10:]...), good[:10]...), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, st := CheckSemaphore(tc.h, SemaphoreCapacity, time.Second)
			switch {
			case tc.want == "" && len(v) > 0:
				t.Fatalf("unexpected violations: %v", v)
			case tc.want != "" && (len(v) != 1 || v[0].Rule != tc.want):
				t.Fatalf("want exactly %q, got %v", tc.want, v)
			}
			if regrant := strings.HasPrefix(tc.name, "a claim granted again"); (st.Regranted == 1) != regrant {
				t.Fatalf("%d regrants counted", st.Regranted)
			}
			if tc.name == "a safe history" && (st.InsideWindow != 1 || st.Permits != 4 || st.MaxLive != 3 || st.MaxHeld != 3 || st.Writes != 7) {
				t.Fatalf("stats %+v, want 1 inside the window, 4 permits, at most 3 listed and 3 Held, 7 writes", st)
			}
		})
	}
	// The mutex checker's rules are not the semaphore's: its holders write
	// concurrently, an older epoch after a newer one.
	if v, _ := CheckSemaphore(with(s.write(30, "pool-b", 102, "s3", 9000), s.write(31, "pool-b", 103, "s4", 9001), s.write(32, "pool-b", 102, "s3", 9002)), SemaphoreCapacity, time.Second); len(v) != 0 {
		t.Fatalf("concurrent holders' writes flagged: %v", v)
	}
}

func TestCheckPermitBeliefs(t *testing.T) {
	s := semHistory{t0: time.Unix(1000, 0)}
	h := s.good() // s1's permit 100 leaves the Lease at 3000 ms
	ok := []Belief{{Epoch: 100, Who: "s1", At: s.at(2900)}, {Epoch: 101, Who: "s2", At: s.at(3200)}, {Epoch: 103, Who: "s4", At: s.at(5000)}}
	if v := CheckPermitBeliefs(h, ok, time.Second); len(v) != 0 {
		t.Fatalf("unexpected: %v", v)
	}
	late := append(append([]Belief(nil), ok...), Belief{Epoch: 100, Who: "s1", At: s.at(3100)})
	if v := CheckPermitBeliefs(h, late, time.Second); len(v) != 1 || v[0].Rule != RulePermitOutlived {
		t.Fatalf("want one %q, got %v", RulePermitOutlived, v)
	}
	// A broken permit ends at once: its holder's beliefs are exempt for
	// grace after the break was recorded, no longer.
	broken := append(append([]Event(nil), h...), Event{Kind: KindBroken, RV: 19, Object: "claim-s1", Epoch: 100, Holder: "u1", At: s.at(2950)})
	if v := CheckPermitBeliefs(broken, late, time.Second); len(v) != 0 {
		t.Fatalf("a broken permit's belief right after the break counted: %v", v)
	}
	tooLate := append(append([]Belief(nil), late...), Belief{Epoch: 100, Who: "s1", At: s.at(4500)})
	if v := CheckPermitBeliefs(broken, tooLate, time.Second); len(v) != 1 {
		t.Fatalf("a broken holder believing past the grace was not flagged: %v", v)
	}
	if v, _ := CheckSemaphore(broken, SemaphoreCapacity, time.Second); len(v) != 0 {
		t.Fatalf("a recorded break is a violation of CheckSemaphore: %v", v)
	}
}

// The recorder reads a semaphore's Lease versions with their permits and
// every claim version, Held or not, deleted or being deleted.
func TestConvertSemaphore(t *testing.T) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: SemaphoreLock,
		Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: SemaphoreLock},
		Annotations: map[string]string{fkv1.AnnotationEpoch: "101", fkv1.AnnotationMaxHolders: "3",
			fkv1.AnnotationPermitPrefix + "101": `{"claim":"c2","uid":"u2","holder":"s2","ttl":2}`,
			fkv1.AnnotationPermitPrefix + "100": `{"claim":"c1","uid":"u1","holder":"s1","ttl":2}`}}}
	es := convertSemaphore(lease, SemaphoreLock, false)
	if len(es) != 1 || es[0].Kind != KindPermits || es[0].Epoch != 101 || es[0].Permits != "100:u1:s1 101:u2:s2" || es[0].PermitsInvalid {
		t.Fatalf("the Lease was recorded as %+v", es)
	}
	lease.Annotations[fkv1.AnnotationPermitPrefix+"102"] = `not json`
	if es := convertSemaphore(lease, SemaphoreLock, false); len(es) != 1 || !es[0].PermitsInvalid {
		t.Fatalf("unreadable permits were recorded as %+v", es)
	}
	permitLease := lease.DeepCopy()
	permitLease.Name = fkv1.PermitLeaseName(SemaphoreLock, 100)
	if es := convertSemaphore(permitLease, SemaphoreLock, false); len(es) != 0 {
		t.Fatalf("a permit's renewal Lease was recorded: %+v", es)
	}
	claim := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Name: "c1", UID: "u1"},
		Spec:   fkv1.FencedLeaseSpec{LockName: SemaphoreLock, HolderIdentity: "s1"},
		Status: fkv1.FencedLeaseStatus{Phase: fkv1.PhaseHeld, Epoch: 100}}
	if es := convertSemaphore(claim, SemaphoreLock, false); len(es) != 1 || es[0].Kind != KindSemClaim || !es[0].Held || es[0].Deleted || es[0].Epoch != 100 || es[0].Holder != "u1" {
		t.Fatalf("a Held claim was recorded as %+v", es)
	}
	if es := convertSemaphore(claim, SemaphoreLock, true); len(es) != 1 || es[0].Held || !es[0].Deleted {
		t.Fatalf("a deleted claim was recorded as %+v", es)
	}
	deleting := claim.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(1000, 0)}
	if es := convertSemaphore(deleting, SemaphoreLock, false); len(es) != 1 || es[0].Held || !es[0].Deleted {
		t.Fatalf("a claim being deleted was recorded as %+v", es)
	}
	pending := claim.DeepCopy()
	pending.Status = fkv1.FencedLeaseStatus{Phase: fkv1.PhasePending}
	if es := convertSemaphore(pending, SemaphoreLock, false); len(es) != 1 || es[0].Held {
		t.Fatalf("a Pending claim was recorded as %+v", es)
	}
	brokenReq := claim.DeepCopy()
	brokenReq.Annotations = map[string]string{fkv1.AnnotationBreakReason: "hung", fkv1.AnnotationBrokenBy: "alice"}
	if es := convertSemaphore(brokenReq, SemaphoreLock, false); len(es) != 2 || !es[0].Held || es[1].Kind != KindBroken || es[1].Epoch != 100 {
		t.Fatalf("a Held claim with a recorded break was recorded as %+v", es)
	}
	other := claim.DeepCopy()
	other.Spec.LockName = "report"
	if es := convertSemaphore(other, SemaphoreLock, false); len(es) != 0 {
		t.Fatalf("another lock's claim was recorded: %+v", es)
	}
}

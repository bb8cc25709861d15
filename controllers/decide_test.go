package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var t0 = time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC)

func claim(name string, created int, phase fkv1.FencedLeasePhase, epoch int64) *fkv1.FencedLease {
	return &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(created) * time.Second))},
		Spec:       fkv1.FencedLeaseSpec{LockName: "report-2026-07", HolderIdentity: name, LeaseDurationSeconds: ptr.To(int32(30))},
		Status:     fkv1.FencedLeaseStatus{Phase: phase, Epoch: epoch},
	}
}

func held(epoch int64, holder string) ledger {
	return ledger{epoch: epoch, epochValid: true, holderName: holder, holderUID: types.UID("uid-" + holder), managedFully: true}
}

func TestDecide(t *testing.T) {
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	w3 := claim("w3", 3, fkv1.PhasePending, 0)
	expiredW1 := claim("w1", 0, fkv1.PhaseExpired, 41)
	cases := []struct {
		name       string
		snap       lockSnapshot
		write      bool
		grant      string
		epoch      int64
		end        holderEnd
		requeueMin time.Duration
	}{
		{name: "holder renewed recently keeps the lock; nothing written",
			snap:  lockSnapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(10 * time.Second), leaseDurationOnLease: 30},
			write: false, grant: "w1", epoch: 41, requeueMin: 20 * time.Second},
		{name: "holder not renewed for a full TTL expires; FIFO waiter (oldest) gets epoch+1",
			snap:  lockSnapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2, w3}, renewSeenAt: t0, now: t0.Add(30 * time.Second), leaseDurationOnLease: 30},
			write: true, grant: "w3", epoch: 42, end: holderExpired},
		{name: "one nanosecond before the TTL the holder still holds",
			snap:  lockSnapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(30*time.Second - 1), leaseDurationOnLease: 30},
			write: false, grant: "w1", epoch: 41},
		{name: "holder claim gone is released; the next waiter is granted",
			snap:  lockSnapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w2}, renewSeenAt: t0, now: t0},
			write: true, grant: "w2", epoch: 42, end: holderReleased},
		{name: "released with nobody waiting frees the lock and keeps the epoch",
			snap:  lockSnapshot{ledger: held(41, "w1"), claims: nil, renewSeenAt: t0, now: t0},
			write: true, epoch: 41, end: holderReleased},
		{name: "an Expired holder (terminal) gives the lock up",
			snap:  lockSnapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{expiredW1, w2}, renewSeenAt: t0, now: t0},
			write: true, grant: "w2", epoch: 42, end: holderGaveUp},
		{name: "a Lease edited below an issued epoch grants above the floor",
			snap:  lockSnapshot{ledger: ledger{epoch: 3, epochValid: true, managedFully: true}, claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 41, now: t0},
			write: true, grant: "w2", epoch: 42},
		{name: "a Lease edited below an issued epoch with nobody waiting is repaired",
			snap:  lockSnapshot{ledger: ledger{epoch: 3, epochValid: true, managedFully: true}, claims: []*fkv1.FencedLease{expiredW1}, floor: 41, now: t0},
			write: true, epoch: 41},
		{name: "an Expired or once-held claim is never granted again",
			snap:  lockSnapshot{ledger: ledger{epoch: 41, epochValid: true, managedFully: true}, claims: []*fkv1.FencedLease{expiredW1, claim("x", 0, fkv1.PhasePending, 7)}, now: t0},
			write: false, epoch: 41},
		{name: "the previous holder (status never written) is not granted again",
			snap: lockSnapshot{ledger: ledger{epoch: 41, epochValid: true, managedFully: true, previousUID: "uid-w2"},
				claims: []*fkv1.FencedLease{w2}, now: t0},
			write: false, epoch: 41},
		{name: "a Lease missing its finalizer is adopted",
			snap:  lockSnapshot{ledger: ledger{epoch: 5, epochValid: true}, now: t0},
			write: true, epoch: 5},
		{name: "ties in creationTimestamp go by name",
			snap:  lockSnapshot{ledger: ledger{epochValid: true, managedFully: true}, claims: []*fkv1.FencedLease{claim("b", 1, "", 0), claim("a", 1, "", 0)}, now: t0},
			write: true, grant: "a", epoch: 1},
		{name: "TTL changed on the holder claim is copied to the Lease",
			snap:  lockSnapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1}, renewSeenAt: t0, now: t0, leaseDurationOnLease: 15},
			write: true, grant: "w1", epoch: 41},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.snap)
			if d.writeLease != tc.write {
				t.Errorf("writeLease = %v, want %v", d.writeLease, tc.write)
			}
			got := ""
			if d.newHolder != nil {
				got = d.newHolder.Name
			}
			if got != tc.grant {
				t.Errorf("holder = %q, want %q", got, tc.grant)
			}
			if d.epoch != tc.epoch {
				t.Errorf("epoch = %d, want %d", d.epoch, tc.epoch)
			}
			if d.end != tc.end {
				t.Errorf("end = %q, want %q", d.end, tc.end)
			}
			if d.requeueAfter < tc.requeueMin {
				t.Errorf("requeueAfter = %v, want >= %v", d.requeueAfter, tc.requeueMin)
			}
		})
	}
}

func TestParseEpoch(t *testing.T) {
	good := map[string]int64{"0": 0, "1": 1, "42": 42, "9223372036854775807": 9223372036854775807}
	for s, want := range good {
		if got, err := parseEpoch(s); err != nil || got != want {
			t.Errorf("parseEpoch(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "abc", "-1", "+5", " 5", "5 ", "05", "9223372036854775808", "1e3", "0x10"} {
		if _, err := parseEpoch(s); err == nil {
			t.Errorf("parseEpoch(%q) succeeded, want an error", s)
		}
	}
}

func TestDesiredStatusNeverLeavesExpired(t *testing.T) {
	c := claim("w1", 0, fkv1.PhaseExpired, 41)
	st, tr := desiredStatus(c, statusInputs{ledger: held(41, "w1")})
	if st.Phase != fkv1.PhaseExpired || tr != "" {
		t.Fatalf("Expired claim moved to %s (%s)", st.Phase, tr)
	}
}

func TestDesiredStatusIgnoresALeaseOlderThanTheGrant(t *testing.T) {
	// A cache behind another controller's grant of epoch 42 to w1 shows the
	// Lease at epoch 41 held by someone else: w1 must not be demoted.
	c := claim("w1", 0, fkv1.PhaseHeld, 42)
	st, _ := desiredStatus(c, statusInputs{ledger: held(41, "w0")})
	if st.Phase != fkv1.PhaseHeld {
		t.Fatalf("demoted on a stale Lease: %s", st.Phase)
	}
	// The Lease at or past the grant, naming someone else: demoted.
	st, tr := desiredStatus(c, statusInputs{ledger: held(43, "w2")})
	if st.Phase != fkv1.PhaseExpired || tr != fkv1.ReasonSuperseded {
		t.Fatalf("got %s/%s, want Expired/Superseded", st.Phase, tr)
	}
}

func TestRenewalTrackerUsesItsOwnClock(t *testing.T) {
	fc := &fakeClock{now: t0}
	tr := newRenewalTracker(fc)
	lock := types.NamespacedName{Namespace: "reports", Name: "report-2026-07"}
	seen := tr.observe(lock, "uid-w1", "09:00:00")
	fc.now = fc.now.Add(20 * time.Second)
	if got := tr.observe(lock, "uid-w1", "09:00:00"); !got.Equal(seen) {
		t.Fatalf("unchanged renewTime moved the observation to %v", got)
	}
	// A renewTime written with a clock far in the past or future counts only
	// as "changed": the observation is our own now.
	if got := tr.observe(lock, "uid-w1", "1999-01-01T00:00:00Z"); !got.Equal(fc.now) {
		t.Fatalf("observation = %v, want our now %v", got, fc.now)
	}
	tr.raiseFloor(lock, 42)
	tr.raiseFloor(lock, 7)
	if tr.floor(lock) != 42 {
		t.Fatalf("floor went down to %d", tr.floor(lock))
	}
}

type fakeClock struct{ now time.Time }

func (f *fakeClock) Now() time.Time                  { return f.now }
func (f *fakeClock) Since(t time.Time) time.Duration { return f.now.Sub(t) }

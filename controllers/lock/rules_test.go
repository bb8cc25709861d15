package lock

import (
	"math"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// Each of decide's rules, on its own. TestDecide holds the chain to the
// whole rule book.

func TestRuleSettled(t *testing.T) {
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	cases := []struct {
		name string
		snap snapshot
		kind actionKind
		ok   bool
	}{
		{"a foreign Lease blocks the lock, claims or not", snapshot{foreign: "not ours", claims: []*fkv1.FencedLease{w2}}, actForeign, true},
		{"a deleted Lease with no claim left is let go", snapshot{hasLease: true, leaseDeleting: true, ledger: held(41, "w1")}, actReleaseFinalizer, true},
		{"nobody holds or waits", snapshot{ledger: free(41), hasLease: true}, actIdle, true},
		{"owners to remove on a free Lease: not idle", snapshot{ledger: free(41), hasLease: true, foreignOwners: true}, 0, false},
		{"a held lock is not settled", snapshot{ledger: held(41, "w1"), hasLease: true}, 0, false},
		{"a waiter is not settled", snapshot{ledger: free(41), claims: []*fkv1.FencedLease{w2}}, 0, false},
	}
	for _, tc := range cases {
		a, ok := settled(tc.snap)
		if ok != tc.ok || (ok && a.kind != tc.kind) {
			t.Errorf("%s: got %v %v, want %v %v", tc.name, a.kind, ok, tc.kind, tc.ok)
		}
	}
}

func TestRuleEpochSource(t *testing.T) {
	w1 := claim("w1", 0, fkv1.PhaseHeld, 0) // its grant's status patch never happened
	cases := []struct {
		name               string
		snap               snapshot
		next, start        int64
		nextOK, startOK    bool
		repaired, newLedge bool
	}{
		{name: "the counter counts up", snap: snapshot{ledger: free(41)}, next: 42, nextOK: true, start: 41},
		{name: "a floor above the counter repairs it", snap: snapshot{ledger: free(41), floor: 50}, next: 51, nextOK: true, start: 50, repaired: true},
		{name: "a new ledger waits for the storage revision", snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, floor: 41},
			start: 41, repaired: true, newLedge: true},
		{name: "a new ledger starts at the storage revision", snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, floor: 41, storageRevision: 5000},
			next: 5000, nextOK: true, start: 5000, startOK: true, repaired: true, newLedge: true},
		{name: "a floor above the revision wins", snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, floor: 6000, storageRevision: 5000},
			next: 6001, nextOK: true, start: 6000, startOK: true, repaired: true, newLedge: true},
		{name: "an unrecorded holder below the floor starts a new ledger", snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1}, floor: 45, storageRevision: 5000},
			next: 5000, nextOK: true, start: 5000, startOK: true, repaired: true, newLedge: true},
	}
	for _, tc := range cases {
		e := epochsOf(tc.snap)
		next, nextOK := e.next()
		start, startOK := e.start()
		if (nextOK && next != tc.next) || nextOK != tc.nextOK || start != tc.start || startOK != tc.startOK || e.repaired != tc.repaired || e.newLedger != tc.newLedge {
			t.Errorf("%s: next %d %v, start %d %v, repaired %v, new %v", tc.name, next, nextOK, start, startOK, e.repaired, e.newLedger)
		}
	}
}

func TestRuleHolderOutcome(t *testing.T) {
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	podW1 := madeByBridge(w1, "p1")
	cases := []struct {
		name     string
		snap     snapshot
		end      holderEnd
		kept     bool
		ttlFixed bool
	}{
		{name: "not held", snap: snapshot{ledger: free(41)}},
		{name: "claim gone: released", snap: snapshot{ledger: held(41, "w1")}, end: holderReleased},
		{name: "pod gone: released", snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{podW1}, holderPod: pods.Gone}, end: holderReleased},
		{name: "its claim already Expired", snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{claim("w1", 0, fkv1.PhaseExpired, 41)}}, end: holderGaveUp},
		{name: "renewed within its TTL: kept", snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1}, renewSeenAt: t0, now: t0.Add(29 * time.Second)}, kept: true},
		{name: "a TTL without renewal: expired", snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1}, renewSeenAt: t0, now: t0.Add(30 * time.Second)}, end: holderExpired},
		{name: "a live pod renews by being live", snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{podW1}, holderPod: pods.Live, renewSeenAt: t0, now: t0.Add(time.Hour)}, kept: true},
		{name: "a counter set back below an epoch issued after the holder's: its epoch is lost",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1}, floor: 45, renewSeenAt: t0, now: t0}, end: holderEpochLost},
		{name: "a Lease TTL shortened by hand is repaired, the holder kept",
			snap: snapshot{ledger: func() fkv1.Ledger { l := held(41, "w1"); l.LeaseDurationSeconds = 5; return l }(), claims: []*fkv1.FencedLease{w1}, renewSeenAt: t0, now: t0.Add(10 * time.Second)},
			kept: true, ttlFixed: true},
	}
	for _, tc := range cases {
		o := holderOutcome(tc.snap, epochsOf(tc.snap))
		if o.end != tc.end || (o.holder != nil) != tc.kept || o.ttlRepair != tc.ttlFixed {
			t.Errorf("%s: end %q kept %v ttlRepair %v", tc.name, o.end, o.holder != nil, o.ttlRepair)
		}
	}
}

func TestRuleNextGrant(t *testing.T) {
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	w3 := claim("w3", 3, fkv1.PhasePending, 0)
	notReady := madeByBridge(w3, "p3")
	cases := []struct {
		name   string
		snap   snapshot
		done   bool
		kind   actionKind
		holder string
		epoch  int64
		exh    bool
	}{
		{name: "nobody waits", snap: snapshot{ledger: free(41)}},
		{name: "the oldest waiter gets epoch+1", snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{w2, w3}}, done: true, kind: actGrant, holder: "w3", epoch: 42},
		{name: "a pod not ready yet keeps its place, passed over", snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{w2, notReady},
			waiterPods: map[types.UID]pods.Liveness{notReady.UID: pods.NotLive}}, done: true, kind: actGrant, holder: "w2", epoch: 42},
		{name: "a new ledger without the revision writes nothing", snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, claims: []*fkv1.FencedLease{w2}}, done: true, kind: actKeep},
		{name: "every epoch issued: exhausted, nobody granted", snap: snapshot{ledger: free(math.MaxInt64), claims: []*fkv1.FencedLease{w2}}, exh: true},
	}
	for _, tc := range cases {
		ep := epochsOf(tc.snap)
		a, done := nextGrant(tc.snap, ep, action{kind: actKeep, epoch: ep.issued})
		name := ""
		if a.holder != nil {
			name = a.holder.Name
		}
		if done != tc.done || a.exhausted != tc.exh || (done && (a.kind != tc.kind || name != tc.holder || (tc.kind == actGrant && a.epoch != tc.epoch))) {
			t.Errorf("%s: done %v kind %v holder %q epoch %d exhausted %v", tc.name, done, a.kind, name, a.epoch, a.exhausted)
		}
	}
}

func TestRuleFreeLockAndRepairLedger(t *testing.T) {
	newLedger := snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true}, floor: 41}
	withRev := newLedger
	withRev.storageRevision = 5000

	if a := freeLock(epochsOf(snapshot{ledger: held(41, "w1")}), action{epoch: 41, end: holderReleased}); a.kind != actFree || a.epoch != 41 {
		t.Errorf("a free keeps the epoch: %+v", a)
	}
	if a := freeLock(epochsOf(newLedger), action{epoch: 41, end: holderReleased}); a.kind != actKeep {
		t.Errorf("a new ledger freed without the revision: %+v", a)
	}
	if a := freeLock(epochsOf(withRev), action{epoch: 41, end: holderReleased}); a.kind != actFree || a.epoch != 5000 || !a.repaired {
		t.Errorf("a new ledger's free starts at the revision: %+v", a)
	}
	sound := snapshot{ledger: free(41)}
	if a := repairLedger(sound, epochsOf(sound), action{kind: actKeep, epoch: 41}, false); a.kind != actKeep {
		t.Errorf("a sound Lease repaired: %+v", a)
	}
	unadopted := snapshot{ledger: fkv1.Ledger{Exists: true, Epoch: 41, EpochValid: true}}
	if a := repairLedger(unadopted, epochsOf(unadopted), action{kind: actKeep, epoch: 41}, false); a.kind != actRepair || a.epoch != 41 {
		t.Errorf("a Lease without its labels is adopted at its epoch: %+v", a)
	}
	if a := repairLedger(withRev, epochsOf(withRev), action{kind: actKeep, epoch: 41}, false); a.kind != actRepair || a.epoch != 5000 {
		t.Errorf("a new ledger written without a holder starts at the revision: %+v", a)
	}
	if a := repairLedger(newLedger, epochsOf(newLedger), action{kind: actKeep, epoch: 41}, false); a.kind != actKeep {
		t.Errorf("a new ledger repaired without the revision: %+v", a)
	}
}

package lock

import (
	"math"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// semClaim is claim c asking for a semaphore of capacity n.
func semClaim(name string, created int, phase fkv1.FencedLeasePhase, epoch int64, n int32) *fkv1.FencedLease {
	c := claim(name, created, phase, epoch)
	c.Spec.MaxHolders = ptr.To(n)
	return c
}

// semLedger is a semaphore ledger of capacity n at counter epoch, with a
// live permit for each (claim name, epoch) pair.
func semLedger(epoch int64, n int32, permits ...any) fkv1.Ledger {
	l := free(epoch)
	l.Capacity = n
	for i := 0; i < len(permits); i += 2 {
		name := permits[i].(string)
		l.Permits = append(l.Permits, fkv1.Permit{Epoch: int64(permits[i+1].(int)), Claim: name, UID: types.UID("uid-" + name), Holder: name, User: "user-" + name, TTL: 30})
	}
	return l
}

// live is a permit state renewed at seen.
func live(l fkv1.Ledger, claims []*fkv1.FencedLease, seen time.Time) []permitState {
	var out []permitState
	for _, p := range l.Permits {
		out = append(out, permitState{Permit: p, claim: findClaim(claims, p.UID), pod: pods.NotAPod, renewSeenAt: seen})
	}
	return out
}

func semSnapshot(l fkv1.Ledger, now time.Time, claims ...*fkv1.FencedLease) snapshot {
	return snapshot{ledger: l, hasLease: true, claims: claims, permits: live(l, claims, t0), now: now, storageRevision: 7}
}

type grantedPermit struct {
	claim string
	epoch int64
}

func grantsOf(a action) []grantedPermit {
	var out []grantedPermit
	for _, g := range a.grants {
		out = append(out, grantedPermit{g.claim.Name, g.epoch})
	}
	return out
}

func endsOf(a action) map[string]holderEnd {
	out := map[string]holderEnd{}
	for _, e := range a.permitEnds {
		out[e.Claim] = e.end
	}
	return out
}

func TestDecideSemaphore(t *testing.T) {
	a1 := semClaim("a1", 1, fkv1.PhaseHeld, 41, 3)
	a2 := semClaim("a2", 2, fkv1.PhaseHeld, 42, 3)
	a3 := semClaim("a3", 3, fkv1.PhasePending, 0, 3)
	a4 := semClaim("a4", 4, fkv1.PhasePending, 0, 3)
	a5 := semClaim("a5", 5, fkv1.PhasePending, 0, 3)
	m6 := claim("m6", 6, fkv1.PhasePending, 0) // a mutex claim
	b := func(c *fkv1.FencedLease) *fkv1.FencedLease {
		c = c.DeepCopy()
		c.Annotations[fkv1.AnnotationBreakReason], c.Annotations[fkv1.AnnotationBrokenBy] = "stuck", "alice"
		return c
	}
	cases := []struct {
		name     string
		snap     snapshot
		kind     actionKind
		capacity int32
		grants   []grantedPermit
		ends     map[string]holderEnd
		permits  []int64
	}{
		{name: "a free mutex ledger whose first waiter asks for 3: the first three waiters get the next three epochs in one write",
			snap: snapshot{ledger: free(40), hasLease: true, claims: []*fkv1.FencedLease{a3, a4, a5, semClaim("a6", 7, "", 0, 3)}, now: t0},
			kind: actGrant, capacity: 3, grants: []grantedPermit{{"a3", 41}, {"a4", 42}, {"a5", 43}}, permits: []int64{41, 42, 43}},
		{name: "two permits live and renewed: the one free permit goes to the first waiter",
			snap: semSnapshot(semLedger(42, 3, "a1", 41, "a2", 42), t0.Add(10*time.Second), a1, a2, a3, a4),
			kind: actGrant, capacity: 3, grants: []grantedPermit{{"a3", 43}}, permits: []int64{41, 42, 43}},
		{name: "all permits live: nobody is granted, nothing written",
			snap: semSnapshot(semLedger(43, 3, "a1", 41, "a2", 42, "a3", 43), t0.Add(10*time.Second), a1, a2, semClaim("a3", 3, fkv1.PhaseHeld, 43, 3), a4),
			kind: actKeep, capacity: 3, permits: []int64{41, 42, 43}},
		{name: "a permit whose claim is gone is released; its permit goes to the next waiter with a new epoch",
			snap: semSnapshot(semLedger(42, 2, "a1", 41, "a2", 42), t0.Add(time.Second), a2, semClaim("a3", 3, fkv1.PhasePending, 0, 2)),
			kind: actGrant, capacity: 2, grants: []grantedPermit{{"a3", 43}}, ends: map[string]holderEnd{"a1": holderReleased}, permits: []int64{42, 43}},
		{name: "a permit not renewed for its TTL expires on its own; the others stay",
			snap: func() snapshot {
				s := semSnapshot(semLedger(42, 3, "a1", 41, "a2", 42), t0.Add(30*time.Second), a1, a2)
				s.permits[1].renewSeenAt = t0.Add(20 * time.Second)
				return s
			}(),
			kind: actFree, capacity: 3, ends: map[string]holderEnd{"a1": holderExpired}, permits: []int64{42}},
		{name: "a broken permit ends at once",
			snap: semSnapshot(semLedger(42, 3, "a1", 41, "a2", 42), t0.Add(time.Second), b(a1), a2),
			kind: actFree, capacity: 3, ends: map[string]holderEnd{"a1": holderForced}, permits: []int64{42}},
		{name: "a permit whose claim records another epoch ends (a grant is never re-epoched)",
			snap: semSnapshot(semLedger(42, 3, "a1", 40, "a2", 42), t0.Add(time.Second), a1, a2),
			kind: actFree, capacity: 3, ends: map[string]holderEnd{"a1": holderEpochLost}, permits: []int64{42}},
		{name: "a waiter asking for another capacity stops the queue while permits are live (FIFO across capacities)",
			snap: semSnapshot(semLedger(42, 3, "a1", 41, "a2", 42), t0.Add(time.Second), a1, a2, semClaim("x", 3, "", 0, 2), a4),
			kind: actKeep, capacity: 3, permits: []int64{41, 42}},
		{name: "the lock drained, the first waiter asks for a mutex: the capacity goes back to 1, no permit granted",
			snap: semSnapshot(semLedger(42, 3, "a1", 41), t0.Add(time.Second), m6),
			kind: actFree, capacity: 1, ends: map[string]holderEnd{"a1": holderReleased}},
		{name: "the lock drained, the first waiter asks for 2: the capacity becomes 2 and two are granted",
			snap: semSnapshot(semLedger(42, 3), t0, semClaim("x", 3, "", 0, 2), semClaim("y", 4, "", 0, 2), semClaim("z", 5, "", 0, 2)),
			kind: actGrant, capacity: 2, grants: []grantedPermit{{"x", 43}, {"y", 44}}, permits: []int64{43, 44}},
		{name: "unreadable permits: none is trusted or kept, and the Lease is rewritten; the waiters get epochs above everything recorded",
			snap: func() snapshot {
				s := semSnapshot(semLedger(42, 3), t0, a1, a3)
				s.ledger.PermitsInvalid, s.floor = true, 41
				return s
			}(),
			kind: actGrant, capacity: 3, grants: []grantedPermit{{"a3", 43}}, permits: []int64{43}},
		{name: "an unbound waiter is passed over, as for a mutex",
			snap: semSnapshot(semLedger(42, 3), t0, unbound(a3), a4),
			kind: actGrant, capacity: 3, grants: []grantedPermit{{"a4", 43}}, permits: []int64{43}},
		{name: "a new ledger's permits start at the storage revision and the term floor",
			snap: func() snapshot {
				s := snapshot{ledger: fkv1.Ledger{Exists: true, EpochValid: true, Adopted: true}, hasLease: true, claims: []*fkv1.FencedLease{a3, a4}, now: t0, storageRevision: 900, termFloor: 950}
				return s
			}(),
			kind: actGrant, capacity: 3, grants: []grantedPermit{{"a3", 950}, {"a4", 951}}, permits: []int64{950, 951}},
		{name: "a counter set back below a live permit is repaired above it",
			snap: func() snapshot {
				s := semSnapshot(semLedger(10, 3, "a1", 41), t0.Add(time.Second), a1, a3)
				s.floor = 41
				return s
			}(),
			kind: actGrant, capacity: 3, grants: []grantedPermit{{"a3", 42}}, permits: []int64{41, 42}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !semaphoreLock(tc.snap) {
				t.Fatalf("not decided as a semaphore")
			}
			a := decide(tc.snap)
			if a.kind != tc.kind || a.capacity != tc.capacity {
				t.Errorf("kind %v capacity %d; want %v %d", a.kind, a.capacity, tc.kind, tc.capacity)
			}
			if got := grantsOf(a); !slices.Equal(got, tc.grants) {
				t.Errorf("grants %v; want %v", got, tc.grants)
			}
			if got := endsOf(a); len(got) != len(tc.ends) || !mapsEqual(got, tc.ends) {
				t.Errorf("ends %v; want %v", got, tc.ends)
			}
			var epochs []int64
			for _, p := range a.permits {
				epochs = append(epochs, p.Epoch)
			}
			if !slices.Equal(epochs, tc.permits) {
				t.Errorf("permits after %v; want %v", epochs, tc.permits)
			}
			if len(a.permits) > int(a.capacity) {
				t.Errorf("%d permits over capacity %d", len(a.permits), a.capacity)
			}
		})
	}
}

func mapsEqual(a, b map[string]holderEnd) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A held mutex whose first waiter asks for a semaphore: the hold ends, the
// lock is freed, not granted to the semaphore claim as a mutex, nor to the
// mutex claim behind it.
func TestMutexHandsOverToSemaphore(t *testing.T) {
	s := snapshot{ledger: held(41, "w1"), hasLease: true, claims: []*fkv1.FencedLease{semClaim("a3", 3, "", 0, 3), claim("m6", 6, "", 0)}, now: t0}
	if semaphoreLock(s) {
		t.Fatal("a held mutex is decided as a mutex")
	}
	a := decide(s)
	if a.kind != actFree || a.holder != nil || a.end != holderReleased {
		t.Fatalf("got %v holder %v end %v; want the lock freed", a.kind, a.holder, a.end)
	}
}

// Permits are granted up to the last epoch there is, never past it.
func TestSemaphoreEpochsExhausted(t *testing.T) {
	s := semSnapshot(semLedger(math.MaxInt64-1, 3), t0, semClaim("x", 1, "", 0, 3), semClaim("y", 2, "", 0, 3))
	a := decide(s)
	if got := grantsOf(a); !slices.Equal(got, []grantedPermit{{"x", math.MaxInt64}}) {
		t.Fatalf("grants %v", got)
	}
	s = semSnapshot(semLedger(math.MaxInt64, 3), t0, semClaim("y", 2, "", 0, 3))
	if a := decide(s); len(a.grants) != 0 || !a.exhausted {
		t.Fatalf("granted past the last epoch: %v exhausted %v", grantsOf(a), a.exhausted)
	}
}

// A waiter whose deadline passed is timed out, never granted, in the same
// write as the grants to those before it.
func TestSemaphoreAcquireTimeout(t *testing.T) {
	late := semClaim("late", 2, "", 0, 1+1)
	late.Spec.AcquireTimeoutSeconds = ptr.To(int32(0))
	s := semSnapshot(semLedger(42, 2, "a1", 41), t0, semClaim("a1", 1, fkv1.PhaseHeld, 41, 2), semClaim("x", 1, "", 0, 2), late)
	a := decide(s)
	if got := grantsOf(a); !slices.Equal(got, []grantedPermit{{"x", 43}}) {
		t.Fatalf("grants %v", got)
	}
	if len(a.timedOut) != 1 || a.timedOut[0].Name != "late" {
		t.Fatalf("timed out %v; want late", a.timedOut)
	}
}

// A try-once waiter at the head is granted a free permit at the first
// decision, not also timed out in the same write.
func TestSemaphoreTryOnceGrantedNotTimedOut(t *testing.T) {
	once := semClaim("once", 2, "", 0, 2)
	once.Spec.AcquireTimeoutSeconds = ptr.To(int32(0))
	s := semSnapshot(semLedger(42, 2, "a1", 41), t0, semClaim("a1", 1, fkv1.PhaseHeld, 41, 2), once)
	a := decide(s)
	if got := grantsOf(a); !slices.Equal(got, []grantedPermit{{"once", 43}}) {
		t.Fatalf("grants %v", got)
	}
	if len(a.timedOut) != 0 {
		t.Fatalf("granted and timed out in one write: %v", a.timedOut)
	}
}

// The longest-hold gauge counts a semaphore's oldest live permit.
func TestSemaphoreHeldSince(t *testing.T) {
	a1 := semClaim("a1", 1, fkv1.PhaseHeld, 41, 3)
	a1.Status.AcquireTime = &metav1.Time{Time: t0.Add(-time.Minute)}
	s := semSnapshot(semLedger(41, 3, "a1", 41), t0.Add(time.Second), a1, semClaim("a2", 2, "", 0, 3))
	a := decide(s)
	var m lockMemory
	summarizeQueue(&m, gathered{snapshot: s}, a)
	if !m.heldSince.Equal(t0.Add(-time.Minute)) {
		t.Fatalf("heldSince %v; want the oldest permit's grant %v", m.heldSince, t0.Add(-time.Minute))
	}
	if m.waiting != 0 {
		t.Fatalf("waiting %d after a2 was granted", m.waiting)
	}
}

package lock

// Semaphore regressions: interleavings that once broke a rule of the
// semaphore ledger, each a test that failed before its fix.

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// act publishes View{Permits: ...} for a semaphore (HeldEpoch
// 0), but memory.view returns no view whose HeldEpoch is 0 (and
// publishView stores none for a lock without memory), so FreshPermits is
// never fresh: the webhook reads every semaphore admission live, and
// FreshView for such a lock returns floor 0, which is what lets the
// webhook trust a cached free mutex Lease.
func TestRegressionSemaphoreViewIsNeverVouched(t *testing.T) {
	fc := &fakeClock{now: t0}
	r := NewReconciler(nil, nil, nil, Options{Clock: fc})
	r.term.caughtUp.Store(true)
	lock := types.NamespacedName{Namespace: "reports", Name: "sem"}
	r.memory.locks[lock] = &lockMemory{floor: 43} // the lock's memory as a reconcile stores it
	r.memory.publishView(lock, View{Permits: []int64{41, 42, 43}, Floor: 43, deadline: t0.Add(30 * time.Second)})
	if permits, _, ok := r.FreshPermits(lock); !ok || len(permits) != 3 {
		t.Fatalf("FreshPermits = %v, %v right after the authority published permits 41-43; want them vouched for", permits, ok)
	}
}

// A permit's renewal Lease that goes missing (deleted by an
// admin with the guard off, or missing from the cache for a moment) turns
// the permit's renewal signal from the last renewTime into "no renewTime",
// and renews() counts any change as a renewal: the permit gets a fresh TTL
// from that moment though its holder never renewed. The manager then
// re-creates the Lease without renewTime, which is no further change, so
// the permit outlives its TTL by up to a full TTL per disappearance.
// (syncPermitLeases says the re-creation is meant to be "no renewal".)
func TestRegressionMissingPermitLeaseCountsAsRenewal(t *testing.T) {
	a1 := semClaim("a1", 1, fkv1.PhaseHeld, 41, 3)
	l := semLedger(41, 3, "a1", 41)
	p := l.Permits[0]
	grant := metav1.NewMicroTime(t0)
	permitLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fkv1.PermitLeaseName("report-2026-07", 41),
		Annotations: map[string]string{fkv1.AnnotationClaimUID: string(p.UID)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a1"), RenewTime: &grant}}

	var mem lockMemory
	// Granted at t0 (grantedPermits): the grant is the first renewal.
	mem.grantedPermit(41, renewal{holderUID: p.UID, pod: pods.NotAPod, renewTime: grant.UTC().Format(time.RFC3339Nano)}, t0)
	// t0+1s: the permit Lease as created, renewed at the grant; the holder
	// then pauses and never renews again.
	sig, known := permitRenewal(permitLease, p, pods.NotAPod, "")
	mem.observePermit(41, sig, known, t0.Add(time.Second))
	// t0+25s: the permit Lease is gone (an admin deleted it); the manager
	// re-creates it with no renewTime.
	sig, known = permitRenewal(nil, p, pods.NotAPod, "")
	mem.observePermit(41, sig, known, t0.Add(25*time.Second))
	recreated := permitLease.DeepCopy()
	recreated.Spec.RenewTime = nil
	sig, known = permitRenewal(recreated, p, pods.NotAPod, "")
	seen, _ := mem.observePermit(41, sig, known, t0.Add(31*time.Second))

	// t0+31s: one TTL (30 s) after the last renewal (the grant), the permit
	// must have ended.
	s := snapshot{ledger: l, hasLease: true, claims: []*fkv1.FencedLease{a1}, now: t0.Add(31 * time.Second), storageRevision: 7,
		permits: []permitState{{Permit: p, claim: a1, pod: pods.NotAPod, renewSeenAt: seen}}}
	a := decideSemaphore(s)
	if endsOf(a)["a1"] != holderExpired {
		t.Fatalf("permit 41 last renewed at its grant (t0) is still live at t0+31s (TTL 30s): its renewal is taken as seen at %v, "+
			"when its renewal Lease went missing", seen.Sub(t0))
	}
}

// the lock's capacity
// annotation made unreadable while 3 permits of a semaphore of 3 are live.
// decideSemaphore then takes the first waiter's capacity (5) although
// permits are live, and grants 2 more permits: 5 live permits whose first
// three holders were granted a semaphore of 3 (docs/design.md §9: the
// capacity is recorded while the lock has no holder).
func TestRegressionUnreadableCapacityGrantsBeyondLivePermitsCapacity(t *testing.T) {
	a1 := semClaim("a1", 1, fkv1.PhaseHeld, 41, 3)
	a2 := semClaim("a2", 2, fkv1.PhaseHeld, 42, 3)
	a3 := semClaim("a3", 3, fkv1.PhaseHeld, 43, 3)
	b1 := semClaim("b1", 4, fkv1.PhasePending, 0, 5)
	b2 := semClaim("b2", 5, fkv1.PhasePending, 0, 5)
	l := semLedger(43, 3, "a1", 41, "a2", 42, "a3", 43)
	l.Capacity, l.CapacityInvalid = 0, true // fencekeeper.io/max-holders: "three"
	a := decideSemaphore(semSnapshot(l, t0.Add(time.Second), a1, a2, a3, b1, b2))
	if len(a.grants) > 0 || len(a.permits) > 3 {
		t.Fatalf("with 3 live permits of a semaphore of 3 and its capacity annotation unreadable, the decision grants %v "+
			"(capacity %d, %d live permits after it)", grantsOf(a), a.capacity, len(a.permits))
	}
}

package lock

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestLeaseAfter(t *testing.T) {
	lock := types.NamespacedName{Namespace: "reports", Name: "report-2026-07"}
	now := metav1.NewMicroTime(t0)
	earlier := metav1.NewMicroTime(t0.Add(-10 * 1e9))
	heldLease := func() *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name, ResourceVersion: "7", UID: "lease-1"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("w1"), LeaseDurationSeconds: ptr.To(int32(30)),
				AcquireTime: &earlier, RenewTime: &earlier, LeaseTransitions: ptr.To(int32(3))}}
		held(41, "w1").ApplyTo(l, lock.Name)
		l.Finalizers = []string{fkv1.LeaseFinalizer}
		return l
	}
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	w2.Spec.LeaseDurationSeconds = ptr.To(int32(20))

	t.Run("a grant names the new holder with the next epoch and remembers the previous one", func(t *testing.T) {
		g := NewWithT(t)
		cur := heldLease()
		l := leaseAfter(lock, cur, fkv1.ReadLedger(cur, lock.Name), action{kind: actGrant, holder: w2, epoch: 42, leaseDuration: 20}, now)
		led := fkv1.ReadLedger(l, lock.Name)
		g.Expect(led.Epoch).To(Equal(int64(42)))
		g.Expect(led.HolderUID).To(Equal(w2.UID))
		g.Expect(led.HolderClaim).To(Equal("w2"))
		g.Expect(led.PreviousUID).To(Equal(types.UID("uid-w1")))
		g.Expect(led.Adopted).To(BeTrue())
		g.Expect(*l.Spec.HolderIdentity).To(Equal("w2"))
		g.Expect(l.Spec.AcquireTime.Time).To(Equal(t0))
		g.Expect(l.Spec.RenewTime.Time).To(Equal(t0))
		g.Expect(*l.Spec.LeaseDurationSeconds).To(Equal(int32(20)))
		g.Expect(*l.Spec.LeaseTransitions).To(Equal(int32(4)))
		g.Expect(l.ResourceVersion).To(Equal("7"), "the update is guarded by the resourceVersion read")
		g.Expect(l.UID).To(Equal(types.UID("lease-1")), "the update is guarded by the Lease's UID: an update of a Lease deleted meanwhile must not create one")
		g.Expect(*cur.Spec.HolderIdentity).To(Equal("w1"), "the cached object is not modified")
	})
	t.Run("the first grant creates a fully managed Lease", func(t *testing.T) {
		g := NewWithT(t)
		l := leaseAfter(lock, nil, fkv1.ReadLedger(nil, lock.Name), action{kind: actGrant, holder: w2, epoch: 1, leaseDuration: 20}, now)
		led := fkv1.ReadLedger(l, lock.Name)
		g.Expect(led.Exists && led.Adopted).To(BeTrue())
		g.Expect(led.Epoch).To(Equal(int64(1)))
		g.Expect(led.PreviousUID).To(BeEmpty())
		g.Expect(l.Namespace + "/" + l.Name).To(Equal(lock.String()))
	})
	t.Run("freeing clears the holder and keeps the epoch", func(t *testing.T) {
		g := NewWithT(t)
		cur := heldLease()
		l := leaseAfter(lock, cur, fkv1.ReadLedger(cur, lock.Name), action{kind: actFree, epoch: 41, end: holderReleased}, now)
		led := fkv1.ReadLedger(l, lock.Name)
		g.Expect(led.Held()).To(BeFalse())
		g.Expect(led.Epoch).To(Equal(int64(41)))
		g.Expect(led.PreviousUID).To(Equal(types.UID("uid-w1")))
		g.Expect(l.Spec.HolderIdentity).To(BeNil())
		g.Expect(l.Spec.RenewTime.Time).To(Equal(earlier.Time), "freeing is not a renewal")
	})
	t.Run("a repair raises the counter, restores labels and finalizer, keeps the holder", func(t *testing.T) {
		g := NewWithT(t)
		cur := heldLease()
		cur.Annotations[fkv1.AnnotationEpoch] = "3"
		cur.Labels = nil
		cur.Finalizers = nil
		w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
		l := leaseAfter(lock, cur, fkv1.ReadLedger(cur, lock.Name), action{kind: actRepair, holder: w1, epoch: 41, leaseDuration: 30, repaired: true}, now)
		led := fkv1.ReadLedger(l, lock.Name)
		g.Expect(led.Epoch).To(Equal(int64(41)))
		g.Expect(led.Adopted).To(BeTrue())
		g.Expect(led.HolderUID).To(Equal(types.UID("uid-w1")))
		g.Expect(l.Spec.RenewTime.Time).To(Equal(earlier.Time))
	})
	t.Run("a Lease being deleted gets no finalizer back", func(t *testing.T) {
		g := NewWithT(t)
		cur := heldLease()
		cur.DeletionTimestamp = &metav1.Time{Time: t0}
		cur.Finalizers = nil
		l := leaseAfter(lock, cur, fkv1.ReadLedger(cur, lock.Name), action{kind: actGrant, holder: w2, epoch: 42, leaseDuration: 20}, now)
		g.Expect(l.Finalizers).To(BeEmpty())
	})
}

func TestEndedFirstWritesTheHolderLast(t *testing.T) {
	g := NewWithT(t)
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41) // ended, still shows Held
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	w3 := claim("w3", 6, fkv1.PhasePending, 0)
	for _, order := range [][]*fkv1.FencedLease{{w2, w1, w3}, {w1, w2, w3}, {w3, w2, w1}} {
		out := endedFirst(order, held(42, "w2"))
		g.Expect(out).To(HaveLen(3))
		g.Expect(out[2].Name).To(Equal("w2"), "the new holder is written last")
	}
	g.Expect(endedFirst([]*fkv1.FencedLease{w1, w2}, free(42))).To(HaveLen(2))
}

// An idle lock leaves nothing behind in the authority's memory (issue: the
// per-lock maps grew with every lock ever used), except the epoch floor
// while its Lease still exists.
func TestIdleLockIsForgotten(t *testing.T) {
	g := NewWithT(t)
	x := types.NamespacedName{Namespace: "ns", Name: "x"}
	y := types.NamespacedName{Namespace: "ns", Name: "y"}
	fill := func(r *Reconciler) {
		for _, l := range []types.NamespacedName{x, y} {
			remember(r, l, func(m *lockMemory) {
				m.observe(renewal{holderUID: "holder"}, t0)
				m.raiseFloor(41)
				m.wroteClaim(types.UID("claim-of-"+l.Name), "10")
				m.wroteLease(leaseVersion{uid: types.UID("lease-of-" + l.Name), rv: "10"})
			})
			r.memory.publishView(l, View{HeldEpoch: 41})
		}
	}
	for _, hasLease := range []bool{true, false} {
		r := NewReconciler(nil, nil, nil, Options{})
		fill(r)
		var snap snapshot
		snap.hasLease = hasLease
		_, err := actOn(r, x, gathered{snapshot: snap}, action{kind: actIdle})
		g.Expect(err).NotTo(HaveOccurred())
		mx, kept := remembered(r, x)
		g.Expect(mx.renewalSeen).To(BeFalse())
		g.Expect(mx.view).To(BeZero())
		g.Expect(mx.claimWrites).To(BeEmpty())
		g.Expect(mx.leaseExpect).To(BeZero())
		if hasLease {
			g.Expect(mx.floor).To(Equal(int64(41)), "the floor must outlive idleness while the Lease exists")
		} else {
			g.Expect(kept).To(BeFalse(), "an idle lock without a Lease is still remembered")
		}
		// The other lock is untouched.
		my, _ := remembered(r, y)
		g.Expect(my.renewalSeen).To(BeTrue())
		g.Expect(my.floor).To(Equal(int64(41)))
		g.Expect(my.claimWrites).To(HaveLen(1))
		g.Expect(my.leaseExpect).NotTo(BeZero())
		g.Expect(my.view.HeldEpoch).To(Equal(int64(41)))
	}
}

// A claim deleted right after our write is never seen again; the next
// reconcile of its lock drops its entry.
func TestExpectationsOfDeletedClaimsAreDropped(t *testing.T) {
	g := NewWithT(t)
	r := NewReconciler(nil, nil, nil, Options{})
	lock := types.NamespacedName{Namespace: "ns", Name: "x"}
	var mem lockMemory
	for i := 0; i < 100; i++ {
		mem.wroteClaim(types.UID(fmt.Sprintf("gone-%d", i)), "10")
	}
	kept := claim("kept", 1, fkv1.PhasePending, 0)
	kept.ResourceVersion = "5"
	mem.wroteClaim(kept.UID, "10")
	behind, err := r.cacheBehindOwnWrites(context.Background(), lock, &mem, nil, []*fkv1.FencedLease{kept})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(behind).To(BeTrue(), "the kept claim's cache copy is older than our write")
	g.Expect(mem.claimWrites).To(HaveLen(1))
}

// The Lease version a term read live (or this process wrote) must be shown
// by the cache before the lock is decided on: a cache that shows no Lease,
// or another one, is not taken for one that caught up, and of two
// expectations the later version stands.
func TestLeaseExpectation(t *testing.T) {
	g := NewWithT(t)
	var e lockMemory
	e.wroteLease(leaseVersion{uid: "lease-1", rv: "20"})
	e.wroteLease(leaseVersion{uid: "lease-1", rv: "15"}) // a live read older than a grant that committed after it
	g.Expect(e.leaseExpect.rv).To(Equal("20"), "an older version replaced a later expectation")

	behind, missing := e.leaseBehind(leaseVersion{})
	g.Expect(behind && missing).To(BeTrue(), "a cache without the Lease passed for one that caught up")
	behind, missing = e.leaseBehind(leaseVersion{uid: "lease-0", rv: "30"})
	g.Expect(behind && missing).To(BeTrue(), "another Lease (an older incarnation) passed for the expected one")
	e.retainClaims(map[types.UID]bool{})
	g.Expect(e.leaseExpect).NotTo(BeZero(), "pruning the claims dropped the Lease's expectation")
	behind, missing = e.leaseBehind(leaseVersion{uid: "lease-1", rv: "19"})
	g.Expect(behind).To(BeTrue())
	g.Expect(missing).To(BeFalse())
	behind, _ = e.leaseBehind(leaseVersion{uid: "lease-1", rv: "20"})
	g.Expect(behind).To(BeFalse())
	g.Expect(e.leaseExpect).To(BeZero(), "the expectation outlived the cache reaching it")
}

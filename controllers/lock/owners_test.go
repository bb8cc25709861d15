package lock

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Owner references another writer left on a managed Lease (the manager sets
// none) are removed in one write that changes nothing else: not the holder,
// its epoch, the claim annotations, renewTime, acquireTime or the TTL. It is
// no renewal (the holder's TTL clock runs on), nor a new hold.
func TestForeignOwnersAreRemovedAndNothingElse(t *testing.T) {
	lock := types.NamespacedName{Namespace: "reports", Name: "report-2026-07"}
	acquired := metav1.NewMicroTime(t0.Add(-time.Minute))
	renewed := metav1.NewMicroTime(t0.Add(-10 * time.Second))
	owners := []metav1.OwnerReference{
		{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "uid-gone"},
		{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "uid-web", BlockOwnerDeletion: ptr.To(true), Controller: ptr.To(true)},
	}
	lease := func(led fkv1.Ledger) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name, UID: "lease-uid", ResourceVersion: "7",
			Finalizers: []string{fkv1.LeaseFinalizer}, OwnerReferences: owners},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(int32(30)), AcquireTime: &acquired, RenewTime: &renewed, LeaseTransitions: ptr.To(int32(3))}}
		if led.Held() {
			l.Spec.HolderIdentity = ptr.To(led.HolderClaim)
		}
		led.ApplyTo(l, lock.Name)
		return l
	}
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	for _, tc := range []struct {
		name   string
		ledger fkv1.Ledger
		claims []*fkv1.FencedLease
		holder *fkv1.FencedLease
	}{
		{name: "held", ledger: func() fkv1.Ledger { l := held(41, "w1"); l.HolderUser = "alice"; return l }(), claims: []*fkv1.FencedLease{w1}, holder: w1},
		{name: "idle", ledger: free(41)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cur := lease(tc.ledger)
			led := fkv1.ReadLedger(cur, lock.Name)
			s := snapshot{ledger: led, hasLease: true, foreignOwners: len(cur.OwnerReferences) > 0, claims: tc.claims,
				renewSeenAt: t0.Add(-10 * time.Second), now: t0, floor: led.Epoch}
			a := decide(s)
			g.Expect(a.kind).To(Equal(actRepair))
			g.Expect(a.holder).To(Equal(tc.holder))
			g.Expect(a.epoch).To(Equal(int64(41)))
			g.Expect(a.end).To(Equal(holderContinues))
			g.Expect(a.repaired).To(BeFalse(), "the counter is not touched")
			if tc.holder != nil {
				g.Expect(a.requeueAfter).To(Equal(20*time.Second), "the TTL runs from the last renewal seen, not from this write")
			}

			after := leaseAfter(lock, cur, led, a, metav1.NewMicroTime(t0))
			g.Expect(after.OwnerReferences).To(BeEmpty())
			want := cur.DeepCopy()
			want.OwnerReferences = nil
			g.Expect(after).To(Equal(want), "only the owners change")
			g.Expect(after.UID).To(Equal(types.UID("lease-uid")), "the update is guarded by uid")
			g.Expect(after.ResourceVersion).To(Equal("7"), "and by the resourceVersion read")
			g.Expect(cur.OwnerReferences).To(HaveLen(2), "the cached object is not modified")
		})
	}
}

// Whatever else a write does, it leaves no owner on the Lease.
func TestEveryLeaseWriteClearsOwners(t *testing.T) {
	g := NewWithT(t)
	lock := types.NamespacedName{Namespace: "reports", Name: "report-2026-07"}
	cur := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name, ResourceVersion: "7",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "uid-gone"}}}}
	free(41).ApplyTo(cur, lock.Name)
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	l := leaseAfter(lock, cur, fkv1.ReadLedger(cur, lock.Name), action{kind: actGrant, holder: w2, epoch: 42, leaseDuration: 30}, metav1.NewMicroTime(t0))
	g.Expect(l.OwnerReferences).To(BeEmpty())
}

func TestOwnersNoteStaysWithinTheEventLimit(t *testing.T) {
	g := NewWithT(t)
	g.Expect(listWithin([]string{"a", "b"}, 800)).To(Equal("a, b"))
	many := make([]string, 100)
	for i := range many {
		many[i] = ownerString(metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: strings.Repeat("n", 60), UID: "0123456789"})
	}
	note := listWithin(many, maxOwnersNote)
	g.Expect(len(note)).To(BeNumerically("<=", maxOwnersNote+20))
	g.Expect(note).To(MatchRegexp(` and \d+ more$`))
}

package authority_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A holder the Lease names but the claim cache does not show is either
// gone (its release by delete) or one the cache has not shown yet (another
// authority granted it). Only a claim this cache showed and no longer
// shows is known to be gone, since an informer drops an object only when
// the apiserver says it was deleted; any other is read live before the
// lock is freed or granted again.
var _ = Describe("A holder missing from the claim cache", func() {
	var (
		ns string
		h  *history
	)
	BeforeEach(func() {
		ns = newNamespace()
		h = recordHistory(ns)
	})

	It("is released without a live read when the cache showed it and then saw it deleted", func() {
		m := startManager(time.Second)
		DeferCleanup(func() { m.Stop() })
		m.writes.namespace.Store(ns)
		holder := createClaim(ns, "holder", "seen", "H", 60)
		eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld)
		w := createClaim(ns, "w", "seen", "W", 60)
		eventuallyPhase(ns, w.Name, fkv1.PhasePending)
		time.Sleep(500 * time.Millisecond) // the cache shows both
		reads := m.writes.claimReads.Load()

		deleteClaim(holder)
		eventuallyPhase(ns, w.Name, fkv1.PhaseHeld)
		Expect(m.writes.claimReads.Load()-reads).To(BeZero(), "the authority read a claim live to confirm a holder its cache saw deleted")
		h.verifyClaims()
		h.verifyLeases()
	})

	It("is read live when the cache never showed it, so a stale claim cache does not free a lock another authority granted", func() {
		a := startManager(time.Second)
		DeferCleanup(func() { a.Stop() })
		h0 := createClaim(ns, "h0", "unseen", "H0", 60)
		eventuallyPhase(ns, h0.Name, fkv1.PhaseHeld)
		w := createClaim(ns, "w", "unseen", "W", 60)
		eventuallyPhase(ns, w.Name, fkv1.PhasePending)

		By("B's claim cache stops at H0 holding and W waiting; its Lease cache stays live")
		startFrozenClaimsManager(ns)

		By("W leaves, Y arrives, H0 releases: A grants Y, which B's cache never shows")
		deleteClaim(w)
		y := createClaim(ns, "y", "unseen", "Y", 60)
		deleteClaim(h0)
		eventuallyPhase(ns, y.Name, fkv1.PhaseHeld)

		By("B sees the Lease name Y, a claim its cache does not show: it must read Y and leave the lock to it")
		Consistently(func() []string { return h.NamedWith(w.UID) }, 3*time.Second).Should(BeEmpty(), "a Lease named W, whom B's stale cache shows waiting")
		Expect(fkv1.ReadLedger(getLease(ns, "unseen"), "unseen").HolderUID).To(Equal(y.UID), "Y's hold was ended")
		Expect(getClaim(ns, y.Name).Status.Phase).To(Equal(fkv1.PhaseHeld))
		h.verifyClaims()
		h.verifyLeases()
	})
})

package authority_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Bounded waits (docs/design.md §5): a claim still Pending its
// acquireTimeoutSeconds after the authority first observed it ends Expired
// with reason AcquireTimeout and no epoch; a grant and a timeout never both
// happen, which the Lease history (no version ever names a timed-out claim)
// and the claims' history (no timed-out claim ever Held) show.
var _ = Describe("Acquire timeouts", func() {
	var (
		ns string
		h  *history
	)
	BeforeEach(func() {
		ns = newNamespace()
		h = recordHistory(ns)
	})

	createBounded := func(name, lock string, seconds int32) *fkv1.FencedLease {
		c := newClaim(ns, name, lock, name, 30)
		c.Spec.AcquireTimeoutSeconds = ptr.To(seconds)
		ExpectWithOffset(1, k8s.Create(ctx, c)).To(Succeed())
		return c
	}
	It("ends a waiter not granted in time without an epoch, ends a try-once claim at once, and grants the next waiter at the release", func() {
		m := startManager(time.Second)
		DeferCleanup(func() { m.Stop() })
		holder := createClaim(ns, "holder", "bounded", "H", 60)
		eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld)

		created := time.Now()
		w2 := createBounded("w2", "bounded", 2)
		w3 := createClaim(ns, "w3", "bounded", "W3", 30)
		ended := eventuallyPhase(ns, w2.Name, fkv1.PhaseExpired)
		Expect(time.Since(created)).To(BeNumerically(">=", 2*time.Second), "ended before its acquireTimeoutSeconds")
		Expect(reasonOf(ended)).To(Equal(fkv1.ReasonAcquireTimeout))
		Expect(ended.Status.Epoch).To(BeZero())
		Expect(fkv1.ReadLedger(getLease(ns, "bounded"), "bounded").TimedOutClaim(w2.UID)).To(BeTrue(), "the timeout is recorded in the Lease")

		once := createBounded("once", "bounded", 0)
		Expect(reasonOf(eventuallyPhase(ns, once.Name, fkv1.PhaseExpired))).To(Equal(fkv1.ReasonAcquireTimeout))
		Expect(getClaim(ns, w3.Name).Status.Phase).To(Equal(fkv1.PhasePending), "the unbounded waiter keeps its place")

		deleteClaim(holder)
		Expect(eventuallyPhase(ns, w3.Name, fkv1.PhaseHeld).Status.Epoch).To(BeNumerically(">", 0))
		h.verifyClaims()
		h.verifyLeases()
		for _, c := range []*fkv1.FencedLease{w2, once} {
			Expect(h.NamedWith(c.UID)).To(BeEmpty(), "a Lease named timed-out claim %s", c.Name)
			Expect(h.EverHeld(c.UID)).To(BeFalse(), "timed-out claim %s was Held", c.Name)
		}
	})

	It("never both grants and times out a claim whose deadline races the release, with two managers at once", func() {
		m1 := startManager(time.Second)
		m2 := startManager(time.Second)
		DeferCleanup(func() { m1.Stop(); m2.Stop() })
		// The release comes well before, near, and well after the waiter's
		// 1 s deadline: both outcomes must occur, and each alone.
		offsets := []time.Duration{200 * time.Millisecond, 800 * time.Millisecond, 950 * time.Millisecond, time.Second,
			1050 * time.Millisecond, 1200 * time.Millisecond, 2500 * time.Millisecond}
		granted, timedOut := 0, 0
		for i, offset := range offsets {
			lock := fmt.Sprintf("race-%d", i)
			holder := createClaim(ns, "holder-"+lock, lock, "H", 60)
			eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld)
			w := createBounded("w-"+lock, lock, 1)
			Eventually(func() fkv1.FencedLeasePhase { return getClaim(ns, w.Name).Status.Phase }, 10*time.Second, 10*time.Millisecond).
				ShouldNot(BeEmpty())
			time.Sleep(offset)
			deleteClaim(holder)
			var end *fkv1.FencedLease
			Eventually(func() fkv1.FencedLeasePhase {
				end = getClaim(ns, w.Name)
				return end.Status.Phase
			}, 30*time.Second, 10*time.Millisecond).Should(Or(Equal(fkv1.PhaseHeld), Equal(fkv1.PhaseExpired)))
			if end.Status.Phase == fkv1.PhaseHeld {
				granted++
				Expect(end.Status.Epoch).To(BeNumerically(">", 0))
				Expect(fkv1.ReadLedger(getLease(ns, lock), lock).TimedOutClaim(w.UID)).To(BeFalse(), "granted and listed as timed out")
				Consistently(func() string { return reasonOf(getClaim(ns, w.Name)) }, time.Second).Should(Equal(fkv1.ReasonGranted))
			} else {
				timedOut++
				Expect(reasonOf(end)).To(Equal(fkv1.ReasonAcquireTimeout))
				Expect(end.Status.Epoch).To(BeZero())
			}
		}
		// Each claim's whole history: a timed-out one never named by a
		// Lease nor Held; a granted one never shown AcquireTimeout.
		for i := range offsets {
			w := getClaim(ns, fmt.Sprintf("w-race-%d", i))
			if reasonOf(w) == fkv1.ReasonAcquireTimeout {
				Expect(h.NamedWith(w.UID)).To(BeEmpty(), "a Lease named timed-out claim %s", w.Name)
				Expect(h.EverHeld(w.UID)).To(BeFalse(), "timed-out claim %s was Held", w.Name)
			}
		}
		h.verifyClaims()
		h.verifyLeases()
		Expect(granted).To(BeNumerically(">", 0), "no release came before a deadline")
		Expect(timedOut).To(BeNumerically(">", 0), "no deadline came before a release")
	})

	It("never grants a timed-out claim that a stale claim cache still shows waiting, after another authority saw it end", func() {
		a := startManager(time.Second)
		DeferCleanup(func() { a.Stop() })
		holder := createClaim(ns, "holder", "stale", "H", 60)
		eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld)
		x := createBounded("x", "stale", 4)
		Eventually(func() string { return reasonOf(getClaim(ns, x.Name)) }, 10*time.Second).Should(Equal(fkv1.ReasonNext))

		By("B's claim cache stops at X waiting; its Lease cache stays live")
		startFrozenClaimsManager(ns) // B's cache shows X waiting

		By("A times X out and sees it end; the holder releases and A's write stops listing X")
		Expect(reasonOf(eventuallyPhase(ns, x.Name, fkv1.PhaseExpired))).To(Equal(fkv1.ReasonAcquireTimeout))
		time.Sleep(time.Second) // A's cache shows X Expired
		deleteClaim(holder)
		Eventually(func() bool {
			led := fkv1.ReadLedger(getLease(ns, "stale"), "stale")
			return !led.Held() && !led.TimedOutClaim(x.UID)
		}, 10*time.Second).Should(BeTrue(), "A freed the lock and stopped listing X")

		By("B, whose cache shows X waiting on a free lock, must not grant it")
		Consistently(func() []string { return h.NamedWith(x.UID) }, 3*time.Second).Should(BeEmpty(), "a Lease named timed-out claim X")
		Expect(h.EverHeld(x.UID)).To(BeFalse())
		h.verifyLeases()
	})
})

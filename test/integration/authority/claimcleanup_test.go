package authority_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var _ = Describe("The clean-up of expired claims", func() {
	It("deletes an Expired claim once the retention has passed since it ended, and never a Held or Pending one", func() {
		const retention = 3 * time.Second
		ns := newNamespace()
		m := startManagerWith(envtestutil.ManagerOptions{ExpiredClaimRetention: retention})
		DeferCleanup(m.Stop)

		By("W1 is granted and never renews; W2 and W3 wait")
		createClaim(ns, "w1", "report", "W1", 1)
		Eventually(func() fkv1.FencedLeasePhase { return getClaim(ns, "w1").Status.Phase }, 10*time.Second, 50*time.Millisecond).Should(Equal(fkv1.PhaseHeld))
		createClaim(ns, "w2", "report", "W2", 300)
		createClaim(ns, "w3", "report", "W3", 300)

		By("W1 expires; W2 is granted and W3 keeps waiting")
		var expired *fkv1.FencedLease
		Eventually(func() fkv1.FencedLeasePhase {
			expired = getClaim(ns, "w1")
			return expired.Status.Phase
		}, 10*time.Second, 20*time.Millisecond).Should(Equal(fkv1.PhaseExpired))
		held := meta.FindStatusCondition(expired.Status.Conditions, fkv1.ConditionHeld)
		Expect(held).NotTo(BeNil())
		Expect(held.Reason).To(Equal(fkv1.ReasonExpired))

		By("W1's claim is deleted, not before the retention has passed since it ended")
		Eventually(func() bool {
			err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "w1"}, &fkv1.FencedLease{})
			return apierrors.IsNotFound(err)
		}, 15*time.Second, 20*time.Millisecond).Should(BeTrue())
		// The condition's time is truncated to the second, so the end was at
		// or after it; a deletion seen earlier than this ignored the retention.
		Expect(time.Now()).To(BeTemporally(">=", held.LastTransitionTime.Add(retention)))

		By("a few retentions later, the Held and the Pending claim are still there")
		Consistently(func() []fkv1.FencedLeasePhase {
			return []fkv1.FencedLeasePhase{getClaim(ns, "w2").Status.Phase, getClaim(ns, "w3").Status.Phase}
		}, 2*retention, 200*time.Millisecond).Should(Equal([]fkv1.FencedLeasePhase{fkv1.PhaseHeld, fkv1.PhasePending}))
	})
})

var _ = Describe("The queue limit", func() {
	It("turns away a new claim when the lock already has its maximum of waiters, for good, and takes new ones once there is room", func() {
		ns := newNamespace()
		m := startManagerWith(envtestutil.ManagerOptions{MaxWaitersPerLock: 2})
		DeferCleanup(m.Stop)
		phase := func(name string) func() fkv1.FencedLeasePhase {
			return func() fkv1.FencedLeasePhase { return getClaim(ns, name).Status.Phase }
		}

		createClaim(ns, "w0", "report", "W0", 300)
		Eventually(phase("w0"), 10*time.Second).Should(Equal(fkv1.PhaseHeld))
		createClaim(ns, "w1", "report", "W1", 300)
		createClaim(ns, "w2", "report", "W2", 300)
		Eventually(phase("w2"), 10*time.Second).Should(Equal(fkv1.PhasePending))
		Eventually(phase("w1"), 10*time.Second).Should(Equal(fkv1.PhasePending))

		By("a third waiter is turned away with a reason that says what to do")
		createClaim(ns, "w3", "report", "W3", 300)
		Eventually(phase("w3"), 10*time.Second).Should(Equal(fkv1.PhaseExpired))
		held := meta.FindStatusCondition(getClaim(ns, "w3").Status.Conditions, fkv1.ConditionHeld)
		Expect(held).NotTo(BeNil())
		Expect(held.Reason).To(Equal(fkv1.ReasonQueueFull))
		Expect(held.Message).To(ContainSubstring("already has 2 waiting claims"))

		By("a turned-away claim is never granted, even once there is room")
		Expect(k8s.Delete(context.Background(), getClaim(ns, "w0"))).To(Succeed())
		Eventually(phase("w1"), 10*time.Second).Should(Equal(fkv1.PhaseHeld))
		Expect(k8s.Delete(context.Background(), getClaim(ns, "w1"))).To(Succeed())
		Eventually(phase("w2"), 10*time.Second).Should(Equal(fkv1.PhaseHeld))
		Consistently(phase("w3"), 2*time.Second).Should(Equal(fkv1.PhaseExpired))
		Expect(getClaim(ns, "w3").Status.Epoch).To(BeZero())

		By("with room again, a new claim queues")
		createClaim(ns, "w4", "report", "W4", 300)
		Eventually(phase("w4"), 10*time.Second).Should(Equal(fkv1.PhasePending))
	})
})

package authority_test

import (
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Nobody but the manager adds, removes or changes the owner references of a
// managed Lease, and the manager sets none: those another writer left (before
// the managed-Lease guard covered them, or with it off) are removed, from a
// held Lease as from an idle one, in one write that changes nothing else.
var _ = Describe("Owner references on managed Leases", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		m := startManager(time.Second)
		DeferCleanup(m.Stop)
	})

	// An owner that does not exist (the garbage collector would retry a
	// delete the guard refuses, forever) and one that blocks its owner's
	// foreground deletion.
	owners := []metav1.OwnerReference{
		{APIVersion: "v1", Kind: "ConfigMap", Name: "no-such-owner", UID: types.UID("00000000-0000-0000-0000-00000000dead")},
		{APIVersion: "apps/v1", Kind: "Deployment", Name: "blocking-owner", UID: types.UID("00000000-0000-0000-0000-00000000b10c"),
			BlockOwnerDeletion: ptr.To(true), Controller: ptr.To(true)},
	}

	// plant adds the owners to the lock's Lease. This suite's apiserver runs
	// without the managed-Lease guard, and the manager runs with the same
	// identity as k8s: the write is the manager's, which the guard would let
	// through too (anyone else's it refuses).
	plant := func(lock string) *coordinationv1.Lease {
		l := getLease(ns, lock)
		Expect(l.OwnerReferences).To(BeEmpty(), "the manager sets no owners")
		l.OwnerReferences = owners
		Expect(k8s.Update(ctx, l)).To(Succeed())
		return l
	}

	// removed waits until the Lease has no owners and returns it.
	removed := func(lock string) *coordinationv1.Lease {
		var l *coordinationv1.Lease
		EventuallyWithOffset(1, func() []metav1.OwnerReference {
			l = getLease(ns, lock)
			return l.OwnerReferences
		}, 10*time.Second, 20*time.Millisecond).Should(BeEmpty(), "the owners of Lease %s are removed", lock)
		return l
	}

	// sameLedger expects after to be planted but for its owners (and
	// metadata the apiserver keeps).
	sameLedger := func(planted, after *coordinationv1.Lease) {
		ExpectWithOffset(1, after.ResourceVersion).NotTo(Equal(planted.ResourceVersion), "one write removed them")
		ExpectWithOffset(1, after.UID).To(Equal(planted.UID))
		ExpectWithOffset(1, after.Annotations).To(Equal(planted.Annotations), "epoch, claim, claim-uid, holder identity")
		ExpectWithOffset(1, after.Labels).To(Equal(planted.Labels))
		ExpectWithOffset(1, after.Finalizers).To(Equal(planted.Finalizers))
		ExpectWithOffset(1, after.Spec).To(Equal(planted.Spec), "holder, renewTime, acquireTime, TTL, transitions")
	}

	expectEvent := func(lock string) {
		EventuallyWithOffset(1, func() []string {
			var evs eventsv1.EventList
			Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var out []string
			for _, ev := range evs.Items {
				if ev.Regarding.Kind == "Lease" && ev.Regarding.Name == lock && ev.Reason == "OwnerReferencesRemoved" && ev.Type == corev1.EventTypeWarning &&
					strings.Contains(ev.Note, "ConfigMap/no-such-owner") && strings.Contains(ev.Note, "Deployment/blocking-owner") {
					out = append(out, ev.Note)
				}
			}
			return out
		}, 10*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty(), "a Warning Event on Lease %s names the removed owners", lock)
	}

	It("removes them from a held Lease, and the hold goes on: same epoch, same claim, no renewal", func() {
		c1 := createClaim(ns, "c1", "held", "W1", 30)
		e := eventuallyPhase(ns, c1.Name, fkv1.PhaseHeld).Status.Epoch
		Expect(getLease(ns, "held").Annotations).To(HaveKeyWithValue(fkv1.AnnotationClaimUID, string(c1.UID)))

		planted := plant("held")
		after := removed("held")
		sameLedger(planted, after)
		Expect(after.Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(e)))
		Expect(after.Annotations).To(HaveKeyWithValue(fkv1.AnnotationClaimUID, string(c1.UID)))
		Expect(after.Spec.RenewTime).To(Equal(planted.Spec.RenewTime))
		expectEvent("held")

		By("the hold still runs: the claim stays Held at its epoch, and its holder renews")
		Expect(renew(ns, "held", string(c1.UID))).To(Succeed())
		Consistently(func() fkv1.FencedLeaseStatus { return getClaim(ns, c1.Name).Status }, 2*time.Second, 100*time.Millisecond).
			Should(And(HaveField("Phase", fkv1.PhaseHeld), HaveField("Epoch", e)))
		Expect(getLease(ns, "held").Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(e)))
		Expect(getLease(ns, "held").OwnerReferences).To(BeEmpty())
	})

	It("removes them from an idle Lease (no claims, nobody holds)", func() {
		c1 := createClaim(ns, "c1", "idle", "W1", 30)
		e := eventuallyPhase(ns, c1.Name, fkv1.PhaseHeld).Status.Epoch
		deleteClaim(c1)
		Eventually(func() map[string]string { return getLease(ns, "idle").Annotations }, 10*time.Second).
			ShouldNot(HaveKey(fkv1.AnnotationClaimUID), "the lock is freed")

		planted := plant("idle")
		after := removed("idle")
		sameLedger(planted, after)
		Expect(after.Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(e)), "the epoch is kept")
		Expect(after.Spec.HolderIdentity).To(BeNil())
		expectEvent("idle")

		By("the next claim gets the next epoch")
		c2 := createClaim(ns, "c2", "idle", "W2", 30)
		Expect(eventuallyPhase(ns, c2.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(e + 1))
	})

	// The write that removes them is a ledger write like any other: an idle
	// Lease whose counter is unreadable is a new ledger, written from the
	// resourceVersion of the version it replaces (a storage revision above
	// every epoch it issued), never left with owners for want of it.
	It("removes them from an idle Lease whose counter is unreadable, restarting the counter at the storage revision", func() {
		c1 := createClaim(ns, "c1", "lost-counter", "W1", 30)
		e := eventuallyPhase(ns, c1.Name, fkv1.PhaseHeld).Status.Epoch
		deleteClaim(c1)
		Eventually(func() map[string]string { return getLease(ns, "lost-counter").Annotations }, 10*time.Second).
			ShouldNot(HaveKey(fkv1.AnnotationClaimUID), "the lock is freed")

		l := getLease(ns, "lost-counter")
		l.Annotations[fkv1.AnnotationEpoch] = "garbage"
		l.OwnerReferences = owners
		Expect(k8s.Update(ctx, l)).To(Succeed())
		rev, err := strconv.ParseInt(l.ResourceVersion, 10, 64)
		Expect(err).NotTo(HaveOccurred())
		after := removed("lost-counter")
		epoch, err := fkv1.ParseEpoch(after.Annotations[fkv1.AnnotationEpoch])
		Expect(err).NotTo(HaveOccurred())
		Expect(epoch).To(BeNumerically(">=", rev))
		Expect(epoch).To(BeNumerically(">", e))
		expectEvent("lost-counter")
	})
})

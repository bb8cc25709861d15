package lease_test

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// Semaphore locks (docs/design.md §9): a lock whose claims ask for
// maxHolders N admits N holders at once, each with a permit of its own
// epoch recorded on the lock's Lease, each renewing a Lease of its own.
var _ = Describe("Semaphore locks", func() {
	const lock = "warehouse"
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	// ledgerOf is the lock's Lease as the authority keeps it.
	ledgerOf := func() fkv1.Ledger {
		var l coordinationv1.Lease
		ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &l)).To(Succeed())
		return fkv1.ReadLedger(&l, lock)
	}
	// permitLease is a permit's renewal Lease (nil: there is none).
	permitLease := func(epoch int64) *coordinationv1.Lease {
		var l coordinationv1.Lease
		err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: fkv1.PermitLeaseName(lock, epoch)}, &l)
		if apierrors.IsNotFound(err) {
			return nil
		}
		ExpectWithOffset(1, err).NotTo(HaveOccurred())
		return &l
	}
	renewTimeOf := func(epoch int64) func() time.Time {
		return func() time.Time {
			if l := permitLease(epoch); l != nil && l.Spec.RenewTime != nil {
				return l.Spec.RenewTime.Time
			}
			return time.Time{}
		}
	}
	// semWaiter is a claim for a permit of the lock made with kubectl.
	semWaiter := func(name string, maxHolders int32) *fkv1.FencedLease {
		c := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(int32(300)), MaxHolders: ptr.To(maxHolders)}}
		ExpectWithOffset(1, admin.Create(ctx, c)).To(Succeed())
		return c
	}
	heldReason := func(c *fkv1.FencedLease) func() string {
		return func() string {
			var got fkv1.FencedLease
			if err := admin.Get(ctx, client.ObjectKeyFromObject(c), &got); err != nil {
				return ""
			}
			if h := meta.FindStatusCondition(got.Status.Conditions, fkv1.ConditionHeld); h != nil {
				return h.Reason
			}
			return ""
		}
	}
	// expectHoldsPermit checks l's permit where the authority records it: an
	// entry of the lock's Lease, a renewal Lease of its own, the claim Held
	// with its epoch.
	expectHoldsPermit := func(l *lease.Lease) {
		GinkgoHelper()
		Expect(l.State()).To(Equal(lease.Held))
		Expect(l.MaxHolders).To(Equal(int32(3)))
		Expect(l.RenewalLease()).To(Equal(fkv1.PermitLeaseName(lock, l.Epoch)))
		p, ok := ledgerOf().PermitFor(l.UID)
		Expect(ok).To(BeTrue(), "the lock's Lease shows no permit for claim %s", l.ClaimName)
		Expect(p.Epoch).To(Equal(l.Epoch))
		Expect(p.Claim).To(Equal(l.ClaimName))
		Expect(p.Holder).To(Equal(l.Holder))
		Eventually(func() *coordinationv1.Lease { return permitLease(l.Epoch) }, 5*time.Second).ShouldNot(BeNil())
		pl := permitLease(l.Epoch)
		Expect(pl.Spec.HolderIdentity).To(Equal(ptr.To(l.Holder)))
		Expect(pl.Labels).To(HaveKeyWithValue(fkv1.LabelLock, lock))
		Expect(pl.Labels).To(HaveKeyWithValue(fkv1.LabelPermitEpoch, fkv1.FormatEpoch(l.Epoch)))
		var claim fkv1.FencedLease
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: l.ClaimName}, &claim)).To(Succeed())
		Eventually(func() fkv1.FencedLeasePhase {
			_ = admin.Get(ctx, client.ObjectKeyFromObject(&claim), &claim)
			return claim.Status.Phase
		}, 5*time.Second).Should(Equal(fkv1.PhaseHeld))
		Expect(claim.Status.Epoch).To(Equal(l.Epoch))
	}

	It("grants three holders of a 3-permit lock at once with three epochs, and a fourth when one of them releases", func() {
		opts := lease.Options{TTL: 6 * time.Second, MaxHolders: 3}
		var held []*lease.Lease
		epochs := map[int64]string{}
		for i := 1; i <= 3; i++ {
			hc, _, _ := holderClient(ns)
			l, err := hc.Acquire(ctx, lock, fmt.Sprintf("W%d", i), opts)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _ = l.Release(ctx) })
			Expect(epochs).NotTo(HaveKey(l.Epoch), "epoch %d given twice", l.Epoch)
			epochs[l.Epoch] = l.Holder
			held = append(held, l)
		}
		By("all three hold at once, each a permit of its own epoch")
		led := ledgerOf()
		Expect(led.IsSemaphore()).To(BeTrue())
		Expect(led.Capacity).To(Equal(int32(3)))
		Expect(led.PermitsInvalid).To(BeFalse())
		Expect(led.Permits).To(HaveLen(3))
		Expect(led.HolderUID).To(BeEmpty(), "a semaphore's Lease names no single holder")
		for i, l := range held {
			expectHoldsPermit(l)
			if i > 0 {
				Expect(l.Epoch).To(BeNumerically(">", held[i-1].Epoch), "epochs in grant order")
			}
		}

		By("each renews its permit's Lease, not the lock's")
		since := map[int64]time.Time{}
		for _, l := range held {
			since[l.Epoch] = renewTimeOf(l.Epoch)()
		}
		for _, l := range held {
			Eventually(renewTimeOf(l.Epoch), 10*time.Second, 100*time.Millisecond).Should(BeTemporally(">", since[l.Epoch]),
				"the Lease of permit %d was not renewed", l.Epoch)
		}
		Consistently(func() []lease.State {
			return []lease.State{held[0].State(), held[1].State(), held[2].State()}
		}, 2*opts.TTL, 200*time.Millisecond).Should(HaveEach(lease.Held), "a permit was lost although renewed")

		By("a fourth asks: it waits, the three permits are taken")
		type result struct {
			l   *lease.Lease
			err error
		}
		fourth := make(chan result, 1)
		hc4, _, _ := holderClient(ns)
		go func() {
			defer GinkgoRecover()
			l, err := hc4.Acquire(ctx, lock, "W4", opts)
			fourth <- result{l, err}
		}()
		Eventually(func() int { return len(claims(ns)) }, 5*time.Second).Should(Equal(4))
		Consistently(fourth, 2*time.Second).ShouldNot(Receive())
		Expect(ledgerOf().Permits).To(HaveLen(3))

		By("W2 releases: its permit ends and W4 is granted the next epoch")
		released := held[1]
		Expect(released.Release(ctx)).To(Succeed())
		var r result
		Eventually(fourth, 10*time.Second).Should(Receive(&r))
		Expect(r.err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = r.l.Release(ctx) })
		Expect(r.l.Epoch).To(BeNumerically(">", held[2].Epoch))
		expectHoldsPermit(r.l)
		_, ok := ledgerOf().PermitOf(released.Epoch)
		Expect(ok).To(BeFalse(), "the released permit is still recorded")
		Eventually(func() *coordinationv1.Lease { return permitLease(released.Epoch) }, 5*time.Second).Should(BeNil(),
			"the released permit's Lease was not deleted")
		for _, l := range []*lease.Lease{held[0], held[2]} {
			expectHoldsPermit(l)
		}
		Expect(ledgerOf().Permits).To(HaveLen(3))
	})

	It("ends the permit of a holder that stops renewing one TTL later: the holder goes SUSPECT then LOST, and the waiter gets a permit", func() {
		long := lease.Options{TTL: 30 * time.Second, MaxHolders: 3}
		for _, holder := range []string{"W1", "W2"} {
			hc, _, _ := holderClient(ns)
			l, err := hc.Acquire(ctx, lock, holder, long)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _ = l.Release(ctx) })
		}
		stuck, f, _ := holderClient(ns)
		rec := &recorder{}
		lost := make(chan time.Time, 1)
		w3, err := stuck.Acquire(ctx, lock, "W3", lease.Options{TTL: 3 * time.Second, RenewInterval: time.Second,
			SuspectMargin: 1500 * time.Millisecond, MaxHolders: 3, OnTransition: func(t lease.Transition) {
				rec.record(t)
				if t.To == lease.Lost {
					lost <- time.Now()
				}
			}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w3.Release(ctx) })
		expectHoldsPermit(w3)
		w4 := semWaiter("w4", 3)
		Eventually(phaseOf(w4), 5*time.Second).Should(Equal(fkv1.PhasePending))

		By("W3's renewals of its permit's Lease never reach the apiserver")
		f.set(func(f *faults) {
			f.block = []rule{{method: http.MethodPut, path: "/leases/" + fkv1.PermitLeaseName(lock, w3.Epoch)}}
		})
		Eventually(w3.State, 5*time.Second, 50*time.Millisecond).Should(Equal(lease.Suspect))
		var lostAt time.Time
		Eventually(lost, 10*time.Second).Should(Receive(&lostAt))
		Expect(w3.Done()).To(BeClosed(), "the lease's context is cancelled on loss")
		Expect(rec.states()).To(Equal([]lease.State{lease.Acquiring, lease.Held, lease.Suspect, lease.Lost}))

		By("the authority ends W3's permit on its own clock and grants W4 the next epoch, not before W3 knew")
		Eventually(phaseOf(w4), 15*time.Second).Should(Equal(fkv1.PhaseHeld))
		var w3claim fkv1.FencedLease
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: w3.ClaimName}, &w3claim)).To(Succeed())
		Expect(w3claim.Status.Phase).To(Equal(fkv1.PhaseExpired))
		led := ledgerOf()
		_, ok := led.PermitFor(w3.UID)
		Expect(ok).To(BeFalse(), "the expired permit is still recorded")
		// Deleted right after the statuses are written, in the same reconcile.
		Eventually(func() *coordinationv1.Lease { return permitLease(w3.Epoch) }, 5*time.Second, 50*time.Millisecond).
			Should(BeNil(), "the expired permit's Lease was not deleted")
		var w4claim fkv1.FencedLease
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(w4), &w4claim)).To(Succeed())
		Expect(w4claim.Status.Epoch).To(BeNumerically(">", w3.Epoch))
		p, ok := led.PermitOf(w4claim.Status.Epoch)
		Expect(ok).To(BeTrue())
		Expect(p.UID).To(Equal(w4claim.UID))
		Eventually(func() *coordinationv1.Lease { return permitLease(w4claim.Status.Epoch) }, 5*time.Second).ShouldNot(BeNil())
		// The manager runs in this process: its clock is ours.
		Expect(permitLease(w4claim.Status.Epoch).Spec.AcquireTime.Time).To(BeTemporally(">=", lostAt),
			"W4 was granted before W3 reported LOST")
		Expect(led.Permits).To(HaveLen(3))
	})

	It("keeps a claim that asks for another capacity waiting, with reason CapacityMismatch", func() {
		hc, _, _ := holderClient(ns)
		l, err := hc.Acquire(ctx, lock, "W1", lease.Options{TTL: 30 * time.Second, MaxHolders: 3})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = l.Release(ctx) })
		mutex := semWaiter("mutex", 1)
		Eventually(heldReason(mutex), 5*time.Second).Should(Equal(fkv1.ReasonCapacityMismatch))
		Expect(phaseOf(mutex)()).To(Equal(fkv1.PhasePending))
		five := semWaiter("five", 5)
		Eventually(heldReason(five), 5*time.Second).Should(Equal(fkv1.ReasonCapacityMismatch))
		Expect(ledgerOf().Capacity).To(Equal(int32(3)))
	})
})

package authority_test

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Semaphore locks (docs/design.md §9): up to maxHolders claims hold a
// permit at once, each with the lock's next epoch, granted FIFO; each
// permit renews a Lease of its own and expires on its own. Checked on
// every version of the lock's Lease and every claim status the watches
// delivered, not only at the end.
var _ = Describe("Semaphore locks", func() {
	var (
		ns string
		h  *history
	)
	BeforeEach(func() {
		ns = newNamespace()
		h = recordHistory(ns)
	})

	createSem := func(name, lock string, n, ttl int32) *fkv1.FencedLease {
		c := newClaim(ns, name, lock, name, ttl)
		c.Spec.MaxHolders = ptr.To(n)
		ExpectWithOffset(1, k8s.Create(context.Background(), c)).To(Succeed())
		return c
	}

	// verifyPermits checks every Lease version of lock and every claim
	// status: never more than n permits listed or n claims Held at once,
	// and each permit epoch granted to one claim only. It returns the
	// epochs granted, by claim UID.
	verifyPermits := func(lock string, n int) map[string]int64 {
		epochOf := map[string]int64{}
		claimOf := map[int64]string{}
		for _, l := range h.Leases() {
			if l.Name != lock {
				continue
			}
			led := fkv1.ReadLedger(&l, lock)
			ExpectWithOffset(1, led.PermitsInvalid).To(BeFalse())
			ExpectWithOffset(1, len(led.Permits)).To(BeNumerically("<=", n), "Lease version %s lists %d permits", l.ResourceVersion, len(led.Permits))
			for _, p := range led.Permits {
				ExpectWithOffset(1, p.Epoch).To(BeNumerically("<=", led.Epoch), "a permit above the counter")
				if prev, ok := claimOf[p.Epoch]; ok {
					ExpectWithOffset(1, prev).To(Equal(string(p.UID)), "epoch %d permitted to two claims", p.Epoch)
				}
				claimOf[p.Epoch] = string(p.UID)
				if prev, ok := epochOf[string(p.UID)]; ok {
					ExpectWithOffset(1, prev).To(Equal(p.Epoch), "claim %s given a second epoch", p.Claim)
				}
				epochOf[string(p.UID)] = p.Epoch
			}
		}
		phase := map[string]fkv1.FencedLeasePhase{}
		for _, ev := range h.ClaimEvents() {
			c := ev.Claim
			if c.Spec.LockName != lock {
				continue
			}
			if ev.Deleted || c.DeletionTimestamp != nil {
				delete(phase, string(c.UID))
				continue
			}
			phase[string(c.UID)] = c.Status.Phase
			held := 0
			for _, p := range phase {
				if p == fkv1.PhaseHeld {
					held++
				}
			}
			ExpectWithOffset(1, held).To(BeNumerically("<=", n), "%d claims Held at once on a lock of %d permits", held, n)
			if c.Status.Epoch != 0 {
				ExpectWithOffset(1, claimOf).To(HaveKeyWithValue(c.Status.Epoch, string(c.UID)), "claim %s shows epoch %d the Lease never permitted it", c.Name, c.Status.Epoch)
			}
		}
		return epochOf
	}

	It("grants up to maxHolders permits at once, each with the next epoch, FIFO, and the next waiter when one ends", func() {
		m := startManager(time.Second)
		DeferCleanup(m.Stop)
		var claims []*fkv1.FencedLease
		for i := range 4 {
			claims = append(claims, createSem(fmt.Sprintf("w%d", i+1), "warehouse", 3, 60))
			time.Sleep(20 * time.Millisecond) // FIFO by creation time
		}
		var epochs []int64
		for _, c := range claims[:3] {
			epochs = append(epochs, eventuallyPhase(ns, c.Name, fkv1.PhaseHeld).Status.Epoch)
		}
		Expect(epochs[1]).To(Equal(epochs[0] + 1))
		Expect(epochs[2]).To(Equal(epochs[1] + 1))
		Consistently(func() fkv1.FencedLeasePhase { return getClaim(ns, "w4").Status.Phase }, 2*time.Second, 100*time.Millisecond).
			Should(Equal(fkv1.PhasePending), "a fourth holder on a lock of three permits")

		By("each permit has its renewal Lease, renewable only as the holder would")
		for i, c := range claims[:3] {
			var l coordinationv1.Lease
			Eventually(func() error {
				return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fkv1.PermitLeaseName("warehouse", epochs[i])}, &l)
			}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
			Expect(l.Labels).To(HaveKeyWithValue(fkv1.LabelPermitEpoch, fmt.Sprint(epochs[i])))
			Expect(l.Annotations).To(HaveKeyWithValue(fkv1.AnnotationClaimUID, string(getClaim(ns, c.Name).UID)))
			Expect(ptr.Deref(l.Spec.HolderIdentity, "")).To(Equal(c.Name))
		}

		By("the first releases: the fourth gets the next epoch; the released permit's Lease goes")
		deleteClaim(getClaim(ns, "w1"))
		w4 := eventuallyPhase(ns, "w4", fkv1.PhaseHeld)
		Expect(w4.Status.Epoch).To(Equal(epochs[2] + 1))
		Eventually(func() bool {
			err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fkv1.PermitLeaseName("warehouse", epochs[0])}, &coordinationv1.Lease{})
			return apierrors.IsNotFound(err)
		}, 10*time.Second, 50*time.Millisecond).Should(BeTrue())

		By("a claim asking for another capacity waits, saying so")
		createSem("mutex-user", "warehouse", 1, 60)
		Eventually(func() string { return reasonOf(getClaim(ns, "mutex-user")) }, 10*time.Second, 50*time.Millisecond).Should(Equal(fkv1.ReasonCapacityMismatch))
		h.Complete()
		verifyPermits("warehouse", 3)
	})

	It("expires each permit on its own when its holder stops renewing its permit Lease", func() {
		m := startManager(time.Second)
		DeferCleanup(m.Stop)
		renewed := createSem("renewer", "dock", 2, 3)
		eventuallyPhase(ns, renewed.Name, fkv1.PhaseHeld)
		paused := createSem("paused", "dock", 2, 3)
		p := eventuallyPhase(ns, paused.Name, fkv1.PhaseHeld)
		r := getClaim(ns, "renewer")

		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Millisecond):
				}
				var l coordinationv1.Lease
				if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fkv1.PermitLeaseName("dock", r.Status.Epoch)}, &l); err != nil {
					continue
				}
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				_ = k8s.Update(context.Background(), &l)
			}
		}()
		DeferCleanup(func() { close(stop); wg.Wait() })

		By("the paused holder's permit expires; the renewing holder keeps its own")
		expired := eventuallyPhase(ns, paused.Name, fkv1.PhaseExpired)
		Expect(reasonOf(expired)).To(Equal(fkv1.ReasonExpired))
		Expect(expired.Status.Epoch).To(Equal(p.Status.Epoch))
		Consistently(func() fkv1.FencedLeasePhase { return getClaim(ns, "renewer").Status.Phase }, 5*time.Second, 200*time.Millisecond).
			Should(Equal(fkv1.PhaseHeld))
		led := fkv1.ReadLedger(getLease(ns, "dock"), "dock")
		Expect(permitEpochs(led)).To(Equal([]int64{r.Status.Epoch}))
		h.Complete()
		verifyPermits("dock", 2)
	})

	It("never both permits and times out a claim whose deadline races a permit's release, with two managers at once", func() {
		m1 := startManager(time.Second)
		m2 := startManager(time.Second)
		DeferCleanup(func() { m1.Stop(); m2.Stop() })
		everPermitted := func(lock string, uid string) bool {
			for _, l := range h.Leases() {
				if l.Name != lock {
					continue
				}
				if _, ok := fkv1.ReadLedger(&l, lock).PermitFor(types.UID(uid)); ok {
					return true
				}
			}
			return false
		}
		offsets := []time.Duration{200 * time.Millisecond, 900 * time.Millisecond, time.Second,
			1100 * time.Millisecond, 2500 * time.Millisecond}
		granted, timedOut := 0, 0
		for i, offset := range offsets {
			lock := fmt.Sprintf("sem-race-%d", i)
			createSem("keeper-"+lock, lock, 2, 60)
			leaving := createSem("leaving-"+lock, lock, 2, 60)
			eventuallyPhase(ns, "keeper-"+lock, fkv1.PhaseHeld)
			eventuallyPhase(ns, leaving.Name, fkv1.PhaseHeld)
			w := newClaim(ns, "w-"+lock, lock, "W", 30)
			w.Spec.MaxHolders, w.Spec.AcquireTimeoutSeconds = ptr.To(int32(2)), ptr.To(int32(1))
			Expect(k8s.Create(context.Background(), w)).To(Succeed())
			Eventually(func() fkv1.FencedLeasePhase { return getClaim(ns, w.Name).Status.Phase }, 10*time.Second, 10*time.Millisecond).
				ShouldNot(BeEmpty())
			time.Sleep(offset)
			deleteClaim(getClaim(ns, leaving.Name))
			var end *fkv1.FencedLease
			Eventually(func() fkv1.FencedLeasePhase {
				end = getClaim(ns, w.Name)
				return end.Status.Phase
			}, 30*time.Second, 10*time.Millisecond).Should(Or(Equal(fkv1.PhaseHeld), Equal(fkv1.PhaseExpired)))
			if end.Status.Phase == fkv1.PhaseHeld {
				granted++
				Expect(fkv1.ReadLedger(getLease(ns, lock), lock).TimedOutClaim(w.UID)).To(BeFalse(), "permitted and listed as timed out")
				Consistently(func() string { return reasonOf(getClaim(ns, w.Name)) }, time.Second).Should(Equal(fkv1.ReasonGranted))
			} else {
				timedOut++
				Expect(reasonOf(end)).To(Equal(fkv1.ReasonAcquireTimeout))
				Expect(end.Status.Epoch).To(BeZero())
			}
		}
		for i := range offsets {
			lock := fmt.Sprintf("sem-race-%d", i)
			w := getClaim(ns, "w-"+lock)
			if reasonOf(w) == fkv1.ReasonAcquireTimeout {
				Expect(everPermitted(lock, string(w.UID))).To(BeFalse(), "a Lease permitted timed-out claim %s", w.Name)
				Expect(h.EverHeld(w.UID)).To(BeFalse(), "timed-out claim %s was Held", w.Name)
			}
			verifyPermits(lock, 2)
		}
		Expect(granted).To(BeNumerically(">", 0), "no release came before a deadline")
		Expect(timedOut).To(BeNumerically(">", 0), "no deadline came before a release")
	})

	It("never lists more permits than maxHolders with two managers active at once and 30 contenders churning", func() {
		m1 := startManager(time.Second)
		m2 := startManager(time.Second)
		DeferCleanup(func() { m1.Stop(); m2.Stop() })
		m1.writes.namespace.Store(ns)
		m2.writes.namespace.Store(ns)

		rng := rand.New(rand.NewSource(GinkgoRandomSeed()))
		var wg sync.WaitGroup
		for i := range 30 {
			// Every fourth holder never renews and expires (TTL 1s); the
			// rest release by deleting their claim after a short hold.
			expire := i%4 == 3
			hold := time.Duration(rng.Intn(300)) * time.Millisecond
			c := createSem(fmt.Sprintf("c-%02d", i), "loaders", 3, map[bool]int32{true: 1, false: 30}[expire])
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				eventuallyPhaseWithin(ns, c.Name, fkv1.PhaseHeld, 3*time.Minute)
				if expire {
					eventuallyPhaseWithin(ns, c.Name, fkv1.PhaseExpired, time.Minute)
					return
				}
				time.Sleep(hold)
				deleteClaim(getClaim(ns, c.Name))
			}()
			time.Sleep(time.Duration(rng.Intn(40)) * time.Millisecond)
		}
		wg.Wait()
		h.Complete()
		granted := verifyPermits("loaders", 3)
		Expect(granted).To(HaveLen(30), "every contender was permitted once")

		By("both managers wrote the ledger: the race was real")
		Expect(m1.writes.leaseUpdateWins.Load()).To(BeNumerically(">", 0), "manager 1 never won a ledger write")
		Expect(m2.writes.leaseUpdateWins.Load()).To(BeNumerically(">", 0), "manager 2 never won a ledger write")

		By("no permit Lease outlives its permit")
		Eventually(func() []string {
			var list coordinationv1.LeaseList
			Expect(k8s.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
			var names []string
			for _, l := range list.Items {
				if strings.HasPrefix(l.Name, "loaders-permit-") {
					names = append(names, l.Name)
				}
			}
			return names
		}, 30*time.Second, 100*time.Millisecond).Should(BeEmpty())
	})
})

func permitEpochs(l fkv1.Ledger) []int64 {
	var out []int64
	for _, p := range l.Permits {
		out = append(out, p.Epoch)
	}
	return out
}

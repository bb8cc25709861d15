package authority_test

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var ctx = context.Background()

var _ = Describe("Lock controller", func() {
	var (
		ns  string
		mgr *runningManager
		h   *history
	)
	BeforeEach(func() {
		ns = newNamespace()
		h = recordHistory(ns)
	})
	startDefault := func() {
		mgr = startManager(time.Second)
		DeferCleanup(func() { mgr.Stop() })
	}

	It("grants the first claim an epoch at the storage revision, queues the second, and hands over epoch+1 on release", func() {
		startDefault()
		before := storageRevision()
		w1 := createClaim(ns, "w1-report-2026-07", "report-2026-07", "W1", 30)
		held := eventuallyPhase(ns, w1.Name, fkv1.PhaseHeld)
		e := held.Status.Epoch
		Expect(e).To(BeNumerically(">", before), "a new ledger starts at the storage revision read at its first grant")
		Expect(held.Status.LeaseName).To(Equal("report-2026-07"))
		Expect(held.Status.AcquireTime).NotTo(BeNil())
		Expect(meta.IsStatusConditionTrue(held.Status.Conditions, fkv1.ConditionHeld)).To(BeTrue())

		lease := getLease(ns, "report-2026-07")
		Expect(*lease.Spec.HolderIdentity).To(Equal("W1"))
		Expect(*lease.Spec.LeaseDurationSeconds).To(Equal(int32(30)))
		Expect(lease.Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(e)))
		Expect(lease.Annotations).To(HaveKeyWithValue(fkv1.AnnotationClaim, w1.Name))
		Expect(lease.Annotations).To(HaveKeyWithValue(fkv1.AnnotationClaimUID, string(w1.UID)))
		Expect(lease.Labels).To(HaveKeyWithValue(fkv1.LabelManagedBy, fkv1.ManagedByValue))
		Expect(lease.Labels).To(HaveKeyWithValue(fkv1.LabelLock, "report-2026-07"))
		Expect(lease.Finalizers).To(ContainElement(fkv1.LeaseFinalizer))

		w2 := createClaim(ns, "w2-report-2026-07", "report-2026-07", "W2", 30)
		pending := eventuallyPhase(ns, w2.Name, fkv1.PhasePending)
		cond := meta.FindStatusCondition(pending.Status.Conditions, fkv1.ConditionHeld)
		Expect(cond).NotTo(BeNil())
		Expect(cond.Reason).To(Equal(fkv1.ReasonNext), "a claim entering the queue at its head is shown Next (its library watches the Lease)")
		Consistently(func() fkv1.FencedLeasePhase { return getClaim(ns, w2.Name).Status.Phase }, time.Second).Should(Equal(fkv1.PhasePending))
		w3 := createClaim(ns, "w3-report-2026-07", "report-2026-07", "W3", 30)
		reasonOf := func(name string) func() string {
			return func() string {
				if c := meta.FindStatusCondition(getClaim(ns, name).Status.Conditions, fkv1.ConditionHeld); c != nil {
					return c.Reason
				}
				return ""
			}
		}
		Eventually(reasonOf(w3.Name), 10*time.Second).Should(Equal(fkv1.ReasonQueued), "a waiter behind the head")

		deleteClaim(w1)
		held2 := eventuallyPhase(ns, w2.Name, fkv1.PhaseHeld)
		Consistently(reasonOf(w3.Name), time.Second).Should(Equal(fkv1.ReasonQueued),
			"a waiter that became the head is not marked Next: that would be a status write per handoff")
		deleteClaim(w3)
		Expect(held2.Status.Epoch).To(Equal(e + 1))
		lease = getLease(ns, "report-2026-07")
		Expect(*lease.Spec.HolderIdentity).To(Equal("W2"))
		Expect(lease.Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(e+1)))
		Expect(lease.Annotations).To(HaveKeyWithValue(fkv1.AnnotationPreviousClaimUID, string(w1.UID)))

		By("recording an Event for each ownership transition, and none for queueing")
		events := func() []string {
			var evs eventsv1.EventList
			Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var out []string
			for _, e := range evs.Items {
				out = append(out, e.Regarding.Name+"/"+e.Reason)
			}
			return out
		}
		Eventually(events, 10*time.Second).Should(ContainElements(
			w1.Name+"/"+fkv1.ReasonGranted, w2.Name+"/"+fkv1.ReasonGranted, "report-2026-07/"+fkv1.ReasonReleased))
		Expect(events()).NotTo(ContainElement(w2.Name+"/"+fkv1.ReasonQueued), "an Event per waiter")

		grants := h.verifyClaims()
		Expect(grants["report-2026-07"]).To(Equal(map[int64]string{e: string(w1.UID), e + 1: string(w2.UID)}))
		Expect(h.verifyLeases()["report-2026-07"]).To(Equal([]int64{e, e + 1}))
	})

	It("grants five contenders in FIFO order (creationTimestamp, then name), each with the next epoch", func() {
		startDefault()
		holder := createClaim(ns, "zz-holder", "fifo", "H", 60)
		e := eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld).Status.Epoch
		// Names run against creation order, so name order alone would be wrong.
		names := []string{"e", "d", "c", "b", "a"}
		var claims []*fkv1.FencedLease
		for i, n := range names {
			if i > 0 {
				time.Sleep(1100 * time.Millisecond) // creationTimestamp has 1s resolution
			}
			claims = append(claims, createClaim(ns, n, "fifo", "W-"+n, 60))
		}
		// Two created within the same second are ordered by name.
		tieB := createClaim(ns, "tie-b", "fifo", "T-b", 60)
		tieA := createClaim(ns, "tie-a", "fifo", "T-a", 60)
		for _, c := range claims {
			eventuallyPhase(ns, c.Name, fkv1.PhasePending)
		}
		prev := holder
		for i, c := range claims {
			deleteClaim(prev)
			got := eventuallyPhase(ns, c.Name, fkv1.PhaseHeld)
			Expect(got.Status.Epoch).To(Equal(e + int64(i) + 1))
			prev = c
		}
		sameSecond := getClaim(ns, tieA.Name).CreationTimestamp.Equal(ptr.To(getClaim(ns, tieB.Name).CreationTimestamp))
		deleteClaim(prev)
		if sameSecond {
			Expect(eventuallyPhase(ns, tieA.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(e + 6))
			Expect(getClaim(ns, tieB.Name).Status.Phase).To(Equal(fkv1.PhasePending))
		} else {
			Expect(eventuallyPhase(ns, tieB.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(e + 6))
		}
		h.verifyClaims()
		Expect(h.verifyLeases()["fifo"]).To(Equal([]int64{e, e + 1, e + 2, e + 3, e + 4, e + 5, e + 6}))
	})

	It("keeps a renewed lease past its TTL and expires it a TTL after renewals stop", func() {
		startDefault()
		w1 := createClaim(ns, "w1", "report", "W1", 2)
		e := eventuallyPhase(ns, w1.Name, fkv1.PhaseHeld).Status.Epoch
		w2 := createClaim(ns, "w2", "report", "W2", 2)
		eventuallyPhase(ns, w2.Name, fkv1.PhasePending)

		By("renewing every 500ms for 5s (2.5 TTLs)")
		for i := 0; i < 10; i++ {
			Expect(renew(ns, "report", string(w1.UID))).To(Succeed())
			time.Sleep(500 * time.Millisecond)
			Expect(getClaim(ns, w2.Name).Status.Phase).To(Equal(fkv1.PhasePending), "W2 granted while W1 renewed")
		}
		By("pausing W1: no more renewals")
		stoppedAt := time.Now()
		held := eventuallyPhase(ns, w2.Name, fkv1.PhaseHeld)
		Expect(time.Since(stoppedAt)).To(BeNumerically(">=", 1500*time.Millisecond), "takeover before a TTL without renewal")
		Expect(held.Status.Epoch).To(Equal(e + 1))
		expired := eventuallyPhase(ns, w1.Name, fkv1.PhaseExpired)
		Expect(expired.Status.Epoch).To(Equal(e), "an expired claim keeps its epoch")
		Expect(meta.FindStatusCondition(expired.Status.Conditions, fkv1.ConditionHeld).Reason).To(Equal(fkv1.ReasonExpired))

		By("the paused holder's late renewal is refused: the Lease names another claim")
		Expect(renew(ns, "report", string(w1.UID))).NotTo(Succeed())

		By("an Expired claim is terminal: with the lock free again it is not re-granted")
		deleteClaim(w2)
		Eventually(func() string { return getLease(ns, "report").Annotations[fkv1.AnnotationClaimUID] }, 10*time.Second).Should(BeEmpty())
		Consistently(func() fkv1.FencedLeasePhase { return getClaim(ns, w1.Name).Status.Phase }, 3*time.Second).Should(Equal(fkv1.PhaseExpired))
		Expect(getLease(ns, "report").Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(e+1)), "a freed lock keeps its epoch")
		h.verifyClaims()
		Expect(h.verifyLeases()["report"]).To(Equal([]int64{e, e + 1}))
	})

	It("keeps epochs per lock, independent between locks", func() {
		startDefault()
		a1 := createClaim(ns, "a1", "lock-a", "A1", 30)
		b1 := createClaim(ns, "b1", "lock-b", "B1", 30)
		ea := eventuallyPhase(ns, a1.Name, fkv1.PhaseHeld).Status.Epoch
		eb := eventuallyPhase(ns, b1.Name, fkv1.PhaseHeld).Status.Epoch
		a2 := createClaim(ns, "a2", "lock-a", "A2", 30)
		eventuallyPhase(ns, a2.Name, fkv1.PhasePending)
		deleteClaim(a1)
		Expect(eventuallyPhase(ns, a2.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(ea + 1))
		Expect(getLease(ns, "lock-b").Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(eb)), "lock-b did not move")
	})

	It("writes O(1) per handoff however many waiters, and nothing on a no-op reconcile", func() {
		startDefault()
		mgr.writes.namespace.Store(ns)
		holder := createClaim(ns, "holder", "busy", "H", 60)
		eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld)
		var waiters []*fkv1.FencedLease
		for i := 0; i < 30; i++ {
			waiters = append(waiters, createClaim(ns, fmt.Sprintf("waiter-%02d", i), "busy", fmt.Sprintf("W%d", i), 60))
		}
		for _, w := range waiters {
			eventuallyPhase(ns, w.Name, fkv1.PhasePending)
		}
		time.Sleep(time.Second) // let watch events of the queue settle
		before := mgr.writes.total()

		By("triggering reconciles that change nothing")
		for _, w := range waiters[:5] {
			c := getClaim(ns, w.Name)
			if c.Labels == nil {
				c.Labels = map[string]string{}
			}
			c.Labels["touched"] = "yes"
			Expect(k8s.Update(ctx, c)).To(Succeed())
		}
		Expect(renew(ns, "busy", string(holder.UID))).To(Succeed())
		Consistently(mgr.writes.total, 2*time.Second).Should(Equal(before), "a no-op reconcile wrote")

		By("handing off with 30 waiters")
		deleteClaim(holder)
		eventuallyPhase(ns, waiters[0].Name, fkv1.PhaseHeld)
		Consistently(mgr.writes.total, 2*time.Second).Should(Equal(before+2),
			"a handoff is one Lease update and one status patch (leases=%d claims=%d)", mgr.writes.leases.Load(), mgr.writes.claims.Load())
		for _, w := range waiters[1:] {
			Expect(getClaim(ns, w.Name).Status.Phase).To(Equal(fkv1.PhasePending))
		}
	})

	It("never writes a same-named Lease it does not manage; claims wait with LockConflict", func() {
		startDefault()
		foreign := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone-else")},
		}
		Expect(k8s.Create(ctx, foreign)).To(Succeed())
		rv := foreign.ResourceVersion
		c := createClaim(ns, "c", "taken", "W1", 30)
		Eventually(func() bool {
			return meta.IsStatusConditionTrue(getClaim(ns, c.Name).Status.Conditions, fkv1.ConditionLockConflict)
		}, 10*time.Second).Should(BeTrue())
		got := getClaim(ns, c.Name)
		Expect(got.Status.Phase).To(Equal(fkv1.PhasePending))
		Expect(meta.FindStatusCondition(got.Status.Conditions, fkv1.ConditionLockConflict).Message).To(ContainSubstring("not managed by fencekeeper"))
		Consistently(func() string { return getLease(ns, "taken").ResourceVersion }, 2*time.Second).Should(Equal(rv))

		By("the conflict clears when the foreign Lease goes")
		Expect(k8s.Delete(ctx, foreign)).To(Succeed())
		held := eventuallyPhase(ns, c.Name, fkv1.PhaseHeld)
		Expect(held.Status.Epoch).To(BeNumerically(">", 0))
		Expect(meta.FindStatusCondition(held.Status.Conditions, fkv1.ConditionLockConflict)).To(BeNil())
	})

	It("keeps node heartbeat and other unmanaged Leases out of its cache", func() {
		startDefault()
		hb := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "node-heartbeat"}}
		Expect(k8s.Create(ctx, hb)).To(Succeed())
		c := createClaim(ns, "c", "cached", "W1", 30)
		eventuallyPhase(ns, c.Name, fkv1.PhaseHeld)
		var l coordinationv1.Lease
		Expect(mgr.mgr.GetCache().Get(ctx, client.ObjectKey{Namespace: ns, Name: "cached"}, &l)).To(Succeed())
		var all coordinationv1.LeaseList
		Expect(mgr.mgr.GetCache().List(ctx, &all, client.InNamespace(ns))).To(Succeed())
		Expect(all.Items).To(HaveLen(1))
		Expect(all.Items[0].Name).To(Equal("cached"))
	})

	It("issues each epoch once with two managers active at once and 50 contenders churning on 3 locks", func() {
		m1 := startManager(time.Second)
		m2 := startManager(time.Second)
		DeferCleanup(func() { m1.Stop(); m2.Stop() })
		m1.writes.namespace.Store(ns)
		m2.writes.namespace.Store(ns)

		locks := []string{"churn-a", "churn-b", "churn-c"}
		rng := rand.New(rand.NewSource(GinkgoRandomSeed()))
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			lock := locks[i%3]
			// Every fifth holder never renews and is left to expire (TTL 1s);
			// the rest release by deleting their claim after a short hold.
			expire := i%5 == 4
			hold := time.Duration(rng.Intn(200)) * time.Millisecond
			c := createClaim(ns, fmt.Sprintf("c-%02d", i), lock, fmt.Sprintf("W%d", i), map[bool]int32{true: 1, false: 30}[expire])
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
				deleteClaim(c)
			}()
			time.Sleep(time.Duration(rng.Intn(40)) * time.Millisecond)
		}
		wg.Wait()

		grants := h.verifyClaims()
		order := h.verifyLeases()
		total := 0
		for _, lock := range locks {
			n := len(grants[lock])
			total += n
			// The lock's epochs are n consecutive numbers from its first,
			// each granted to exactly one claim.
			first := order[lock][0]
			for e := first; e < first+int64(n); e++ {
				Expect(grants[lock]).To(HaveKey(e), "lock %s: epoch %d missing", lock, e)
			}
			Expect(order[lock]).To(HaveLen(n))
		}
		Expect(total).To(Equal(50))

		By("both managers granted: the race was real, not serialized by one of them sitting idle")
		Expect(m1.writes.leaseWins.Load()).To(BeNumerically(">", 0), "manager 1 never won a Lease write")
		Expect(m2.writes.leaseWins.Load()).To(BeNumerically(">", 0), "manager 2 never won a Lease write")

		By("one final holder per lock stays: every Held claim agrees with its Lease")
		for _, lock := range locks {
			eventuallyPhaseWithin(ns, createClaim(ns, "final-"+lock, lock, "final", 60).Name, fkv1.PhaseHeld, time.Minute)
		}
		var list fkv1.FencedLeaseList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		held := map[string]int{}
		for _, c := range list.Items {
			if c.Status.Phase != fkv1.PhaseHeld {
				continue
			}
			held[c.Spec.LockName]++
			l := getLease(ns, c.Spec.LockName)
			Expect(l.Annotations[fkv1.AnnotationClaimUID]).To(Equal(string(c.UID)))
			Expect(l.Annotations[fkv1.AnnotationEpoch]).To(Equal(strconv.FormatInt(c.Status.Epoch, 10)))
		}
		Expect(held).To(Equal(map[string]int{"churn-a": 1, "churn-b": 1, "churn-c": 1}), "exactly one Held claim per lock")
	})

	It("never moves an epoch backward when the controller restarts in the middle of handoffs", func() {
		for round, pause := range []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond} {
			m := startManager(time.Second)
			holder := createClaim(ns, fmt.Sprintf("h-%d", round), "restart", "H", 30)
			if round == 0 {
				eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld)
			}
			next := createClaim(ns, fmt.Sprintf("n-%d", round), "restart", "N", 30)
			eventuallyPhase(ns, next.Name, fkv1.PhasePending)
			// The previous round's waiter may still hold: release it first.
			var list fkv1.FencedLeaseList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			for i := range list.Items {
				if list.Items[i].Status.Phase == fkv1.PhaseHeld && list.Items[i].Name != holder.Name {
					deleteClaim(&list.Items[i])
				}
			}
			eventuallyPhase(ns, holder.Name, fkv1.PhaseHeld)
			deleteClaim(holder)
			time.Sleep(pause)
			m.Stop()
			m2 := startManager(time.Second)
			eventuallyPhase(ns, next.Name, fkv1.PhaseHeld)
			m2.Stop()
		}
		grants := h.verifyClaims()
		seq := h.verifyLeases()["restart"]
		Expect(seq).To(HaveLen(8))
		// Each restart starts a term whose grants are at least its floor, so
		// the epochs jump at a restart; they never repeat or go back.
		for i := 1; i < len(seq); i++ {
			Expect(seq[i]).To(BeNumerically(">", seq[i-1]), "epochs %v do not increase", seq)
		}
		Expect(grants["restart"]).To(HaveLen(8))
	})

	It("heals a crash between the Lease grant and the claim status patch", func() {
		m := startManager(time.Second)
		a := createClaim(ns, "a", "heal", "A", 30)
		e := eventuallyPhase(ns, a.Name, fkv1.PhaseHeld).Status.Epoch
		b := createClaim(ns, "b", "heal", "B", 30)
		eventuallyPhase(ns, b.Name, fkv1.PhasePending)
		m.Stop()

		By("doing a takeover's Lease write by hand, as a controller that died right after it")
		grantByHand(ns, "heal", a, b, e+1)

		m2 := startManager(time.Second)
		DeferCleanup(m2.Stop)
		Expect(eventuallyPhase(ns, b.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(e + 1))
		Expect(eventuallyPhase(ns, a.Name, fkv1.PhaseExpired).Status.Epoch).To(Equal(e))
		h.verifyClaims()
		h.verifyLeases()
	})

	// Two faults: the grant's status patch never happened, and the counter
	// was then broken or set back by hand. Nothing left records the epoch
	// the holder was granted, so only the storage revision is above it;
	// healed from the Lease or the floor, the holder would share the
	// previous holder's epoch (or hold one below it). A grant is the pair
	// (claim UID, epoch), and the holder's library knows only the epoch it
	// was granted: the authority never gives it another (rev. 3; before, it
	// kept b at a fresh epoch and this test asserted that). b's hold ends,
	// and the next waiter is granted an epoch above every earlier one.
	It("ends the hold of a holder whose grant no status recorded after its counter is broken or set back, and grants the next waiter an epoch above every earlier one", func() {
		for i, tamper := range []func(e int64) string{
			func(int64) string { return "garbage" },
			epochString,                                        // back to the previous holder's
			func(e int64) string { return epochString(e - 5) }, // below it
		} {
			lock := fmt.Sprintf("heal-broken-%d", i)
			m := startManager(time.Second)
			a := createClaim(ns, fmt.Sprintf("a%d", i), lock, "A", 30)
			e := eventuallyPhase(ns, a.Name, fkv1.PhaseHeld).Status.Epoch
			b := createClaim(ns, fmt.Sprintf("b%d", i), lock, "B", 30)
			eventuallyPhase(ns, b.Name, fkv1.PhasePending)
			c := createClaim(ns, fmt.Sprintf("c%d", i), lock, "C", 30)
			eventuallyPhase(ns, c.Name, fkv1.PhasePending)
			m.Stop()

			By(fmt.Sprintf("%s: a takeover's Lease write by hand, as a controller that died right after it, then an admin sets the counter to %q", lock, tamper(e)))
			grantByHand(ns, lock, a, b, e+1)
			l := getLease(ns, lock)
			l.Annotations[fkv1.AnnotationEpoch] = tamper(e)
			Expect(k8s.Update(ctx, l)).To(Succeed())
			rev := storageRevision()

			m2 := startManager(time.Second)
			ec := eventuallyPhase(ns, c.Name, fkv1.PhaseHeld).Status.Epoch
			Expect(ec).To(BeNumerically(">=", rev), "%s: the next grant's epoch is a fresh one, at the storage revision", lock)
			ended := eventuallyPhase(ns, b.Name, fkv1.PhaseExpired)
			Expect(ended.Status.Epoch).To(BeZero(), "%s: b was never given an epoch", lock)
			Expect(meta.FindStatusCondition(ended.Status.Conditions, fkv1.ConditionHeld).Reason).To(Equal(fkv1.ReasonSuperseded))
			Expect(eventuallyPhase(ns, a.Name, fkv1.PhaseExpired).Status.Epoch).To(Equal(e))
			Eventually(func() string { return getLease(ns, lock).Annotations[fkv1.AnnotationClaimUID] }, 10*time.Second).Should(Equal(string(c.UID)))
			Expect(getLease(ns, lock).Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, epochString(ec)))
			Eventually(func() []string {
				var evs eventsv1.EventList
				Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
				var out []string
				for _, ev := range evs.Items {
					out = append(out, ev.Regarding.Name+"/"+ev.Reason)
				}
				return out
			}, 10*time.Second).Should(ContainElement(b.Name+"/"+fkv1.ReasonSuperseded), "an Event for the end of b's hold")
			m2.Stop()
		}
		h.verifyClaims() // also: never Held without an epoch, no claim changed its epoch
		for _, c := range h.Claims() {
			if c.Name[0] == 'b' {
				Expect(c.Status.Phase).NotTo(Equal(fkv1.PhaseHeld), "%s was shown Held: with which epoch?", c.Name)
			}
		}
	})

	// The holder's library counts its safe time by its claim's TTL; a Lease
	// whose TTL was cut by hand (the guard off) must not expire it sooner.
	It("keeps the holder's TTL when the Lease's is cut by hand, and repairs it", func() {
		startDefault()
		c1 := createClaim(ns, "c1", "ttl-cut", "W1", 30)
		eventuallyPhase(ns, c1.Name, fkv1.PhaseHeld)
		l := getLease(ns, "ttl-cut")
		l.Spec.LeaseDurationSeconds = ptr.To(int32(1))
		Expect(k8s.Update(ctx, l)).To(Succeed())
		Eventually(func() int32 { return ptr.Deref(getLease(ns, "ttl-cut").Spec.LeaseDurationSeconds, 0) }, 10*time.Second).Should(Equal(int32(30)))
		Consistently(func() fkv1.FencedLeasePhase { return getClaim(ns, c1.Name).Status.Phase }, 3*time.Second).Should(Equal(fkv1.PhaseHeld))
	})

	It("issues an epoch above every earlier one after the Lease is edited to a lower epoch", func() {
		m := startManager(time.Second)
		var e int64
		for i := 1; i <= 3; i++ {
			c := createClaim(ns, fmt.Sprintf("c%d", i), "edited", "W", 30)
			got := eventuallyPhase(ns, c.Name, fkv1.PhaseHeld).Status.Epoch
			if i == 1 {
				e = got
			}
			Expect(got).To(Equal(e + int64(i) - 1))
			if i < 3 {
				deleteClaim(c)
			}
		}
		By("an admin lowers the counter while c3 holds epoch e+2")
		l := getLease(ns, "edited")
		l.Annotations[fkv1.AnnotationEpoch] = "1"
		Expect(k8s.Update(ctx, l)).To(Succeed())
		Eventually(func() string { return getLease(ns, "edited").Annotations[fkv1.AnnotationEpoch] }, 10*time.Second).Should(Equal(epochString(e + 2)))

		By("the same while the controller is down, so only the claims remember")
		m.Stop()
		l = getLease(ns, "edited")
		l.Annotations[fkv1.AnnotationEpoch] = "garbage"
		Expect(k8s.Update(ctx, l)).To(Succeed())
		m2 := startManager(time.Second)
		DeferCleanup(m2.Stop)
		c4 := createClaim(ns, "c4", "edited", "W", 30)
		eventuallyPhase(ns, c4.Name, fkv1.PhasePending)
		deleteClaim(getClaim(ns, "c3"))
		Expect(eventuallyPhase(ns, c4.Name, fkv1.PhaseHeld).Status.Epoch).To(BeNumerically(">", e+2), "above every earlier epoch")
		h.verifyClaims()
	})

	It("issues an epoch above every earlier one after an admin deletes the Lease", func() {
		startDefault()
		c1 := createClaim(ns, "c1", "deleted", "W1", 30)
		e := eventuallyPhase(ns, c1.Name, fkv1.PhaseHeld).Status.Epoch
		deleteClaim(c1)
		c2 := createClaim(ns, "c2", "deleted", "W2", 1)
		Expect(eventuallyPhase(ns, c2.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(e + 1))
		eventuallyPhase(ns, c2.Name, fkv1.PhaseExpired) // keeps epoch e+1 in its status

		By("deleting the Lease: the finalizer holds it while claims exist")
		rev := storageRevision()
		l := getLease(ns, "deleted")
		Expect(k8s.Delete(ctx, l)).To(Succeed())
		l = getLease(ns, "deleted")
		Expect(l.DeletionTimestamp).NotTo(BeNil())
		By("removing the finalizer by hand: the Lease goes, and comes back as a new ledger at the storage revision")
		l.Finalizers = nil
		Expect(k8s.Update(ctx, l)).To(Succeed())
		Eventually(func() int64 {
			var again coordinationv1.Lease
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "deleted"}, &again); err != nil || again.DeletionTimestamp != nil {
				return 0
			}
			return fkv1.ReadLedger(&again, "deleted").Epoch
		}, 10*time.Second).Should(BeNumerically(">=", rev))

		c3 := createClaim(ns, "c3", "deleted", "W3", 30)
		e3 := eventuallyPhase(ns, c3.Name, fkv1.PhaseHeld).Status.Epoch
		Expect(e3).To(BeNumerically(">", e+1))
		Expect(e3).To(BeNumerically(">", rev))
	})

	// The floor remembers only what this process saw and what claims still
	// record: after a restart, with the newest holder's claim deleted, it is
	// below an epoch that was issued. A ledger written from it would hand
	// that epoch out again.
	It("never reuses an epoch after the Lease is deleted by hand and the manager restarted, while only an older claim remains", func() {
		m := startManager(time.Second)
		c1 := createClaim(ns, "c1", "partial", "W1", 1)
		e := eventuallyPhase(ns, c1.Name, fkv1.PhaseHeld).Status.Epoch
		eventuallyPhase(ns, c1.Name, fkv1.PhaseExpired) // keeps epoch e in its status
		c2 := createClaim(ns, "c2", "partial", "W2", 30)
		Expect(eventuallyPhase(ns, c2.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(e + 1))
		deleteClaim(c2) // the only record of epoch e+1 besides the Lease
		Eventually(func() string { return getLease(ns, "partial").Annotations[fkv1.AnnotationClaimUID] }, 10*time.Second).Should(BeEmpty())

		By("while the manager is down, the Lease is deleted by hand (its finalizer removed: a claim remains); the manager starts again")
		m.Stop()
		l := getLease(ns, "partial")
		Expect(k8s.Delete(ctx, l)).To(Succeed())
		l = getLease(ns, "partial")
		l.Finalizers = nil
		Expect(k8s.Update(ctx, l)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "partial"}, &coordinationv1.Lease{}))
		}, 10*time.Second).Should(BeTrue())
		rev := storageRevision()
		m2 := startManager(time.Second)
		DeferCleanup(m2.Stop)
		By("it writes the new ledger (c1 is there, nobody waits) from the storage revision, not from c1's epoch")
		Eventually(func() bool {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "partial"}, &coordinationv1.Lease{}) == nil
		}, 10*time.Second).Should(BeTrue())
		// Its Lease is created free first (no epoch issued), then written
		// with a counter.
		Eventually(func() int64 { return fkv1.ReadLedger(getLease(ns, "partial"), "partial").Epoch }, 10*time.Second).ShouldNot(BeZero())
		Expect(fkv1.ReadLedger(getLease(ns, "partial"), "partial").Epoch).To(BeNumerically(">=", rev), "a new ledger written from the floor alone")

		c3 := createClaim(ns, "c3", "partial", "W3", 30)
		e3 := eventuallyPhase(ns, c3.Name, fkv1.PhaseHeld).Status.Epoch
		Expect(e3).To(BeNumerically(">", e+1), "epoch %d reused or went backward (c1 held %d, c2 %d)", e3, e, e+1)
		h.verifyClaims()
		h.verifyLeases()
	})

	It("never reuses an epoch after every record of a lock is gone and the manager restarted", func() {
		m := startManager(time.Second)
		var issued []int64
		for i := 0; i < 3; i++ {
			c := createClaim(ns, fmt.Sprintf("c%d", i), "lost", "W", 30)
			issued = append(issued, eventuallyPhase(ns, c.Name, fkv1.PhaseHeld).Status.Epoch)
			deleteClaim(c)
		}
		By("every claim is gone; the Lease is deleted, and let go once no claim remains")
		Eventually(func() string { return getLease(ns, "lost").Annotations[fkv1.AnnotationClaimUID] }, 10*time.Second).Should(BeEmpty())
		Expect(k8s.Delete(ctx, getLease(ns, "lost"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lost"}, &coordinationv1.Lease{}))
		}, 10*time.Second).Should(BeTrue())
		By("the manager restarts: nothing remembers the lock")
		m.Stop()
		m2 := startManager(time.Second)
		DeferCleanup(m2.Stop)
		c := createClaim(ns, "again", "lost", "W", 30)
		again := eventuallyPhase(ns, c.Name, fkv1.PhaseHeld).Status.Epoch
		for _, e := range issued {
			Expect(again).To(BeNumerically(">", e), "epoch %d reused or went backward (earlier: %v)", again, issued)
		}
	})

	It("lets a deleted Lease go once no claim of its lock remains", func() {
		startDefault()
		c := createClaim(ns, "c", "gone", "W", 30)
		eventuallyPhase(ns, c.Name, fkv1.PhaseHeld)
		deleteClaim(c)
		Eventually(func() string { return getLease(ns, "gone").Annotations[fkv1.AnnotationClaimUID] }, 10*time.Second).Should(BeEmpty())
		Expect(k8s.Delete(ctx, getLease(ns, "gone"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gone"}, &coordinationv1.Lease{}))
		}, 10*time.Second).Should(BeTrue())
	})
})

func eventuallyPhaseWithin(ns, name string, phase fkv1.FencedLeasePhase, d time.Duration) {
	EventuallyWithOffset(1, func() fkv1.FencedLeasePhase {
		var c fkv1.FencedLease
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &c); err != nil {
			return ""
		}
		return c.Status.Phase
	}, d, 20*time.Millisecond).Should(Equal(phase), "claim %s/%s", ns, name)
}

// leaseAnnotation reads one annotation of a Lease, "" when it does not exist.
func leaseAnnotation(ns, lock, key string) string {
	var l coordinationv1.Lease
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &l); err != nil {
		return ""
	}
	return l.Annotations[key]
}

// grantByHand writes the Lease of lock as a takeover from a to b at epoch
// would, without the claim statuses: a controller that died right after its
// grant's Lease write.
func grantByHand(ns, lock string, a, b *fkv1.FencedLease, epoch int64) {
	l := getLease(ns, lock)
	l.Annotations[fkv1.AnnotationEpoch] = epochString(epoch)
	l.Annotations[fkv1.AnnotationPreviousClaimUID] = string(a.UID)
	l.Annotations[fkv1.AnnotationClaim] = b.Name
	l.Annotations[fkv1.AnnotationClaimUID] = string(b.UID)
	l.Spec.HolderIdentity = ptr.To(b.Spec.HolderIdentity)
	ExpectWithOffset(1, k8s.Update(ctx, l)).To(Succeed())
}

package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/history"
)

// Several locks at once (docs/design.md §9): AcquireAll takes them in one
// order every caller shares, the set ends with any of its leases, and a
// lock it cannot take gives back the ones it took.
var _ = Describe("AcquireAll", func() {
	var (
		ns string
		h  *history.History
	)
	BeforeEach(func() {
		ns = newNamespace()
		h = history.Record(admin, ns)
	})

	// ledgerOf is the lock's Lease as the authority keeps it.
	ledgerOf := func(lock string) fkv1.Ledger {
		var l coordinationv1.Lease
		ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &l)).To(Succeed())
		return fkv1.ReadLedger(&l, lock)
	}
	// locksOf are the locks of the transitions to state, in the order reported.
	locksOf := func(rec *recorder, to lease.State) []string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		var out []string
		for _, t := range rec.got {
			if t.To == to {
				out = append(out, t.Lock)
			}
		}
		return out
	}
	// everPending reports whether the history shows a claim of holder
	// waiting (Pending) for lock.
	everPending := func(holder, lock string) bool {
		for _, c := range h.Claims() {
			if c.Spec.HolderIdentity == holder && c.Spec.LockName == lock && c.Status.Phase == fkv1.PhasePending {
				return true
			}
		}
		return false
	}

	It("takes the locks sorted by name, shows each one's epoch, ends its context when any one is lost, and releases all in reverse order", func() {
		holder, _, _ := holderClient(ns)
		rec := &recorder{}
		set, err := holder.AcquireAll(ctx, []string{"report-b", "ledger-a"}, "W1", lease.Options{TTL: 30 * time.Second, OnTransition: rec.record})
		Expect(err).NotTo(HaveOccurred())
		Expect(set.Locks()).To(Equal([]string{"ledger-a", "report-b"}))
		Expect(locksOf(rec, lease.Held)).To(Equal([]string{"ledger-a", "report-b"}), "taken in another order than by name")
		Expect(set.Holder()).To(Equal("W1"))
		Expect(set.Namespace()).To(Equal(ns))

		By("each lock's epoch is the one its Lease grants the set's claim of it")
		epochs := set.Epochs()
		Expect(epochs).To(HaveLen(2))
		for _, lock := range []string{"ledger-a", "report-b"} {
			l := set.Lease(lock)
			Expect(l).NotTo(BeNil())
			Expect(l.Lock).To(Equal(lock))
			Expect(epochs[lock]).To(Equal(l.Epoch))
			led := ledgerOf(lock)
			Expect(led.HolderUID).To(Equal(l.UID))
			Expect(led.Epoch).To(Equal(epochs[lock]))
			Expect(h.NamedWith(l.UID)).To(ContainElement(strconv.FormatInt(l.Epoch, 10)))
		}
		Expect(set.Lease("other")).To(BeNil())
		Expect(set.State()).To(Equal(lease.Held))
		Expect(set.Remaining()).To(BeNumerically(">", 20*time.Second))

		By("Release gives them back in reverse order")
		Expect(set.Release(ctx)).To(Succeed())
		Expect(locksOf(rec, lease.Released)).To(Equal([]string{"report-b", "ledger-a"}))
		Expect(set.Done()).To(BeClosed())
		Expect(claims(ns)).To(BeEmpty())
		Expect(set.Release(ctx)).To(Succeed(), "releasing twice is harmless")

		By("again, with a waiter for ledger-a; then someone deletes the set's claim of report-b")
		set, err = holder.AcquireAll(ctx, []string{"report-b", "ledger-a"}, "W1", lease.Options{TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = set.Release(ctx) })
		Expect(set.Epochs()["ledger-a"]).To(BeNumerically(">", epochs["ledger-a"]))
		w2 := waiter(ns, "w2", "ledger-a")
		Eventually(phaseOf(w2), 10*time.Second).Should(Equal(fkv1.PhasePending))
		Consistently(set.Done(), time.Second).ShouldNot(BeClosed())
		ledgerA := set.Lease("ledger-a")
		Expect(admin.Delete(ctx, &fkv1.FencedLease{ObjectMeta: metav1ObjectMeta(ns, set.Lease("report-b").ClaimName)})).To(Succeed())

		By("the set's context ends, its cause naming report-b as lost; ledger-a is still held until the set is released")
		Eventually(set.Done(), 5*time.Second).Should(BeClosed())
		cause := context.Cause(set.Context())
		var le *lease.LockError
		Expect(errors.As(cause, &le)).To(BeTrue(), "%v", cause)
		Expect(le.Lock).To(Equal("report-b"))
		Expect(le.Namespace).To(Equal(ns))
		Expect(errors.Is(cause, lease.ErrLost)).To(BeTrue(), "%v", cause)
		Expect(set.State()).To(Equal(lease.Lost))
		Expect(ledgerA.State()).To(Equal(lease.Held))
		Expect(phaseOf(w2)()).To(Equal(fkv1.PhasePending))

		By("released, the waiter on ledger-a is granted at once (the TTL is 30s), with the next epoch")
		Expect(set.Release(ctx)).To(Succeed())
		released := time.Now()
		Eventually(phaseOf(w2), 5*time.Second).Should(Equal(fkv1.PhaseHeld))
		Expect(time.Since(released)).To(BeNumerically("<", 5*time.Second))
		Expect(ledgerOf("ledger-a").Epoch).To(Equal(ledgerA.Epoch + 1))
		h.Complete()
	})

	It("gives back the locks it took when a later one is not granted by the set's deadline, or one it took is lost while it waits", func() {
		other, _, _ := holderClient(ns)
		hold, err := other.Acquire(ctx, "report-b", "H", lease.Options{TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = hold.Release(ctx) })

		By("W1 asks for ledger-a and report-b with a 2s deadline for both: it gets ledger-a, then times out on report-b")
		w1, _, _ := holderClient(ns)
		start := time.Now()
		set, err := w1.AcquireAll(ctx, []string{"report-b", "ledger-a"}, "W1", lease.Options{TTL: 30 * time.Second, AcquireTimeout: ptr.To(2 * time.Second)})
		took := time.Since(start)
		Expect(set).To(BeNil())
		var le *lease.LockError
		Expect(errors.As(err, &le)).To(BeTrue(), "%v", err)
		Expect(le.Lock).To(Equal("report-b"))
		Expect(le.ReleaseErr).NotTo(HaveOccurred())
		Expect(errors.Is(err, lease.ErrAcquireTimeout)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(HavePrefix(fmt.Sprintf("lock %s/report-b: ", ns)))
		Expect(took).To(BeNumerically(">=", time.Second), "report-b's claim did not wait")
		Expect(took).To(BeNumerically("<", 8*time.Second))
		w1Ledger := h.ClaimsOf("ledger-a", "W1")
		Expect(w1Ledger).To(HaveLen(1))
		Expect(h.NamedWith(w1Ledger[0])).NotTo(BeEmpty(), "W1 never held ledger-a")
		w1Report := h.ClaimsOf("report-b", "W1")
		Expect(w1Report).To(HaveLen(1))
		Expect(*h.Last(w1Report[0]).Spec.AcquireTimeoutSeconds).To(BeNumerically("<=", 2),
			"report-b's claim waited longer than what was left of the set's deadline")
		Eventually(func() []types.UID { return uidsOf(claims(ns)) }, 5*time.Second).Should(Equal([]types.UID{hold.UID}),
			"W1 left a claim behind")
		Eventually(func() bool { return ledgerOf("ledger-a").Held() }, 5*time.Second).Should(BeFalse(), "ledger-a is still held")

		By("TryAcquireAll asks once for each: the same, at once")
		start = time.Now()
		_, err = w1.TryAcquireAll(ctx, []string{"ledger-a", "report-b"}, "W1", lease.Options{TTL: 30 * time.Second})
		Expect(errors.As(err, &le)).To(BeTrue(), "%v", err)
		Expect(le.Lock).To(Equal("report-b"))
		Expect(errors.Is(err, lease.ErrAcquireTimeout)).To(BeTrue(), "%v", err)
		Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))
		Eventually(func() []types.UID { return uidsOf(claims(ns)) }, 5*time.Second).Should(Equal([]types.UID{hold.UID}))

		By("W2 waits for report-b holding ledger-a, with no deadline; its claim of ledger-a is deleted meanwhile")
		w2, _, _ := holderClient(ns)
		type result struct {
			set *lease.Set
			err error
		}
		done := make(chan result, 1)
		go func() {
			defer GinkgoRecover()
			s, err := w2.AcquireAll(ctx, []string{"ledger-a", "report-b"}, "W2", lease.Options{TTL: 30 * time.Second})
			done <- result{s, err}
		}()
		Eventually(func() bool { return everPending("W2", "report-b") }, 10*time.Second).Should(BeTrue())
		w2Ledger := h.ClaimsOf("ledger-a", "W2")
		Expect(w2Ledger).To(HaveLen(1))
		Expect(admin.Delete(ctx, &fkv1.FencedLease{ObjectMeta: metav1ObjectMeta(ns, h.Last(w2Ledger[0]).Name)})).To(Succeed())
		var r result
		Eventually(done, 5*time.Second).Should(Receive(&r), "AcquireAll waited on for report-b with ledger-a lost")
		Expect(r.set).To(BeNil())
		Expect(errors.As(r.err, &le)).To(BeTrue(), "%v", r.err)
		Expect(le.Lock).To(Equal("ledger-a"), "the error names the lock that was lost")
		Expect(errors.Is(r.err, lease.ErrLost)).To(BeTrue(), "%v", r.err)
		Eventually(func() []types.UID { return uidsOf(claims(ns)) }, 5*time.Second).Should(Equal([]types.UID{hold.UID}),
			"W2's claim of report-b stayed in the queue")
		h.Complete()
	})

	It("never deadlocks two callers that name the same locks in opposite orders, round after round", func() {
		const rounds = 5
		x, _, _ := holderClient(ns)
		y, _, _ := holderClient(ns)
		callers := []struct {
			c     *lease.Client
			name  string
			locks []string
		}{{x, "X", []string{"dl-a", "dl-b"}}, {y, "Y", []string{"dl-b", "dl-a"}}}
		hc, _, _ := holderClient(ns)
		var last map[string]int64
		for round := 1; round <= rounds; round++ {
			By(fmt.Sprintf("round %d: H holds dl-a and dl-b; X and Y ask at once, and wait", round))
			// When H lets go of both at once, callers that took locks in
			// the order named would get one each (X dl-a, Y dl-b) and wait
			// for each other for ever.
			var hLeases []*lease.Lease
			for _, lock := range []string{"dl-a", "dl-b"} {
				l, err := hc.Acquire(ctx, lock, fmt.Sprintf("H%d", round), lease.Options{TTL: 60 * time.Second})
				Expect(err).NotTo(HaveOccurred())
				hLeases = append(hLeases, l)
			}
			type held struct {
				who    string
				epochs map[string]int64
				from   time.Time
				to     time.Time
			}
			results := make(chan held, 2)
			errs := make(chan error, 2)
			var mu sync.Mutex
			holds := 0 // how many of the two have held the set this round
			for _, c := range callers {
				holder := fmt.Sprintf("%s%d", c.name, round)
				other := "X"
				if c.name == "X" {
					other = "Y"
				}
				otherHolder := fmt.Sprintf("%s%d", other, round)
				go func() {
					defer GinkgoRecover()
					// A bound: a deadlock fails the spec rather than hanging it.
					wait, cancel := context.WithTimeout(ctx, 20*time.Second)
					defer cancel()
					set, err := c.c.AcquireAll(wait, c.locks, holder, lease.Options{TTL: 10 * time.Second})
					if err != nil {
						errs <- fmt.Errorf("%s: %w", holder, err)
						return
					}
					from := time.Now()
					mu.Lock()
					holds++
					firstToHold := holds == 1
					mu.Unlock()
					// The first to hold the set keeps it until the other
					// waits for it: the calls truly overlap.
					for deadline := time.Now().Add(10 * time.Second); firstToHold && time.Now().Before(deadline) &&
						!everPending(otherHolder, "dl-a") && !everPending(otherHolder, "dl-b"); {
						time.Sleep(20 * time.Millisecond)
					}
					time.Sleep(100 * time.Millisecond)
					results <- held{who: holder, epochs: set.Epochs(), from: from, to: time.Now()}
					errs <- set.Release(ctx)
				}()
			}
			for _, c := range callers {
				who := fmt.Sprintf("%s%d", c.name, round)
				Eventually(func() bool { return everPending(who, "dl-a") || everPending(who, "dl-b") }, 10*time.Second).Should(BeTrue(),
					"round %d: %s does not wait for H", round, who)
			}
			By("H lets go of both; whoever gets the set keeps it until the other waits for it")
			for _, l := range hLeases {
				Expect(l.Release(ctx)).To(Succeed())
			}
			var got []held
			for range 2 {
				var err error
				Eventually(errs, 30*time.Second).Should(Receive(&err), "round %d: a caller neither got both locks nor gave up: deadlock", round)
				Expect(err).NotTo(HaveOccurred(), "round %d: a caller gave up (a deadlock ends at its 20s bound)", round)
			}
			for range 2 {
				var r held
				Expect(results).To(Receive(&r))
				got = append(got, r)
			}
			slices.SortFunc(got, func(a, b held) int { return a.from.Compare(b.from) })
			first, second := got[0], got[1]
			Expect(second.from).To(BeTemporally(">=", first.to), "round %d: both held the locks at once", round)
			Expect(everPending(second.who, "dl-a") || everPending(second.who, "dl-b")).To(BeTrue(),
				"round %d: %s never waited while %s held the locks: the calls did not overlap, the round proves nothing", round, second.who, first.who)
			for _, lock := range []string{"dl-a", "dl-b"} {
				Expect(second.epochs[lock]).To(BeNumerically(">", first.epochs[lock]), "round %d, %s", round, lock)
				if last != nil {
					Expect(first.epochs[lock]).To(BeNumerically(">", last[lock]), "round %d, %s", round, lock)
				}
			}
			last = second.epochs
		}
		h.Complete()
	})
})

func metav1ObjectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}

func uidsOf(cs []fkv1.FencedLease) []types.UID {
	out := make([]types.UID, len(cs))
	for i := range cs {
		out[i] = cs[i].UID
	}
	return out
}

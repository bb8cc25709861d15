package lease_test

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/history"
)

// Bounded waits from the holder's side (docs/design.md §5, "Waiting is
// bounded"): TryAcquire asks once, Options.AcquireTimeout sets the claim's
// acquireTimeoutSeconds, and the authority's decision (a grant or a
// timeout, never both) is what the library reports.
var _ = Describe("Bounded waits", func() {
	var (
		ns string
		h  *history.History
	)
	BeforeEach(func() {
		ns = newNamespace()
		h = history.Record(admin, ns)
	})

	// timedOutClaim checks the claim of holder on lock that the authority
	// ended for its timeout: the Lease recorded the timeout (the library may
	// hear of it there and delete the claim before its status shows reason
	// AcquireTimeout), it was never Held nor named by a Lease, and the
	// library deleted it. It returns the claim's last version seen.
	timedOutClaim := func(lock, holder string) *fkv1.FencedLease {
		uids := h.ClaimsOf(lock, holder)
		ExpectWithOffset(1, uids).To(HaveLen(1), "claims of %s by %s", lock, holder)
		uid := uids[0]
		EventuallyWithOffset(1, func() bool { return h.ListedTimedOut(uid) }, 5*time.Second).Should(BeTrue(),
			"no Lease version recorded the claim's timeout")
		ExpectWithOffset(1, h.EverHeld(uid)).To(BeFalse(), "a timed-out claim was Held")
		ExpectWithOffset(1, h.NamedWith(uid)).To(BeEmpty(), "a Lease named a timed-out claim")
		for _, c := range claims(ns) {
			ExpectWithOffset(1, c.UID).NotTo(Equal(uid), "the library left its timed-out claim %s behind", c.Name)
		}
		return h.Last(uid)
	}

	It("TryAcquire: granted on a free lock, ErrAcquireTimeout at once on a held one (claim gone), and a bounded Acquire ends at its deadline, rounded up", func() {
		w1c, _, _ := holderClient(ns)
		acq, cancel := contextWithTimeout(30 * time.Second)
		defer cancel()

		By("a free lock: granted, and the try-once claim stays Held")
		w1, err := w1c.TryAcquire(acq, "bounded", "W1", lease.Options{TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w1.Release(ctx) })
		Expect(w1.Epoch).To(BeNumerically(">", 0))
		Expect(w1.State()).To(Equal(lease.Held))
		var w1Claim fkv1.FencedLease
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: w1.ClaimName}, &w1Claim)).To(Succeed())
		Expect(w1Claim.Spec.AcquireTimeoutSeconds).To(Equal(ptr.To[int32](0)), "TryAcquire is acquireTimeoutSeconds 0")
		Consistently(func() lease.State { return w1.State() }, 1500*time.Millisecond).Should(Equal(lease.Held),
			"a try-once claim that was granted must not time out")
		Expect(h.EverTimedOut(w1.UID)).To(BeFalse())

		By("a held lock: ErrAcquireTimeout within a few seconds, not ErrExpired, and no claim left")
		w2c, _, _ := holderClient(ns)
		start := time.Now()
		w2, err := w2c.TryAcquire(acq, "bounded", "W2", lease.Options{TTL: 60 * time.Second})
		took := time.Since(start)
		Expect(w2).To(BeNil())
		Expect(err).To(MatchError(lease.ErrAcquireTimeout))
		Expect(errors.Is(err, lease.ErrExpired)).To(BeFalse(), "a claim that never held is not ErrExpired: %v", err)
		Expect(took).To(BeNumerically("<", 5*time.Second), "try-once took %v", took)
		c := timedOutClaim("bounded", "W2")
		Expect(c.Spec.AcquireTimeoutSeconds).To(Equal(ptr.To[int32](0)))
		Expect(claims(ns)).To(HaveLen(1), "only W1's claim is left")
		Expect(w1.State()).To(Equal(lease.Held), "a try-once that failed disturbed the holder")

		By("AcquireTimeout 1.5s behind the holder: acquireTimeoutSeconds 2, ErrAcquireTimeout no earlier than 2s")
		w3c, _, _ := holderClient(ns)
		start = time.Now()
		_, err = w3c.Acquire(acq, "bounded", "W3", lease.Options{TTL: 60 * time.Second, AcquireTimeout: ptr.To(1500 * time.Millisecond)})
		took = time.Since(start)
		Expect(err).To(MatchError(lease.ErrAcquireTimeout))
		Expect(took).To(BeNumerically(">=", 2*time.Second), "ended before its acquireTimeoutSeconds (1.5s rounds up to 2s)")
		Expect(took).To(BeNumerically("<", 10*time.Second), "ended long after its deadline")
		c = timedOutClaim("bounded", "W3")
		Expect(c.Spec.AcquireTimeoutSeconds).To(Equal(ptr.To[int32](2)))
		Expect(c.Status.Epoch).To(BeZero())

		By("released, the lock is free again for a try-once, with the next epoch (no timed-out claim took one)")
		Expect(w1.Release(ctx)).To(Succeed())
		w4c, _, _ := holderClient(ns)
		w4, err := w4c.TryAcquire(acq, "bounded", "W4", lease.Options{TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w4.Release(ctx) })
		Expect(w4.Epoch).To(Equal(w1.Epoch + 1))
		h.Complete()
	})

	It("keeps request-ID idempotence: a lost create reply finds the try-once claim; another deadline under the same ID is refused", func() {
		w1c, f, _ := holderClient(ns)
		f.set(func(f *faults) { f.dropReply = []rule{{method: http.MethodPost, path: "/fencedleases", times: 1}} })
		acq, cancel := contextWithTimeout(30 * time.Second)
		defer cancel()
		w1, err := w1c.TryAcquire(acq, "idem", "W1", lease.Options{RequestID: "r1", TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred(), "the retried create found its claim and was granted")
		DeferCleanup(func() { _ = w1.Release(ctx) })
		Expect(claims(ns)).To(HaveLen(1))
		Expect(w1.ClaimName).To(Equal(lease.ClaimName("idem", "W1", "r1")))

		By("the same lock, holder and request ID with another deadline: a clear error, the claim untouched")
		again, _, _ := holderClient(ns)
		for _, d := range []*time.Duration{nil, ptr.To(5 * time.Second)} {
			_, err = again.Acquire(acq, "idem", "W1", lease.Options{RequestID: "r1", TTL: 60 * time.Second, AcquireTimeout: d})
			Expect(err).To(MatchError(ContainSubstring("exists with acquireTimeoutSeconds 0, not")))
			Expect(err).To(MatchError(ContainSubstring("the field is immutable")))
		}
		Expect(claims(ns)).To(HaveLen(1))
		Expect(w1.State()).To(Equal(lease.Held))
		h.Complete()
	})

	It("reports what the authority decided when the release races the deadline: a grant as a grant, a timeout as ErrAcquireTimeout, never both", func() {
		// The holder releases well before, near and well after the
		// waiter's 1 s deadline: both outcomes occur, and each is reported
		// as the authority's records show it.
		offsets := []time.Duration{200 * time.Millisecond, 900 * time.Millisecond, time.Second, 1100 * time.Millisecond, 2500 * time.Millisecond}
		granted, timedOut := 0, 0
		for i, offset := range offsets {
			lock := fmt.Sprintf("race-%d", i)
			hc, _, _ := holderClient(ns)
			acq, cancel := contextWithTimeout(30 * time.Second)
			holder, err := hc.Acquire(acq, lock, "H", lease.Options{TTL: 60 * time.Second})
			Expect(err).NotTo(HaveOccurred())

			wc, _, _ := holderClient(ns)
			var (
				w    *lease.Lease
				werr error
				wg   sync.WaitGroup
			)
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				w, werr = wc.Acquire(acq, lock, "W", lease.Options{TTL: 60 * time.Second, AcquireTimeout: ptr.To(time.Second)})
			}()
			Eventually(func() []types.UID { return h.ClaimsOf(lock, "W") }, 10*time.Second, 10*time.Millisecond).Should(HaveLen(1))
			time.Sleep(offset)
			Expect(holder.Release(ctx)).To(Succeed())
			wg.Wait()
			cancel()
			uid := h.ClaimsOf(lock, "W")[0]
			GinkgoWriter.Printf("release %v after the waiter queued: granted %v, error %v\n", offset, werr == nil, werr)
			if werr == nil {
				granted++
				Expect(w.UID).To(Equal(uid))
				Eventually(func() []string { return h.NamedWith(uid) }, 5*time.Second).Should(ContainElement(strconv.FormatInt(w.Epoch, 10)),
					"reported a grant that no Lease version shows")
				Consistently(func() bool { return h.EverTimedOut(uid) }, 1500*time.Millisecond).Should(BeFalse(), "granted and timed out")
				Expect(w.State()).To(Equal(lease.Held))
				Expect(w.Release(ctx)).To(Succeed())
			} else {
				timedOut++
				Expect(werr).To(MatchError(lease.ErrAcquireTimeout), "release %v after the waiter queued", offset)
				timedOutClaim(lock, "W")
			}
		}
		h.Complete()
		Expect(granted).To(BeNumerically(">", 0), "no release came before a deadline")
		Expect(timedOut).To(BeNumerically(">", 0), "no deadline came before a release")
	})
})

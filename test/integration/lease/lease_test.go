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
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// recorder keeps the transitions a lease reports.
type recorder struct {
	mu  sync.Mutex
	got []lease.Transition
}

func (r *recorder) record(t lease.Transition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, t)
}

func (r *recorder) states() []lease.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []lease.State
	for _, t := range r.got {
		out = append(out, t.To)
	}
	return out
}

func claims(ns string) []fkv1.FencedLease {
	var list fkv1.FencedLeaseList
	ExpectWithOffset(1, admin.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	return list.Items
}

func waiter(ns, name, lock string) *fkv1.FencedLease {
	c := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(int32(300))}}
	ExpectWithOffset(1, admin.Create(ctx, c)).To(Succeed())
	return c
}

func phaseOf(c *fkv1.FencedLease) func() fkv1.FencedLeasePhase {
	return func() fkv1.FencedLeasePhase {
		var got fkv1.FencedLease
		if err := admin.Get(ctx, client.ObjectKeyFromObject(c), &got); err != nil {
			return ""
		}
		return got.Status.Phase
	}
}

var _ = Describe("Holder library", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("retries an acquisition whose reply was lost with the same request ID: one claim, one epoch", func() {
		holder, f, _ := holderClient(ns)
		f.set(func(f *faults) { f.dropReply = []rule{{method: http.MethodPost, path: "/fencedleases", times: 1}} })
		l, err := holder.Acquire(ctx, "report-2026-07", "W1", lease.Options{RequestID: "request-81", TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		Expect(l.Epoch).To(BeNumerically(">", 0))
		Expect(claims(ns)).To(HaveLen(1))

		By("calling Acquire again with the same request ID finds the same claim")
		again, err := holder.Acquire(ctx, "report-2026-07", "W1", lease.Options{RequestID: "request-81", TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		Expect(again.UID).To(Equal(l.UID))
		Expect(again.Epoch).To(Equal(l.Epoch))
		Expect(claims(ns)).To(HaveLen(1))
		Expect(l.Release(ctx)).To(Succeed())
		Expect(again.Release(ctx)).To(Succeed(), "releasing twice is harmless")
	})

	It("never lets a delayed old release delete the claim the holder acquired again", func() {
		holder, f, _ := holderClient(ns)
		first, err := holder.Acquire(ctx, "report", "W1", lease.Options{RequestID: "r1", TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		f.set(func(f *faults) { f.capture = []rule{{method: http.MethodDelete, path: "/fencedleases", times: 1}} })
		Expect(first.Release(ctx)).To(Succeed())

		second, err := holder.Acquire(ctx, "report", "W1", lease.Options{RequestID: "r1", TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		Expect(second.ClaimName).To(Equal(first.ClaimName), "same request ID, same claim name")
		Expect(second.UID).NotTo(Equal(first.UID))
		Expect(second.Epoch).To(Equal(first.Epoch + 1))

		By("the old release arrives late")
		Expect(f.captured).To(HaveLen(1))
		code, body := f.replay(f.captured[0])
		Expect(code).To(Equal(http.StatusConflict), body)
		Expect(body).To(ContainSubstring("the UID in the precondition"))
		By("and so does a repeated Release of the old lease")
		Expect(first.Release(ctx)).To(Succeed())
		Consistently(func() lease.State { return second.State() }, time.Second).Should(Equal(lease.Held))
		Expect(claims(ns)).To(HaveLen(1))
		Expect(claims(ns)[0].UID).To(Equal(second.UID))
		Expect(second.Release(ctx)).To(Succeed())
	})

	It("goes SUSPECT then LOST when renewal replies are lost, and the server then refuses its write", func() {
		holder, f, hc := holderClient(ns)
		rec := &recorder{}
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 3 * time.Second, RenewInterval: time.Second,
			SuspectMargin: 1500 * time.Millisecond, OnTransition: rec.record})
		Expect(err).NotTo(HaveOccurred())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report"}, Data: map[string]string{"v": "v11 by W1"}}
		Expect(w1.Create(ctx, hc, cm)).To(Succeed())
		w2 := waiter(ns, "w2", "report")

		By("losing every renewal reply; the work goroutine keeps running regardless")
		f.set(func(f *faults) { f.dropReply = []rule{{method: http.MethodPut, path: "/leases/"}} })
		var workErr error
		workDone := make(chan struct{})
		go func() {
			defer close(workDone)
			// The work never looks at the lease; it only stamps its epoch.
			time.Sleep(9 * time.Second)
			var cur corev1.ConfigMap
			Expect(hc.Get(ctx, client.ObjectKeyFromObject(cm), &cur)).To(Succeed())
			cur.Data = map[string]string{"v": "late v11 by W1"}
			workErr = w1.Update(ctx, hc, &cur)
		}()
		Eventually(w1.State, 5*time.Second, 50*time.Millisecond).Should(Equal(lease.Suspect))
		Eventually(w1.State, 5*time.Second, 50*time.Millisecond).Should(Equal(lease.Lost))
		// State reads LOST from the clock as soon as the safe time is gone;
		// the loss timer's transition (the context cancelled, then the
		// callback) follows at once, not in the same instant.
		Eventually(w1.Done(), 2*time.Second).Should(BeClosed(), "the lease's context is cancelled on loss")
		Eventually(rec.states, 2*time.Second).Should(Equal([]lease.State{lease.Acquiring, lease.Held, lease.Suspect, lease.Lost}))

		By("W1 stopped renewing once LOST, so the authority expires it and grants W2")
		Eventually(phaseOf(w2), 15*time.Second).Should(Equal(fkv1.PhaseHeld))
		<-workDone
		Expect(workErr).To(HaveOccurred())
		Expect(errors.Is(workErr, lease.ErrStaleEpoch)).To(BeTrue(), "%v", workErr)
		var final corev1.ConfigMap
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(cm), &final)).To(Succeed())
		Expect(final.Data["v"]).To(Equal("v11 by W1"))
	})

	It("leaves no claim behind when the first renewal after the grant fails", func() {
		holder, f, _ := holderClient(ns)
		f.set(func(f *faults) { f.block = []rule{{method: http.MethodPut, path: "/leases/"}} })
		_, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 30 * time.Second, RequestID: "first-renewal"})
		Expect(err).To(HaveOccurred())
		Expect(errors.Is(err, lease.ErrLost)).To(BeTrue(), "%v", err)
		Eventually(func() []fkv1.FencedLease { return claims(ns) }, 10*time.Second).Should(BeEmpty(), "the granted claim was left behind")
	})

	It("reports LOST on its own clock when renewals hang, never after the authority's next grant", func() {
		holder, f, _ := holderClient(ns)
		lost := make(chan time.Time, 1)
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 3 * time.Second, RenewInterval: time.Second,
			RequestTimeout: time.Minute, OnTransition: func(t lease.Transition) {
				if t.To == lease.Lost {
					lost <- time.Now()
				}
			}})
		Expect(err).NotTo(HaveOccurred())
		w2 := waiter(ns, "w2", "report")

		By("every renewal and read of the Lease hangs until its context ends (RequestTimeout is a minute)")
		f.set(func(f *faults) { f.hang = []rule{{path: "/leases/"}} })
		safeUntil := time.Now().Add(w1.Remaining())
		var lostAt time.Time
		Eventually(lost, 10*time.Second).Should(Receive(&lostAt))
		Expect(lostAt).To(BeTemporally("<", safeUntil.Add(500*time.Millisecond)), "LOST came %v after the safe time ran out", lostAt.Sub(safeUntil))
		Expect(w1.Context().Err()).To(HaveOccurred())

		By("the authority grants W2 only after W1 knew it had lost")
		Eventually(phaseOf(w2), 15*time.Second).Should(Equal(fkv1.PhaseHeld))
		var ledger coordinationv1.Lease
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &ledger)).To(Succeed())
		Expect(ledger.Spec.AcquireTime).NotTo(BeNil())
		// The manager runs in this process: its clock is ours.
		Expect(ledger.Spec.AcquireTime.Time).To(BeTemporally(">=", lostAt), "granted before the holder reported LOST")
	})

	It("has its writes refused once the lease passes on, when cut off from the Lease but not from the object", func() {
		holder, f, hc := holderClient(ns)
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report"}, Data: map[string]string{"v": "v11 by W1"}}
		Expect(w1.Create(ctx, hc, cm)).To(Succeed())
		w2 := waiter(ns, "w2", "report")

		f.set(func(f *faults) { f.block = []rule{{path: "/leases/"}} })
		Eventually(w1.State, 5*time.Second, 50*time.Millisecond).Should(Equal(lease.Lost))
		Eventually(phaseOf(w2), 10*time.Second).Should(Equal(fkv1.PhaseHeld))

		By("W1 still reaches the ConfigMap, and is refused")
		var cur corev1.ConfigMap
		Expect(hc.Get(ctx, client.ObjectKeyFromObject(cm), &cur)).To(Succeed())
		cur.Data = map[string]string{"v": "late v11 by W1"}
		err = w1.Update(ctx, hc, &cur)
		Expect(errors.Is(err, lease.ErrStaleEpoch)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("it is not the lock's current epoch (current holder w2, epoch %d)", w1.Epoch+1)))
	})

	It("leaves the queue cleanly when the caller's deadline passes", func() {
		holder, _, _ := holderClient(ns)
		w1, err := holder.Acquire(ctx, "busy", "W1", lease.Options{TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(w1.Release(ctx)).To(Succeed()) })
		short, cancel := contextWithTimeout(time.Second)
		defer cancel()
		_, err = holder.Acquire(short, "busy", "W2", lease.Options{TTL: 30 * time.Second})
		Expect(err).To(MatchError(ContainSubstring("context deadline exceeded")))
		Eventually(func() int { return len(claims(ns)) }, 5*time.Second).Should(Equal(1))
		Expect(claims(ns)[0].UID).To(Equal(w1.UID))
	})

	It("leaves no claim behind when the caller gives up while its create is in flight but committed", func() {
		holder, f, _ := holderClient(ns)
		f.set(func(f *faults) { f.lateReply = []rule{{method: http.MethodPost, path: "/fencedleases", times: 1}} })
		short, cancel := contextWithTimeout(time.Second)
		defer cancel()
		_, err := holder.Acquire(short, "in-flight", "W1", lease.Options{TTL: 30 * time.Second})
		Expect(err).To(MatchError(ContainSubstring("context deadline exceeded")))
		Eventually(func() int { return len(claims(ns)) }, 5*time.Second).Should(Equal(0), "the committed claim stayed in the queue")
	})

	It("is released by deleting the exact claim, and reports LOST when someone else deletes it", func() {
		holder, _, _ := holderClient(ns)
		rec := &recorder{}
		l, err := holder.Acquire(ctx, "r", "W1", lease.Options{TTL: 30 * time.Second, OnTransition: rec.record})
		Expect(err).NotTo(HaveOccurred())
		Expect(admin.Delete(ctx, &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: l.ClaimName}})).To(Succeed())
		Eventually(l.State, 5*time.Second).Should(Equal(lease.Lost))
		Eventually(l.Done()).Should(BeClosed())

		l2, err := holder.Acquire(ctx, "r", "W1", lease.Options{TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		Expect(l2.Release(ctx)).To(Succeed())
		Expect(l2.State()).To(Equal(lease.Released))
		Expect(claims(ns)).To(BeEmpty())
	})

	It("never renews a Lease that names another claim, even before its claim watch reports the loss", func() {
		holder, f, _ := holderClient(ns)
		// Every claim watch this client opens from now on can be held back.
		f.set(func(f *faults) { f.holdWatchPath = "/fencedleases" })
		rec := &recorder{}
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 30 * time.Second, RenewInterval: 300 * time.Millisecond, OnTransition: rec.record})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w1.Release(ctx) })
		w2 := waiter(ns, "w2", "report")

		By("W1's claim watch stalls: whatever happens to its claim, W1 hears it only from the Lease")
		hold := make(chan struct{})
		f.set(func(f *faults) { f.holdWatch = hold })
		DeferCleanup(func() { close(hold) })

		By("an admin deletes W1's claim; the authority grants W2 while W1 is healthy and renewing")
		Expect(admin.Delete(ctx, &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: w1.ClaimName}})).To(Succeed())
		Eventually(phaseOf(w2), 10*time.Second).Should(Equal(fkv1.PhaseHeld))
		var granted coordinationv1.Lease
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &granted)).To(Succeed())
		Expect(fkv1.ReadLedger(&granted, "report").HolderUID).To(Equal(w2.UID))

		By("W1's next renewal finds W2's claim on the Lease: W1 is LOST and W2's Lease is not renewed by W1")
		Eventually(w1.State, 5*time.Second, 50*time.Millisecond).Should(Equal(lease.Lost))
		// The callback runs just after the state changes.
		var last lease.Transition
		Eventually(func() lease.State {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			last = rec.got[len(rec.got)-1]
			return last.To
		}, 2*time.Second).Should(Equal(lease.Lost))
		Expect(last.Reason).To(ContainSubstring("not ours"), "LOST must come from the renewal's check, not the stalled claim watch")
		var after coordinationv1.Lease
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &after)).To(Succeed())
		Expect(after.Spec.RenewTime).To(Equal(granted.Spec.RenewTime), "someone renewed W2's Lease (nothing renews W2)")
	})

	It("goes LOST and stops renewing when the Lease's epoch moves under its claim, the claim UID unchanged", func() {
		// A grant is the pair (claim UID, epoch): a Lease that names this
		// claim with another epoch no longer shows this holder's grant.
		holder, _, _ := holderClient(ns)
		rec := &recorder{}
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 30 * time.Second, RenewInterval: 300 * time.Millisecond, OnTransition: rec.record})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w1.Release(ctx) })

		By("the authority stops, so that nothing but W1's own renewal can notice (its claim stays Held)")
		stopManager()

		By("the manager's identity (the only one the lease guard lets) moves the epoch while the Lease still names W1's claim")
		asManager := managerClient()
		var moved coordinationv1.Lease
		Eventually(func() error {
			if err := asManager.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &moved); err != nil {
				return err
			}
			moved.Annotations[fkv1.AnnotationEpoch] = strconv.FormatInt(w1.Epoch+1, 10)
			return asManager.Update(ctx, &moved) // a Conflict with a renewal: read again
		}, 5*time.Second, 10*time.Millisecond).Should(Succeed())

		Eventually(w1.State, 5*time.Second, 50*time.Millisecond).Should(Equal(lease.Lost))
		Eventually(w1.Done(), 2*time.Second).Should(BeClosed(), "the lease's context is cancelled on loss")
		var last lease.Transition
		Eventually(func() lease.State {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			last = rec.got[len(rec.got)-1]
			return last.To
		}, 2*time.Second).Should(Equal(lease.Lost))
		Expect(last.Reason).To(ContainSubstring(fmt.Sprintf("not the epoch %d we were granted", w1.Epoch)))

		By("W1 renews no more: the Lease stays as the move left it")
		Consistently(func() string {
			var cur coordinationv1.Lease
			Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &cur)).To(Succeed())
			Expect(fkv1.ReadLedger(&cur, "report").HolderUID).To(Equal(w1.UID), "the Lease still names W1's claim")
			return cur.ResourceVersion
		}, 2*time.Second, 100*time.Millisecond).Should(Equal(moved.ResourceVersion), "someone (W1) wrote the Lease after its epoch moved")
	})

	It("stamps the lock label and epoch on typed and unstructured objects", func() {
		cm := &corev1.ConfigMap{}
		lease.Stamp(cm, "report-2026-07", 42)
		Expect(cm.Labels).To(HaveKeyWithValue(fkv1.LabelLock, "report-2026-07"))
		Expect(cm.Annotations).To(HaveKeyWithValue(fkv1.AnnotationEpoch, "42"))
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetAnnotations(map[string]string{"keep": "me"})
		lease.Stamp(u, "report-2026-07", 43)
		Expect(u.GetAnnotations()).To(Equal(map[string]string{"keep": "me", fkv1.AnnotationEpoch: "43"}))
	})

	It("rejects bad input before touching the API", func() {
		holder, _, _ := holderClient(ns)
		_, err := holder.Acquire(ctx, "Bad_Lock", "W1", lease.Options{})
		Expect(err).To(MatchError(ContainSubstring("invalid lock name")))
		_, err = holder.Acquire(ctx, "ok", "", lease.Options{})
		Expect(err).To(MatchError(ContainSubstring("invalid holder")))
		_, err = holder.Acquire(ctx, "ok", "W1", lease.Options{TTL: 1500 * time.Millisecond})
		Expect(err).To(MatchError(ContainSubstring("whole seconds")))
		Expect(claims(ns)).To(BeEmpty())
	})
})

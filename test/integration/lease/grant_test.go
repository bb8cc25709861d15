package lease_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// statusWrites sits between the manager and the apiserver and holds back
// its writes of claim statuses in one namespace that show a claim Held:
// refused while refuse is set, delayed by delay otherwise.
type statusWrites struct {
	next    http.RoundTripper
	ns      string
	refuse  atomic.Bool
	delay   time.Duration
	touched atomic.Int32 // writes it refused or delayed
}

func (s *statusWrites) RoundTrip(req *http.Request) (*http.Response, error) {
	if (req.Method != http.MethodPatch && req.Method != http.MethodPut) || req.Body == nil ||
		!strings.Contains(req.URL.Path, "/namespaces/"+s.ns+"/fencedleases/") || !strings.HasSuffix(req.URL.Path, "/status") {
		return s.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	if !bytes.Contains(body, []byte(`"phase":"Held"`)) {
		return s.next.RoundTrip(req)
	}
	s.touched.Add(1)
	if s.refuse.Load() {
		return nil, errors.New("injected: the manager's write of a Held status was refused")
	}
	select {
	case <-time.After(s.delay):
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return s.next.RoundTrip(req)
}

// stopManager stops the suite's manager (the authority) for the rest of
// the spec.
func stopManager() {
	ExpectWithOffset(1, mgr.Stop()).To(Succeed())
	DeferCleanup(func() {
		var err error
		mgr, err = env.StartManager()
		Expect(err).NotTo(HaveOccurred())
	})
}

// managerClient is a client with the manager's identity (the only one the
// lease guard lets write a Lease or a claim's status).
func managerClient() client.Client {
	c, err := client.New(env.Manager, client.Options{Scheme: lease.Scheme()})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return c
}

// withManagerTransport replaces the suite's manager, for the rest of the
// spec, with one whose requests pass through wrap.
func withManagerTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	stopManager()
	wrapped, err := envtestutil.StartManager(env.Manager, envtestutil.ManagerOptions{Webhook: &env.Env.WebhookInstallOptions, WrapTransport: wrap})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	DeferCleanup(wrapped.Stop) // before the suite's manager starts again
}

// leaseWatches counts the watches of one lock's Lease by name (field
// selector metadata.name=<lock>) its client has open.
type leaseWatches struct {
	next       http.RoundTripper
	ns, lock   string
	open, peak atomic.Int32
	started    atomic.Int32
}

func (w *leaseWatches) matches(req *http.Request) bool {
	q := req.URL.Query()
	return q.Get("watch") == "true" && strings.HasSuffix(req.URL.Path, "/namespaces/"+w.ns+"/leases") &&
		q.Get("fieldSelector") == "metadata.name="+w.lock
}

func (w *leaseWatches) RoundTrip(req *http.Request) (*http.Response, error) {
	if !w.matches(req) {
		return w.next.RoundTrip(req)
	}
	w.started.Add(1)
	n := w.open.Add(1)
	for p := w.peak.Load(); n > p && !w.peak.CompareAndSwap(p, n); p = w.peak.Load() {
	}
	resp, err := w.next.RoundTrip(req)
	if err != nil {
		w.open.Add(-1)
		return nil, err
	}
	resp.Body = &countedBody{ReadCloser: resp.Body, done: func() { w.open.Add(-1) }}
	return resp, nil
}

type countedBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *countedBody) Close() error {
	b.once.Do(b.done)
	return b.ReadCloser.Close()
}

// countingClient is a holder client in ns whose watches of lock's Lease
// are counted, with no client-side rate limit (hundreds of holders share it).
func countingClient(ns, lock string) (*lease.Client, *leaseWatches) {
	w := &leaseWatches{ns: ns, lock: lock}
	cfg := rest.CopyConfig(env.Admin)
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { w.next = rt; return w }
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return lease.NewClientFrom(c, ns).WithLogger(logf.Log.WithName("holder")), w
}

// requestCounts counts a client's requests in one namespace by verb
// (WATCH for a watch) and resource (the path's last segment, subresource
// included: "fencedleases/status").
type requestCounts struct {
	next http.RoundTripper
	ns   string
	mu   sync.Mutex
	n    map[string]int
}

func (r *requestCounts) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, rest, ok := strings.Cut(req.URL.Path, "/namespaces/"+r.ns+"/"); ok {
		verb := req.Method
		if req.URL.Query().Get("watch") == "true" {
			verb = "WATCH"
		}
		parts := strings.Split(rest, "/")
		resource := parts[0]
		if len(parts) == 3 {
			resource += "/" + parts[2]
		}
		r.mu.Lock()
		r.n[verb+" "+resource]++
		r.mu.Unlock()
	}
	return r.next.RoundTrip(req)
}

// counts is a copy of the counts so far.
func (r *requestCounts) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// apiserverLeaseWatches is the number of Lease watches kube-apiserver is
// serving (apiserver_longrunning_requests, all scopes).
func apiserverLeaseWatches() float64 {
	hc, err := rest.HTTPClientFor(env.Admin)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	resp, err := hc.Get(strings.TrimSuffix(env.Admin.Host, "/") + "/metrics")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	sum, found := 0.0, false
	for _, line := range strings.Split(string(b), "\n") {
		labels, ok := strings.CutPrefix(line, "apiserver_longrunning_requests{")
		if !ok || !strings.Contains(labels, `resource="leases"`) || !strings.Contains(labels, `verb="WATCH"`) {
			continue
		}
		_, val, _ := strings.Cut(labels, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		ExpectWithOffset(1, err).NotTo(HaveOccurred())
		sum, found = sum+v, true
	}
	ExpectWithOffset(1, found).To(BeTrue(), "kube-apiserver reports no Lease watches in apiserver_longrunning_requests")
	return sum
}

// acquireW1 acquires lock "report" as W1 in the background (TTL 60 s),
// recording its transitions in rec; the Lease comes on the channel.
func acquireW1(holder *lease.Client, rec *recorder) <-chan *lease.Lease {
	got := make(chan *lease.Lease, 1)
	go func() {
		defer GinkgoRecover()
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 60 * time.Second, OnTransition: rec.record})
		Expect(err).NotTo(HaveOccurred())
		got <- w1
	}()
	return got
}

// handOver releases w0 and returns the waiter's Lease from got, granted
// as rec shows, seen first on source ("lease" or "claim"); released when
// the spec ends.
func handOver(w0 *lease.Lease, got <-chan *lease.Lease, rec *recorder, source string) *lease.Lease {
	ExpectWithOffset(1, w0.Release(ctx)).To(Succeed())
	var w1 *lease.Lease
	EventuallyWithOffset(1, got, 10*time.Second).Should(Receive(&w1))
	DeferCleanup(func() { _ = w1.Release(ctx) })
	ExpectWithOffset(1, rec.grantReason()).To(ContainSubstring("seen first on the " + source))
	return w1
}

// reasonOf is the reason of the Held condition of holder's claim in ns
// ("" without a claim or a condition).
func reasonOf(ns, holder string) string {
	for _, c := range claims(ns) {
		if c.Spec.HolderIdentity == holder {
			return heldReason(&c)
		}
	}
	return ""
}

// heldReason is the reason of a claim's Held condition ("" without one).
func heldReason(c *fkv1.FencedLease) string {
	if h := meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld); h != nil {
		return h.Reason
	}
	return ""
}

// reasonTo is the reason of rec's first transition to state ("" if none).
func (r *recorder) reasonTo(state lease.State) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.got {
		if t.To == state {
			return t.Reason
		}
	}
	return ""
}

// grantReason is the reason of the transition that made rec's lease HELD.
func (r *recorder) grantReason() string { return r.reasonTo(lease.Held) }

// lostReason is the reason of rec's transition to LOST ("" if none).
func (r *recorder) lostReason() string { return r.reasonTo(lease.Lost) }

func ledgerOf(ns, lock string) (*coordinationv1.Lease, fkv1.Ledger) {
	var l coordinationv1.Lease
	ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &l)).To(Succeed())
	return &l, fkv1.ReadLedger(&l, lock)
}

var _ = Describe("How a holder learns of its grant and its loss", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	// acquireRenewingLate acquires lock "report" as W1 with its next
	// renewal far off (50s into a 60s TTL), recording its transitions, and
	// releases it when the spec ends.
	acquireRenewingLate := func(holder *lease.Client) (*lease.Lease, *recorder) {
		rec := &recorder{}
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 60 * time.Second, RenewInterval: 50 * time.Second, OnTransition: rec.record})
		ExpectWithOffset(1, err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w1.Release(ctx) })
		return w1, rec
	}

	It("takes its grant from the lock's Lease while the claim's Held status cannot be written, and writes with it", func() {
		sw := &statusWrites{ns: ns}
		sw.refuse.Store(true)
		withManagerTransport(func(rt http.RoundTripper) http.RoundTripper { sw.next = rt; return sw })

		holder, _, hc := holderClient(ns)
		rec := &recorder{}
		acq, cancel := contextWithTimeout(20 * time.Second)
		defer cancel()
		w1, err := holder.Acquire(acq, "report", "W1", lease.Options{TTL: 30 * time.Second, OnTransition: rec.record})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w1.Release(ctx) })
		Expect(sw.touched.Load()).To(BeNumerically(">", 0), "the manager never tried to show the claim Held")
		Expect(rec.grantReason()).To(ContainSubstring("seen first on the lease"))

		By("the claim does not show the grant; the Lease does, with the epoch the holder has")
		var claim fkv1.FencedLease
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: w1.ClaimName}, &claim)).To(Succeed())
		Expect(claim.Status.Phase).NotTo(Equal(fkv1.PhaseHeld))
		Expect(claim.Status.Epoch).To(BeZero())
		_, led := ledgerOf(ns, "report")
		Expect(led.HolderUID).To(Equal(w1.UID))
		Expect(led.EpochValid).To(BeTrue())
		Expect(w1.Epoch).To(Equal(led.Epoch))

		By("a write fenced with that epoch is accepted")
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report"}, Data: map[string]string{"v": "v11 by W1"}}
		Expect(w1.Create(ctx, hc, cm)).To(Succeed())
		cm.Data["v"] = "v12 by W1"
		Expect(w1.Update(ctx, hc, cm)).To(Succeed())
		Expect(w1.State()).To(Equal(lease.Held))

		By("once the status can be written it shows the same epoch, and the holder keeps its lease")
		sw.refuse.Store(false)
		Eventually(func() int64 {
			var cur fkv1.FencedLease
			Expect(admin.Get(ctx, client.ObjectKeyFromObject(&claim), &cur)).To(Succeed())
			if cur.Status.Phase != fkv1.PhaseHeld {
				return 0
			}
			return cur.Status.Epoch
		}, 30*time.Second, 50*time.Millisecond).Should(Equal(w1.Epoch))
		Consistently(w1.State, 2*time.Second, 100*time.Millisecond).Should(Equal(lease.Held))
	})

	It("never takes a Lease that names another claim as its grant", func() {
		holder, _, _ := holderClient(ns)
		w1, err := holder.Acquire(ctx, "report", "W1", lease.Options{TTL: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w1.Release(ctx) })

		// W2 watches the Lease from the start (it may be next): the Lease
		// it sees names W1's claim, with an epoch.
		short, cancel := contextWithTimeout(3 * time.Second)
		defer cancel()
		w2, err := holder.Acquire(short, "report", "W2", lease.Options{TTL: 30 * time.Second})
		Expect(err).To(MatchError(context.DeadlineExceeded), "W2 acquired a lock W1 holds (epoch %d)", func() int64 {
			if w2 != nil {
				return w2.Epoch
			}
			return 0
		}())
		Eventually(func() int { return len(claims(ns)) }, 5*time.Second).Should(Equal(1))
		Expect(w1.State()).To(Equal(lease.Held))
	})

	It("goes LOST as soon as the Lease passes to another claim, long before its next renewal", func() {
		holder, f, _ := holderClient(ns)
		f.set(func(f *faults) { f.holdWatchPath = "/fencedleases" })
		w1, rec := acquireRenewingLate(holder)
		w2 := waiter(ns, "w2", "report")
		Eventually(phaseOf(w2), 10*time.Second).Should(Equal(fkv1.PhasePending))

		By("W1's claim watch stalls, so only the Lease can tell it")
		hold := make(chan struct{})
		f.set(func(f *faults) { f.holdWatch = hold })
		DeferCleanup(func() { close(hold) })

		By("an operator breaks W1's hold (kubectl fence break) and the authority grants W2")
		broke := time.Now()
		Expect(admin.Patch(ctx, &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: w1.ClaimName}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+fkv1.AnnotationBreakReason+`":"W1 hung"}}}`)))).To(Succeed())
		Eventually(w1.Done(), 5*time.Second).Should(BeClosed())
		lostAfter := time.Since(broke)
		Expect(w1.State()).To(Equal(lease.Lost))
		Eventually(rec.lostReason, 2*time.Second).Should(ContainSubstring("not ours"))
		Expect(lostAfter).To(BeNumerically("<", 5*time.Second), "the next renewal was due %v after the grant", 50*time.Second)
		Eventually(phaseOf(w2), 10*time.Second).Should(Equal(fkv1.PhaseHeld))
		_, led := ledgerOf(ns, "report")
		Expect(led.HolderUID).To(Equal(w2.UID))
		GinkgoWriter.Printf("W1 LOST %v after the break\n", lostAfter)
	})

	It("goes LOST as soon as the Lease names its claim with another epoch, long before its next renewal", func() {
		holder, f, _ := holderClient(ns)
		f.set(func(f *faults) { f.holdWatchPath = "/fencedleases" })
		w1, rec := acquireRenewingLate(holder)
		hold := make(chan struct{})
		f.set(func(f *faults) { f.holdWatch = hold })
		DeferCleanup(func() { close(hold) })

		By("with the authority stopped, the manager's identity moves the epoch; the Lease still names W1's claim")
		stopManager()
		asManager := managerClient()
		var moved coordinationv1.Lease
		Expect(asManager.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &moved)).To(Succeed())
		moved.Annotations[fkv1.AnnotationEpoch] = strconv.FormatInt(w1.Epoch+1, 10)
		at := time.Now()
		Expect(asManager.Update(ctx, &moved)).To(Succeed())

		Eventually(w1.Done(), 5*time.Second).Should(BeClosed())
		Expect(time.Since(at)).To(BeNumerically("<", 5*time.Second))
		Eventually(rec.lostReason, 2*time.Second).Should(ContainSubstring(fmt.Sprintf("not the epoch %d we were granted", w1.Epoch)))
	})

	It("goes LOST when its claim's status shows another epoch than the Lease showed it", func() {
		holder, _, _ := holderClient(ns)
		w1, rec := acquireRenewingLate(holder)
		Eventually(func() int64 {
			var c fkv1.FencedLease
			Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: w1.ClaimName}, &c)).To(Succeed())
			return c.Status.Epoch
		}, 10*time.Second).Should(Equal(w1.Epoch))

		By("with the authority stopped, the manager's identity writes another epoch into the claim's status")
		stopManager()
		asManager := managerClient()
		var c fkv1.FencedLease
		Expect(asManager.Get(ctx, client.ObjectKey{Namespace: ns, Name: w1.ClaimName}, &c)).To(Succeed())
		c.Status.Epoch = w1.Epoch + 1
		Expect(asManager.Status().Update(ctx, &c)).To(Succeed())

		Eventually(w1.Done(), 5*time.Second).Should(BeClosed())
		Eventually(rec.lostReason, 2*time.Second).Should(ContainSubstring("the grant's records disagree"))
	})

	It("goes on with the watches it waited with once granted: no read of its claim and no new watch of it", func() {
		rc := &requestCounts{ns: ns, n: map[string]int{}}
		cfg := rest.CopyConfig(env.Admin)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { rc.next = rt; return rc }
		c, err := client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		holder := lease.NewClientFrom(c, ns).WithLogger(logf.Log.WithName("holder"))

		// A holder that waits behind W0 is told by the Lease (it is the
		// head waiter); one on a free lock by whichever record it sees first.
		w0, err := holder.Acquire(ctx, "report", "W0", lease.Options{TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		rec := &recorder{}
		got := acquireW1(holder, rec)
		Eventually(func() string { return reasonOf(ns, "W1") }, 10*time.Second).Should(Equal(fkv1.ReasonNext))
		before := rc.counts()
		w1 := handOver(w0, got, rec, "lease")

		By("from W0's release on, W1 sends only its first renewal: no read, no new watch")
		Consistently(func() map[string]int {
			now, added := rc.counts(), map[string]int{}
			for k, v := range now {
				if d := v - before[k]; d > 0 {
					added[k] = d
				}
			}
			delete(added, "DELETE fencedleases") // W0's release
			return added
		}, 2*time.Second, 100*time.Millisecond).Should(Equal(map[string]int{"PUT leases": 1}))

		By("and those watches tell it of a loss: its claim deleted by someone else")
		var claim fkv1.FencedLease
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: w1.ClaimName}, &claim)).To(Succeed())
		Expect(admin.Delete(ctx, &claim)).To(Succeed())
		Eventually(w1.Done(), 5*time.Second).Should(BeClosed())
		Expect(rec.lostReason()).To(Or(ContainSubstring("deleted by someone else"), ContainSubstring("names claim")))
		Expect(rc.counts()["GET fencedleases"]).To(Equal(before["GET fencedleases"]), "the loss was read, not watched")
	})

	It("takes a grant seen first on its claim without taking the Lease versions its watch still has to deliver for a loss", func() {
		prev, _, _ := holderClient(ns)
		w0, err := prev.Acquire(ctx, "report", "W0", lease.Options{TTL: 60 * time.Second, RenewInterval: 100 * time.Millisecond})
		Expect(err).NotTo(HaveOccurred())
		holder, f, _ := holderClient(ns)
		f.set(func(f *faults) { f.holdWatchPath = "/leases" })
		rec := &recorder{}
		got := acquireW1(holder, rec)
		Eventually(func() string { return reasonOf(ns, "W1") }, 10*time.Second).Should(Equal(fkv1.ReasonNext), "W1 is the head waiter: it watches the Lease")

		By("W1's Lease watch stalls while W0 renews (versions naming W0 queue in it), then W0 releases")
		hold := make(chan struct{})
		f.set(func(f *faults) { f.holdWatch = hold })
		released := false
		DeferCleanup(func() {
			if !released {
				close(hold)
			}
		})
		time.Sleep(500 * time.Millisecond) // about five renewals of W0
		w1 := handOver(w0, got, rec, "claim")

		By("the stalled watch delivers W0's versions: W1 keeps its lease")
		f.set(func(f *faults) { f.holdWatch = nil })
		close(hold)
		released = true
		Consistently(w1.State, 2*time.Second, 50*time.Millisecond).Should(Equal(lease.Held))
		_, led := ledgerOf(ns, "report")
		Expect(led.HolderUID).To(Equal(w1.UID))
	})

	It("has O(1) watchers of a lock's Lease however many wait: the holder and the head waiter", func() {
		const lock = "busy"
		holders, watches := countingClient(ns, lock)
		w0, err := holders.Acquire(ctx, lock, "W0", lease.Options{TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w0.Release(ctx) })
		Eventually(watches.open.Load, 5*time.Second).Should(BeEquivalentTo(1), "the holder watches its Lease")
		baseline := apiserverLeaseWatches()

		waitCtx, stopWaiting := context.WithCancel(ctx)
		var wg sync.WaitGroup
		DeferCleanup(func() {
			stopWaiting() // every waiter leaves the queue
			wg.Wait()
			Eventually(func() int { return len(claims(ns)) }, 60*time.Second).Should(BeNumerically("<=", 1))
		})
		started := 0
		for _, n := range []int{100, 300} {
			By(fmt.Sprintf("%d waiters queue on the lock", n))
			for ; started < n; started++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					l, err := holders.Acquire(waitCtx, lock, fmt.Sprintf("W%d", i), lease.Options{TTL: 60 * time.Second, RequestTimeout: 30 * time.Second})
					if err == nil {
						_ = l.Release(ctx) // granted only in the handoff spec; not here
					}
				}(started + 1)
			}
			Eventually(func() int {
				pending := 0
				for _, c := range claims(ns) {
					if c.Status.Phase == fkv1.PhasePending && (heldReason(&c) == fkv1.ReasonQueued || heldReason(&c) == fkv1.ReasonNext) {
						pending++
					}
				}
				return pending
			}, 120*time.Second, 250*time.Millisecond).Should(Equal(n), "every waiter shows Pending")

			By("the Lease's watchers are the holder and at most the head waiter")
			Eventually(watches.open.Load, 20*time.Second, 100*time.Millisecond).Should(BeNumerically("<=", 2))
			Consistently(watches.open.Load, 2*time.Second, 100*time.Millisecond).Should(BeNumerically("<=", 2))
			Expect(apiserverLeaseWatches()).To(BeNumerically("<=", baseline+1), "kube-apiserver serves more Lease watches than the holder's and the head's")
			GinkgoWriter.Printf("%d waiters: %d Lease watches open (peak %d while they queued, %d started); apiserver serves %v Lease watches (baseline %v)\n",
				n, watches.open.Load(), watches.peak.Load(), watches.started.Load(), apiserverLeaseWatches(), baseline)
			Expect(w0.State()).To(Equal(lease.Held))
		}
	})

	// The authority marks a claim that enters the queue at its head Next.
	It("hands the lock to the head waiter, which takes its grant from the Lease", func() {
		// The Held status of the next holder is held back 3 s: only the
		// Lease can tell it sooner.
		sw := &statusWrites{ns: ns, delay: 3 * time.Second}
		withManagerTransport(func(rt http.RoundTripper) http.RoundTripper { sw.next = rt; return sw })
		const lock = "busy"
		holders, watches := countingClient(ns, lock)
		w0, err := holders.Acquire(ctx, lock, "W0", lease.Options{TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w0.Release(ctx) })

		waitCtx, stopWaiting := context.WithCancel(ctx)
		DeferCleanup(stopWaiting)
		type acquired struct {
			l   *lease.Lease
			err error
			at  time.Time
		}
		recs := map[string]*recorder{"W1": {}, "W2": {}}
		results := map[string]chan acquired{"W1": make(chan acquired, 1), "W2": make(chan acquired, 1)}
		for _, h := range []string{"W1", "W2"} {
			go func() {
				l, err := holders.Acquire(waitCtx, lock, h, lease.Options{TTL: 60 * time.Second, OnTransition: recs[h].record})
				results[h] <- acquired{l, err, time.Now()}
			}()
		}
		// The queue's order is the authority's business: find the head.
		reasons := func() map[string]string {
			out := map[string]string{}
			for _, c := range claims(ns) {
				if c.Spec.HolderIdentity != "W0" {
					out[c.Spec.HolderIdentity] = heldReason(&c)
				}
			}
			return out
		}
		Eventually(reasons, 10*time.Second).Should(ConsistOf(fkv1.ReasonNext, fkv1.ReasonQueued),
			"the authority did not mark exactly one of two waiters Next (the head) and the other Queued")
		head, behind := "W1", "W2"
		if reasons()["W2"] == fkv1.ReasonNext {
			head, behind = "W2", "W1"
		}
		Eventually(watches.open.Load, 10*time.Second).Should(BeEquivalentTo(2), "the holder and the head waiter watch the Lease")

		By("W0 releases; the head learns of its grant from the Lease, before its claim can show it")
		released := time.Now()
		Expect(w0.Release(ctx)).To(Succeed())
		var got acquired
		Eventually(results[head], 10*time.Second).Should(Receive(&got))
		Expect(got.err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = got.l.Release(ctx) })
		Expect(got.at.Sub(released)).To(BeNumerically("<", sw.delay), "the head waited for its claim's status")
		Expect(recs[head].grantReason()).To(ContainSubstring("seen first on the lease"))
		_, led := ledgerOf(ns, lock)
		Expect(led.HolderUID).To(Equal(got.l.UID))
		Expect(got.l.Epoch).To(Equal(led.Epoch))
		Expect(got.l.Epoch).To(Equal(w0.Epoch + 1))
		GinkgoWriter.Printf("%s acquired %v after W0's release\n", head, got.at.Sub(released))

		By("the other waiter, now the head, stays Queued (no status write per handoff) and watches only its claim")
		Consistently(func() string { return reasons()[behind] }, time.Second).Should(Equal(fkv1.ReasonQueued))
		Eventually(watches.open.Load, 10*time.Second).Should(BeEquivalentTo(1), "only the holder watches the Lease")
		Consistently(results[behind], time.Second).ShouldNot(Receive())
	})
})

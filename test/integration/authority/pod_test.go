package authority_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/podlease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// leasePod creates a pod asking for lock, and plays the kubelet: Running
// with its containers ready.
func leasePod(ns, name, lock, ttl string, ready bool, tweak ...func(*corev1.Pod)) *corev1.Pod {
	p, err := envtestutil.LeasePod(ctx, k8s, ns, name, lock, ttl, ready, tweak...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return p
}

// setReady sets the pod's status the way the kubelet would.
func setReady(p *corev1.Pod, ready bool) {
	ExpectWithOffset(1, envtestutil.SetPodReady(ctx, k8s, p, ready)).To(Succeed())
}

func podLease(ns, name string) (state, epoch string, cond *corev1.PodCondition) {
	return envtestutil.PodLease(ctx, k8s, ns, name)
}

// stateOf shows a pod's lease as "state/epoch", the epoch counted from the
// first one granted in the namespace's lock ("Held/1" for the first grant):
// a new ledger starts at the storage revision, so absolute epochs are large.
func stateOf(ns, name string) func() string {
	return func() string {
		s, e, _ := podLease(ns, name)
		if e == "" {
			return s + "/"
		}
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return s + "/" + e
		}
		baseMu.Lock()
		defer baseMu.Unlock()
		base, ok := firstEpoch[ns]
		if !ok || n < base {
			base, firstEpoch[ns] = n, n
		}
		return fmt.Sprintf("%s/%d", s, n-base+1)
	}
}

var (
	baseMu     sync.Mutex
	firstEpoch = map[string]int64{}
)

// holders returns the pods of pods whose lease-state is Held.
func holders(ns string, pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		if s, _, _ := podLease(ns, p.Name); s == fkv1.LeaseStateHeld {
			out = append(out, p.Name)
		}
	}
	return out
}

var _ = Describe("Pod-held leases", func() {
	var (
		ns  string
		mgr *runningManager
	)
	BeforeEach(func() {
		ns = newNamespace()
		mgr = startManager(time.Second)
		DeferCleanup(func() { mgr.Stop() })
	})

	It("grants one of three contending pods; unready past the TTL hands over; deletion hands over at once", func() {
		var pods []*corev1.Pod
		for i := 0; i < 3; i++ {
			pods = append(pods, leasePod(ns, fmt.Sprintf("report-worker-%d", i), "report-2026-07", "2", true))
		}
		byName := map[string]*corev1.Pod{}
		for _, p := range pods {
			byName[p.Name] = p
		}
		oneHolder := func() string {
			var h string
			EventuallyWithOffset(1, func() []string { return holders(ns, pods) }, 10*time.Second).Should(HaveLen(1))
			h = holders(ns, pods)[0]
			ConsistentlyWithOffset(1, func() []string { return holders(ns, pods) }, time.Second).Should(Equal([]string{h}))
			return h
		}
		h0 := oneHolder()
		Expect(stateOf(ns, h0)()).To(Equal("Held/1"))
		_, _, cond := podLease(ns, h0)
		Expect(cond.Status).To(Equal(corev1.ConditionTrue))
		for _, p := range pods {
			if p.Name != h0 {
				// Written once the lock controller has queued the claim.
				Eventually(stateOf(ns, p.Name), 10*time.Second).Should(Equal("Pending/"))
				_, _, cond = podLease(ns, p.Name)
				Expect(cond.Status).To(Equal(corev1.ConditionFalse))
			}
		}

		By("the holder's containers stop being ready: after its 2s TTL another pod holds the next epoch")
		unreadyAt := time.Now()
		setReady(byName[h0], false)
		Eventually(func() []string {
			return holders(ns, pods)
		}, 10*time.Second).Should(And(HaveLen(1), Not(ContainElement(h0))))
		h1 := oneHolder()
		Expect(time.Since(unreadyAt)).To(BeNumerically(">=", 1500*time.Millisecond), "taken over before the TTL")
		Expect(stateOf(ns, h1)()).To(Equal("Held/2"))
		Eventually(stateOf(ns, h0), 5*time.Second).Should(Equal("Lost/1"), "the epoch annotation keeps the last epoch held")

		By("the holder pod is deleted: the last pod holds (at once: see the 300 s TTL test below)")
		Expect(k8s.Delete(ctx, byName[h1])).To(Succeed())
		var h2 string
		for _, p := range pods {
			if p.Name != h0 && p.Name != h1 {
				h2 = p.Name
			}
		}
		Eventually(stateOf(ns, h2), 10*time.Second).Should(Equal("Held/3"))

		By("the first holder is ready again: it contends again with a fresh claim")
		setReady(byName[h0], true)
		Expect(k8s.Delete(ctx, byName[h2])).To(Succeed())
		Eventually(stateOf(ns, h0), 10*time.Second).Should(Equal("Held/4"))
	})

	It("grants permits of a semaphore to pods (fencekeeper.io/lease-max-holders): each unready pod's permit ends on its own, deletion hands it over at once", func() {
		semaphore := func(p *corev1.Pod) { p.Annotations[fkv1.AnnotationLeaseMaxHolders] = "2" }
		var pods []*corev1.Pod
		for i := 0; i < 3; i++ {
			pods = append(pods, leasePod(ns, fmt.Sprintf("loader-%d", i), "loaders", "2", true, semaphore))
		}
		Eventually(func() []string { return holders(ns, pods) }, 10*time.Second).Should(HaveLen(2))
		Consistently(func() []string { return holders(ns, pods) }, 2*time.Second).Should(HaveLen(2), "a third pod held a permit of two")
		held := holders(ns, pods)
		_, e0, _ := podLease(ns, held[0])
		_, e1, _ := podLease(ns, held[1])
		Expect(e0).NotTo(Equal(e1), "two permits, two epochs")
		led := fkv1.ReadLedger(getLease(ns, "loaders"), "loaders")
		Expect(led.MaxHolders()).To(Equal(int32(2)))
		Expect(led.Permits).To(HaveLen(2))

		By("one holder's containers stop being ready: its permit ends after the TTL, the other stays, the waiter gets a permit")
		byName := map[string]*corev1.Pod{}
		for _, p := range pods {
			byName[p.Name] = p
		}
		setReady(byName[held[0]], false)
		Eventually(func() []string { return holders(ns, pods) }, 10*time.Second).Should(And(HaveLen(2), Not(ContainElement(held[0])), ContainElement(held[1])))

		By("deleting a holder pod hands its permit over at once, long before the TTL would")
		setReady(byName[held[0]], true)
		Expect(k8s.Delete(ctx, byName[held[1]])).To(Succeed())
		Eventually(func() []string { return holders(ns, pods) }, 5*time.Second).Should(ContainElement(held[0]))
	})

	It("hands over at once when the holder pod is deleted, long before its 300 s TTL", func() {
		a := leasePod(ns, "at-once-a", "at-once", "300", true)
		Eventually(stateOf(ns, a.Name), 10*time.Second).Should(Equal("Held/1"))
		b := leasePod(ns, "at-once-b", "at-once", "300", true)
		Eventually(stateOf(ns, b.Name), 10*time.Second).Should(Equal("Pending/"))
		errorsBefore := reconcileErrors("podlease")
		Expect(k8s.Delete(ctx, a)).To(Succeed())
		// Without the deletion rule this would take the whole TTL (300 s).
		Eventually(stateOf(ns, b.Name), 30*time.Second).Should(Equal("Held/2"))
		// A pod that is gone is the normal end of a pod lease, not an error
		// (it used to log "pods not found" with a stack trace).
		Consistently(func() float64 { return reconcileErrors("podlease") }, 2*time.Second).Should(Equal(errorsBefore))
	})

	It("grants only a ready pod: waiters still starting keep their place, and the first ready one gets the first epoch and keeps it", func() {
		var pods []*corev1.Pod
		for i := 0; i < 3; i++ {
			pods = append(pods, leasePod(ns, fmt.Sprintf("starting-%d", i), "batch", "2", false))
		}
		By("nobody is ready: nobody is granted, even after a TTL")
		Consistently(func() []string { return holders(ns, pods) }, 3*time.Second).Should(BeEmpty())

		By("the second pod is ready first: it is granted the lock's first epoch")
		setReady(pods[1], true)
		Eventually(stateOf(ns, pods[1].Name), 10*time.Second).Should(Equal("Held/1"))
		Expect(*getLease(ns, "batch").Spec.LeaseTransitions).To(Equal(int32(1)), "an earlier grant went to a pod that was not ready")
		By("the first pod becomes ready: the holder keeps the lock and its epoch past the TTL")
		setReady(pods[0], true)
		Consistently(stateOf(ns, pods[1].Name), 4*time.Second).Should(Equal("Held/1"))
		Expect(stateOf(ns, pods[0].Name)()).To(Equal("Pending/"))

		By("the holder goes: the waiter at the head of the queue, now ready, is next")
		Expect(k8s.Delete(ctx, pods[1])).To(Succeed())
		Eventually(stateOf(ns, pods[0].Name), 10*time.Second).Should(Equal("Held/2"))
		Expect(stateOf(ns, pods[2].Name)()).To(Equal("Pending/"))
	})

	It("releases at once when a pod starts terminating (grace period) and when its annotation is removed", func() {
		onNode := func(p *corev1.Pod) { p.Spec.NodeName = "node-1" } // graceful deletion needs a node
		a := leasePod(ns, "a", "job", "300", true, onNode)
		Eventually(stateOf(ns, "a"), 10*time.Second).Should(Equal("Held/1"))
		b := leasePod(ns, "b", "job", "300", true)
		Eventually(stateOf(ns, "b"), 10*time.Second).Should(Equal("Pending/"))

		By("deleting a pod that is on a node: it stays, terminating, for its grace period")
		Expect(k8s.Delete(ctx, a, client.GracePeriodSeconds(300))).To(Succeed())
		var term corev1.Pod
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(a), &term)).To(Succeed())
		Expect(term.DeletionTimestamp).NotTo(BeNil())
		Eventually(stateOf(ns, "b"), 10*time.Second).Should(Equal("Held/2"))
		Eventually(stateOf(ns, "a"), 10*time.Second).Should(Equal("Lost/1"))

		By("removing the annotation gives the claim up")
		leasePod(ns, "c", "job", "300", true)
		Eventually(stateOf(ns, "c"), 10*time.Second).Should(Equal("Pending/"))
		Expect(k8s.Patch(ctx, b, client.RawPatch("application/merge-patch+json",
			[]byte(`{"metadata":{"annotations":{"fencekeeper.io/lease":null}}}`)))).To(Succeed())
		Eventually(stateOf(ns, "c"), 10*time.Second).Should(Equal("Held/3"))
		Eventually(stateOf(ns, "b"), 10*time.Second).Should(Equal("Lost/2"))
		Eventually(func() int {
			var list fkv1.FencedLeaseList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{fkv1.LabelPodUID: string(b.UID)})).To(Succeed())
			return len(list.Items)
		}, 10*time.Second).Should(BeZero())
	})

	It("ends the lease of a holder on a node that is not Ready one TTL after the first look, however its containers flip meanwhile", func() {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "flip-node-"}}
		Expect(k8s.Create(ctx, node)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, node) })
		setNodeReady := func(status corev1.ConditionStatus) {
			node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.Now()}}
			ExpectWithOffset(1, k8s.Status().Update(ctx, node)).To(Succeed())
		}
		setNodeReady(corev1.ConditionTrue)
		a := leasePod(ns, "on-node", "job", "4", true, func(p *corev1.Pod) { p.Spec.NodeName = node.Name })
		Eventually(stateOf(ns, a.Name), 10*time.Second).Should(Equal("Held/1"))
		b := leasePod(ns, "elsewhere", "job", "4", true)
		Eventually(stateOf(ns, b.Name), 10*time.Second).Should(Equal("Pending/"))

		By("the node stops being Ready: the TTL starts")
		setNodeReady(corev1.ConditionFalse)
		notReadyAt := time.Now()
		By("the holder's containers stop being ready, are ready again, stop again, a second apart: the pod is never live")
		for i, ready := range []bool{false, true, false} {
			time.Sleep(time.Until(notReadyAt.Add(time.Duration(i+1) * time.Second)))
			setReady(a, ready)
		}
		flippedAt := time.Now()
		By("the waiter holds one TTL after the node stopped being Ready, not one TTL after the last flip")
		Eventually(stateOf(ns, b.Name), time.Until(flippedAt.Add(3*time.Second))).Should(Equal("Held/2"),
			"each flip restarted the TTL (the pod was never live)")
		Expect(time.Since(notReadyAt)).To(BeNumerically(">=", 3500*time.Millisecond), "taken over before the TTL")
	})

	It("leaves a pod with a bad request untouched but for an Event and a clear condition naming every problem", func() {
		leasePod(ns, "bad-lock", "Not_A_Lock", "", true)
		leasePod(ns, "bad-ttl", "report", "forever", true)
		leasePod(ns, "bad-both", "Not_A_Lock", "0", true)
		for name, want := range map[string]string{
			"bad-lock": `annotation fencekeeper.io/lease="Not_A_Lock" is not a valid lock name`,
			"bad-ttl":  `annotation fencekeeper.io/lease-duration-seconds="forever" must be a whole number of seconds in 1..86400`,
			"bad-both": `annotation fencekeeper.io/lease="Not_A_Lock" is not a valid lock name: a DNS-1123 subdomain of at most 63 characters; ` +
				`annotation fencekeeper.io/lease-duration-seconds="0" must be a whole number of seconds in 1..86400`,
		} {
			Eventually(func() string {
				_, _, c := podLease(ns, name)
				if c == nil {
					return ""
				}
				return c.Reason + ": " + c.Message
			}, 10*time.Second).Should(HavePrefix(fkv1.ReasonInvalidLeaseRequest + ": " + want))
			s, e, _ := podLease(ns, name)
			Expect(s + e).To(BeEmpty())
		}
		Eventually(func() []string {
			var evs eventsv1.EventList
			Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var out []string
			for _, e := range evs.Items {
				out = append(out, e.Regarding.Name+"/"+e.Reason)
			}
			return out
		}, 10*time.Second).Should(ContainElements("bad-lock/"+fkv1.ReasonInvalidLeaseRequest, "bad-ttl/"+fkv1.ReasonInvalidLeaseRequest))
		var list fkv1.FencedLeaseList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(BeEmpty())
	})

	It("binds the claims it makes to their pod, also where the claim-identity policy is not in effect", func() {
		// A claim that records no identity has every write presenting its
		// epoch refused (rule 9, fail closed) and is never granted, so the
		// bridge says whom its claims are for itself.
		var p *corev1.Pod
		Expect(envtestutil.WithoutClaimIdentity(ctx, cfg, func() {
			p = leasePod(ns, "bound-worker", "report", "", true)
			Eventually(stateOf(ns, p.Name), 10*time.Second).Should(Equal("Held/1"))
		})).To(Succeed())
		var list fkv1.FencedLeaseList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(1))
		Expect(list.Items[0].Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedByPodUID, string(p.UID)))
		Expect(list.Items[0].Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedBy, ""))
	})

	It("replaces a claim under the pod's claim name that records no binding (an older manager's) with one bound to the pod, which then holds", func() {
		// The claim is made before the pod asks (a pod's claim needs its
		// UID), so that the bridge finds it when the pod does.
		p := leasePod(ns, "upgraded-worker", "", "", true) // not asking yet
		old := &fkv1.FencedLease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: podlease.PodClaimName(p, "report"),
				Labels: map[string]string{fkv1.LabelPodUID: string(p.UID)},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID,
					Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false)}}},
			Spec: fkv1.FencedLeaseSpec{LockName: "report", HolderIdentity: p.Name, LeaseDurationSeconds: ptr.To(int32(30))},
		}
		Expect(envtestutil.WithoutClaimIdentity(ctx, cfg, func() { Expect(k8s.Create(ctx, old)).To(Succeed()) })).To(Succeed())
		Expect(old.Annotations).NotTo(HaveKey(fkv1.AnnotationCreatedBy), "made while the claim-identity policy was not in effect")

		Expect(k8s.Patch(ctx, p, client.RawPatch(types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"report"}}}`, fkv1.AnnotationLease))))).To(Succeed())
		Eventually(func(g Gomega) {
			var c fkv1.FencedLease
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(old), &c)).To(Succeed())
			g.Expect(c.UID).NotTo(Equal(old.UID), "the claim that records no binding is still the pod's")
			g.Expect(c.Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedByPodUID, string(p.UID)))
			g.Expect(c.Status.Phase).To(Equal(fkv1.PhaseHeld))
		}, 15*time.Second).Should(Succeed())
		Eventually(func() string { s, _, _ := podLease(ns, p.Name); return s }, 10*time.Second).Should(Equal(fkv1.LeaseStateHeld))
	})

	It("names claims deterministically and validly for long pod names", func() {
		long := "worker-"
		for len(long) < 240 {
			long += "abcdefghij"
		}
		p := leasePod(ns, long, "report", "", true)
		Eventually(stateOf(ns, p.Name), 10*time.Second).Should(Equal("Held/1"))
		var list fkv1.FencedLeaseList
		Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(1))
		Expect(len(list.Items[0].Name)).To(BeNumerically("<=", 253))
		Expect(list.Items[0].OwnerReferences[0].UID).To(Equal(p.UID))
	})
})

var _ = Describe("Pod-held leases at rest", func() {
	It("cost no API writes over a resync with 1,000 idle pod-held leases", func() {
		ns := newNamespace()
		m := startManagerWith(envtestutil.ManagerOptions{ForeignLeaseRecheck: time.Second, SyncPeriod: 5 * time.Second})
		DeferCleanup(func() { m.Stop() })
		m.writes.namespace.Store(ns)
		const n = 1000
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := 0; i < n; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				defer func() { <-sem }()
				// Ready before it asks: under load a pod that stays unready
				// for its 5s TTL would rightly lose the lease mid-test.
				p := leasePod(ns, "idle-"+strconv.Itoa(i), "", "", true)
				Expect(k8s.Patch(ctx, p, client.RawPatch("application/merge-patch+json", []byte(fmt.Sprintf(
					`{"metadata":{"annotations":{"fencekeeper.io/lease":"lock-%d","fencekeeper.io/lease-duration-seconds":"5"}}}`, i))))).To(Succeed())
			}()
		}
		wg.Wait()
		Eventually(func() int {
			var pods corev1.PodList
			Expect(k8s.List(ctx, &pods, client.InNamespace(ns))).To(Succeed())
			held := 0
			for _, p := range pods.Items {
				if p.Annotations[fkv1.AnnotationLeaseState] == fkv1.LeaseStateHeld {
					held++
				}
			}
			return held
		}, 3*time.Minute, time.Second).Should(Equal(n))
		By("waiting until the grant burst has settled: no write for 3s")
		settled := m.writes.total()
		Eventually(func() bool {
			time.Sleep(3 * time.Second)
			now := m.writes.total()
			quiet := now == settled
			settled = now
			return quiet
		}, 2*time.Minute, time.Millisecond).Should(BeTrue())
		before := m.writes.total()
		By(fmt.Sprintf("%d writes to grant %d pod leases; now watching two resyncs and two TTLs", before, n))
		l0, c0, p0 := m.writes.leases.Load(), m.writes.claims.Load(), m.writes.pods.Load()
		Consistently(m.writes.total, 12*time.Second, time.Second).Should(Equal(before), func() string {
			return fmt.Sprintf("writes during the idle window: leases %d, claims %d, pods %d",
				m.writes.leases.Load()-l0, m.writes.claims.Load()-c0, m.writes.pods.Load()-p0)
		})
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns))).To(Succeed())
		for _, p := range pods.Items {
			Expect(p.Annotations[fkv1.AnnotationLeaseState]).To(Equal(fkv1.LeaseStateHeld), p.Name)
		}
	})
})

// statusBlocker fails the manager's writes of the status of claims whose
// names start with a blocked prefix (a pod's claims are named after it): the
// authority cannot record anything on them.
type statusBlocker struct {
	next http.RoundTripper
	mu   *sync.Mutex
	pods map[string]bool
}

func (b statusBlocker) wrap(next http.RoundTripper) http.RoundTripper {
	b.next = next
	return b
}

func (b statusBlocker) block(pod string, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pods[pod] = on
}

func (b statusBlocker) RoundTrip(req *http.Request) (*http.Response, error) {
	path := req.URL.Path
	if req.Method != http.MethodGet && strings.Contains(path, "/fencedleases/") && strings.HasSuffix(path, "/status") {
		name := strings.TrimSuffix(path[strings.LastIndex(path, "/fencedleases/")+len("/fencedleases/"):], "/status")
		b.mu.Lock()
		defer b.mu.Unlock()
		for pod, on := range b.pods {
			if on && strings.HasPrefix(name, pod+"-") {
				return nil, fmt.Errorf("injected: status write of claim %s refused", name)
			}
		}
	}
	return b.next.RoundTrip(req)
}

var _ = Describe("A pod that no longer holds its claim", func() {
	It("shows Lost, never Held, once its held claim is gone: an invalid edit, a claim deleted by hand, a switch to another lock", func() {
		ns := newNamespace()
		blocker := statusBlocker{mu: &sync.Mutex{}, pods: map[string]bool{}}
		m, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns}, WrapTransport: blocker.wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = m.Stop() })

		a := leasePod(ns, "a", "job", "300", true)
		Eventually(stateOf(ns, "a"), 10*time.Second).Should(Equal("Held/1"))
		b := leasePod(ns, "b", "job", "300", true)
		Eventually(stateOf(ns, "b"), 10*time.Second).Should(Equal("Pending/"))

		By("an invalid edit of the holder's request gives its claim up: the pod is told Lost")
		Expect(k8s.Patch(ctx, a, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"fencekeeper.io/lease-duration-seconds":"forever"}}}`)))).To(Succeed())
		Eventually(stateOf(ns, "b"), 10*time.Second).Should(Equal("Held/2"))
		Eventually(stateOf(ns, "a"), 10*time.Second).Should(Equal("Lost/1"))
		_, _, cond := podLease(ns, "a")
		Expect(cond).NotTo(BeNil())
		Expect(cond.Status).To(Equal(corev1.ConditionFalse))
		Expect(cond.Reason).To(Equal(fkv1.ReasonInvalidLeaseRequest))

		claimsOf := func(p *corev1.Pod) []fkv1.FencedLease {
			var list fkv1.FencedLeaseList
			ExpectWithOffset(1, k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{fkv1.LabelPodUID: string(p.UID)})).To(Succeed())
			return list.Items
		}
		By("the holder's claim deleted by hand, with nothing recorded on its new claim: the pod is told Lost")
		c := leasePod(ns, "c", "job", "300", true)
		Eventually(stateOf(ns, "c"), 10*time.Second).Should(Equal("Pending/"))
		blocker.block("b", true)
		held := claimsOf(b)
		Expect(held).To(HaveLen(1))
		Expect(k8s.Delete(ctx, &held[0], client.Preconditions{UID: &held[0].UID})).To(Succeed())
		Eventually(stateOf(ns, "c"), 10*time.Second).Should(Equal("Held/3"))
		Eventually(func() []types.UID { // the bridge made the pod a new claim
			var uids []types.UID
			for _, cl := range claimsOf(b) {
				uids = append(uids, cl.UID)
			}
			return uids
		}, 10*time.Second).Should(And(HaveLen(1), Not(ContainElement(held[0].UID))))
		Eventually(stateOf(ns, "b"), 10*time.Second).Should(Equal("Lost/2"))
		blocker.block("b", false)

		By("the holder switched to another lock, with nothing recorded on its new claim: the pod is told Lost, not Held with the old lock's epoch")
		blocker.block("c", true)
		Expect(k8s.Patch(ctx, c, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"fencekeeper.io/lease":"job2"}}}`)))).To(Succeed())
		Eventually(stateOf(ns, "b"), 10*time.Second).Should(Equal("Held/4"))
		Eventually(stateOf(ns, "c"), 10*time.Second).Should(Equal("Lost/3"))
		Consistently(func() []string { return holders(ns, []*corev1.Pod{a, b, c}) }, 2*time.Second).Should(Equal([]string{"b"}))
	})
})

var _ = Describe("A pod-held lease with two managers at once", func() {
	It("is not told Lost by a manager whose claim cache has not seen the grant the other one reported", func() {
		ns := newNamespace()
		blockers := []statusBlocker{{mu: &sync.Mutex{}, pods: map[string]bool{"p": true}}, {mu: &sync.Mutex{}, pods: map[string]bool{"p": true}}}
		claimWatches := fault.NewWatchFreezer(func(req *http.Request) bool { return strings.Contains(req.URL.Path, "/fencedleases") })
		r1, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns}, WrapTransport: blockers[0].wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = r1.Stop() })
		r2, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns},
			WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return blockers[1].wrap(claimWatches.Wrap(rt)) }})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = r2.Stop() })

		By("the pod's claim exists, with no status anyone could write yet, in both caches")
		leasePod(ns, "p", "job", "300", true)
		var claimName string
		Eventually(func() int {
			var list fkv1.FencedLeaseList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			if len(list.Items) == 1 {
				claimName = list.Items[0].Name
			}
			return len(list.Items)
		}, 10*time.Second).Should(Equal(1))
		for _, m := range []*envtestutil.Manager{r1, r2} {
			Eventually(func() error {
				var cl fkv1.FencedLease
				return m.Mgr.GetCache().Get(ctx, client.ObjectKey{Namespace: ns, Name: claimName}, &cl)
			}, 10*time.Second).Should(Succeed())
		}

		By("the second manager's claim watch stalls; the grant is recorded and reported on the pod")
		claimWatches.Freeze()
		DeferCleanup(claimWatches.Thaw)
		seen := make(chan string, 100)
		w, err := k8s.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": "p"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(w.Stop)
		go func() {
			for ev := range w.ResultChan() {
				if pod, ok := ev.Object.(*corev1.Pod); ok {
					seen <- pod.Annotations[fkv1.AnnotationLeaseState]
				}
			}
		}()
		for _, b := range blockers {
			b.block("p", false)
		}
		Eventually(stateOf(ns, "p"), 10*time.Second).Should(Equal("Held/1"))

		By("the pod, which holds its claim, is never told Lost while the second manager's cache trails")
		Consistently(stateOf(ns, "p"), 3*time.Second).Should(Equal("Held/1"))
		var states []string
		for len(seen) > 0 {
			states = append(states, <-seen)
		}
		Expect(states).NotTo(ContainElement(fkv1.LeaseStateLost), "the pod's lease-state over time: %v", states)
	})
})

var _ = Describe("A re-created pod with two managers at once", func() {
	It("keeps its claim while one manager's pod cache has seen the old pod's deletion but not the new pod", func() {
		ns := newNamespace()
		podWatches := fault.NewWatchFreezer(func(req *http.Request) bool { return strings.HasSuffix(req.URL.Path, "/pods") })
		r1, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = r1.Stop() })
		r2, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns}, WrapTransport: podWatches.Wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = r2.Stop() })
		cachedUID := func() types.UID {
			var p corev1.Pod
			if err := r2.Mgr.GetCache().Get(ctx, client.ObjectKey{Namespace: ns, Name: "p"}, &p); err != nil {
				return ""
			}
			return p.UID
		}
		settled := func() bool {
			_, _, cond := podLease(ns, "p")
			return cond != nil && cond.Status == corev1.ConditionTrue
		}

		old := leasePod(ns, "p", "job", "300", true)
		Eventually(stateOf(ns, "p"), 10*time.Second).Should(Equal("Held/1"))
		Eventually(settled, 10*time.Second).Should(BeTrue())
		Eventually(cachedUID, 10*time.Second).Should(Equal(old.UID))
		Consistently(stateOf(ns, "p"), time.Second).Should(Equal("Held/1")) // no pod write left in flight

		By("the second manager's pod watch stalls, then lets the pod's deletion through and nothing after it")
		podWatches.Freeze()
		DeferCleanup(podWatches.Thaw)
		Expect(k8s.Delete(ctx, old)).To(Succeed())
		for i := 0; i < 5 && cachedUID() != ""; i++ { // an update, then the deletion
			podWatches.Step(1)
			time.Sleep(300 * time.Millisecond)
		}
		Eventually(cachedUID, 5*time.Second).Should(BeEmpty())

		By("the pod is re-created under its name: the first manager gives it a claim, which the second must not release")
		p2 := leasePod(ns, "p", "job", "300", true)
		claimUIDs := func() []types.UID {
			var list fkv1.FencedLeaseList
			Expect(k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{fkv1.LabelPodUID: string(p2.UID)})).To(Succeed())
			var uids []types.UID
			for _, c := range list.Items {
				uids = append(uids, c.UID)
			}
			return uids
		}
		Eventually(claimUIDs, 10*time.Second).Should(HaveLen(1))
		first := claimUIDs()
		// Not "Held/2": the second manager, its pod cache still showing the
		// old pod, may have made the old pod's claim again after the first
		// released it, and had it granted, before the deletion reached it.
		leaseState := func() string { s, _, _ := podLease(ns, "p"); return s }
		Eventually(leaseState, 10*time.Second).Should(Equal(fkv1.LeaseStateHeld))
		Consistently(claimUIDs, 3*time.Second).Should(Equal(first), "the new pod's claim was deleted (and made again)")
		Expect(leaseState()).To(Equal(fkv1.LeaseStateHeld))
		Expect(cachedUID()).To(BeEmpty(), "the second manager's pod cache saw the new pod: the test proved nothing")
	})
})

// pausedWrite holds the first request it matches before sending it, until
// released: a manager paused in the middle of a write.
type pausedWrite struct {
	next    http.RoundTripper
	match   func(*http.Request) bool
	once    *sync.Once
	held    chan struct{}
	release chan struct{}
	status  chan int
}

func (p pausedWrite) wrap(next http.RoundTripper) http.RoundTripper {
	p.next = next
	return p
}

func (p pausedWrite) RoundTrip(req *http.Request) (*http.Response, error) {
	hold := false
	if p.match(req) {
		p.once.Do(func() { hold = true })
	}
	if !hold {
		return p.next.RoundTrip(req)
	}
	close(p.held)
	<-p.release
	resp, err := p.next.RoundTrip(req)
	if err == nil {
		p.status <- resp.StatusCode
	} else {
		p.status <- 0
	}
	return resp, err
}

var _ = Describe("The pod bridge paused in the middle of a write", func() {
	It("writes to the pod as it decided on it: a pod changed meanwhile refuses the write", func() {
		ns := newNamespace()
		pw := pausedWrite{once: &sync.Once{}, held: make(chan struct{}), release: make(chan struct{}), status: make(chan int, 1),
			match: func(req *http.Request) bool {
				return req.Method == http.MethodPatch && strings.HasSuffix(req.URL.Path, "/namespaces/"+ns+"/pods/p")
			}}
		m, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns},
			WrapTransport: pw.wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = m.Stop() })

		By("the bridge's first write to the pod (Held) is on its way when someone else writes the pod")
		p := leasePod(ns, "p", "job", "300", true)
		Eventually(pw.held, 10*time.Second).Should(BeClosed())
		Expect(k8s.Patch(ctx, p, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"fencekeeper.io/lease-state":"Lost"}}}`)))).To(Succeed())
		close(pw.release)

		By("the paused write is refused; the bridge looks again and writes what holds now")
		Eventually(pw.status, 10*time.Second).Should(Receive(Equal(http.StatusConflict)))
		Eventually(stateOf(ns, "p"), 10*time.Second).Should(Equal("Held/1"))
	})
})

var _ = Describe("A pod that stops asking while its Lost write is refused", func() {
	It("is told Lost even though no later change of the pod passes the bridge's filter", func() {
		ns := newNamespace()
		podWatches := fault.NewWatchFreezer(func(req *http.Request) bool { return strings.HasSuffix(req.URL.Path, "/pods") })
		pw := pausedWrite{once: &sync.Once{}, held: make(chan struct{}), release: make(chan struct{}), status: make(chan int, 1),
			match: func(req *http.Request) bool {
				if req.Method != http.MethodPatch || !strings.HasSuffix(req.URL.Path, "/namespaces/"+ns+"/pods/p") || req.GetBody == nil {
					return false
				}
				body, err := req.GetBody()
				if err != nil {
					return false
				}
				defer body.Close()
				b, _ := io.ReadAll(body)
				return strings.Contains(string(b), fkv1.LeaseStateLost)
			}}
		m, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns},
			WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return pw.wrap(podWatches.Wrap(rt)) }})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = m.Stop() })

		p := leasePod(ns, "p", "job", "300", true)
		Eventually(stateOf(ns, "p"), 10*time.Second).Should(Equal("Held/1"))

		By("the pod stops asking; the bridge's Lost write is on its way when the pod changes again, unseen by the manager")
		Expect(k8s.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"fencekeeper.io/lease":null}}}`)))).To(Succeed())
		Eventually(pw.held, 10*time.Second).Should(BeClosed())
		podWatches.Freeze()
		Expect(k8s.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`)))).To(Succeed())
		close(pw.release)
		Eventually(pw.status, 10*time.Second).Should(Receive(Equal(http.StatusConflict)))

		By("the manager's pod cache catches up; the change it brings has no lease annotation, so no event reaches the bridge")
		time.Sleep(1500 * time.Millisecond)
		podWatches.Thaw()
		Eventually(stateOf(ns, "p"), 10*time.Second).Should(Equal("Lost/1"), "the pod that no longer holds the lock still says Held")
	})
})

var _ = Describe("A pod holder whose readiness flaps between two looks", func() {
	It("keeps its lease a full TTL from the last time it stopped being ready, not from the first", func() {
		ns := newNamespace()
		podWatches := fault.NewWatchFreezer(func(req *http.Request) bool { return strings.HasSuffix(req.URL.Path, "/pods") })
		m, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns}, WrapTransport: podWatches.Wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = m.Stop() })
		const ttl = 5 * time.Second
		a := leasePod(ns, "flap-a", "flap", "5", true)
		Eventually(stateOf(ns, a.Name), 10*time.Second).Should(Equal("Held/1"))
		b := leasePod(ns, "flap-b", "flap", "5", true)
		Eventually(stateOf(ns, b.Name), 10*time.Second).Should(Equal("Pending/"))
		cachedReady := func() corev1.ConditionStatus {
			var p corev1.Pod
			if err := m.Mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(a), &p); err != nil {
				return ""
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.ContainersReady {
					return c.Status
				}
			}
			return ""
		}

		By("the holder stops being ready and the manager looks: its TTL starts")
		unreadyAt := time.Now()
		setReady(a, false)
		Eventually(cachedReady, 5*time.Second).Should(Equal(corev1.ConditionFalse))

		By("later, it is ready again and stops again while the manager's pod watch stalls; the manager then relists and sees only the end: not ready")
		time.Sleep(time.Until(unreadyAt.Add(1500 * time.Millisecond))) // another second: the kubelet's transition times are whole seconds
		podWatches.Freeze()
		DeferCleanup(podWatches.Thaw)
		setReady(a, true)
		setReady(a, false)
		flappedAt := time.Now()
		podWatches.Expire()
		Eventually(func() int { return podWatches.Relists() }, 5*time.Second).Should(BeNumerically(">", 0))

		By("the lease lasts its TTL from the flap, then the waiter takes the next epoch")
		Consistently(func() []string { return holders(ns, []*corev1.Pod{a, b}) }, time.Until(flappedAt.Add(ttl-500*time.Millisecond)), 50*time.Millisecond).
			Should(Equal([]string{a.Name}), func() string {
				return fmt.Sprintf("the lease ended %v after the pod last stopped being ready (TTL %v), %v after the first time",
					time.Since(flappedAt), ttl, time.Since(unreadyAt))
			})
		Eventually(stateOf(ns, b.Name), 10*time.Second).Should(Equal("Held/2"))
		Eventually(stateOf(ns, a.Name), 5*time.Second).Should(Equal("Lost/1"))
	})
})

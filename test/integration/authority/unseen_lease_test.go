package authority_test

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// heldRevisionRead lets the authority's first storage-revision read (its
// term's floor: a cluster-wide LIST of one Lease) reach the apiserver and
// be answered at once, and holds the answer back until release closes: a
// reply delayed in flight.
type heldRevisionRead struct {
	armed   atomic.Bool
	served  chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHeldRevisionRead() *heldRevisionRead {
	h := &heldRevisionRead{served: make(chan struct{}), release: make(chan struct{})}
	h.armed.Store(true)
	return h
}

func (h *heldRevisionRead) let() { h.once.Do(func() { close(h.release) }) }

func (h *heldRevisionRead) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodGet || req.URL.Path != "/apis/coordination.k8s.io/v1/leases" ||
			req.URL.Query().Get("limit") != "1" || !h.armed.CompareAndSwap(true, false) {
			return next.RoundTrip(req)
		}
		resp, err := next.RoundTrip(req)
		close(h.served)
		<-h.release
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// unseenLease is the stage: authority A (its watches behind freezers) reads
// its term's floor, and the reply is held back, so A grants nothing yet;
// authority B, started by the test, runs beside it.
type unseenLease struct {
	ns, lock       string
	read           *heldRevisionRead
	leases, claims *fault.WatchFreezer
	a              *envtestutil.Manager
	b              *runningManager
	stopB          sync.Once
	w1             *fkv1.FencedLease
}

func stageUnseenLease(lock string) *unseenLease {
	s := &unseenLease{ns: newNamespace(), lock: lock, read: newHeldRevisionRead(),
		leases: fault.NewWatchFreezer(func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/leases") }),
		claims: fault.NewWatchFreezer(func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/fencedleases") })}
	var err error
	s.a, err = envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{s.ns},
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return s.leases.Wrap(s.claims.Wrap(s.read.wrap(rt)))
		}})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	DeferCleanup(func() { s.read.let(); s.leases.Thaw(); s.claims.Thaw(); Expect(s.a.Stop()).To(Succeed()) })
	// W0 waits all along (its pod is not ready, so it is never granted): the
	// lock never looks idle to A, whose idle locks forget their asks.
	leasePod(s.ns, "w0", lock, "300", false)
	EventuallyWithOffset(1, func() int {
		var claims fkv1.FencedLeaseList
		_ = k8s.List(ctx, &claims, client.InNamespace(s.ns))
		return len(claims.Items)
	}, 10*time.Second).Should(Equal(1), "W0's pod got no claim")
	By("A's term floor is read, the reply held back; W1 asks")
	s.w1 = createClaim(s.ns, "w1", lock, "W1", 300)
	EventuallyWithOffset(1, s.read.served, 10*time.Second).Should(BeClosed())
	return s
}

func (s *unseenLease) startAuthorityB() {
	s.b = startManagerWith(envtestutil.ManagerOptions{Namespaces: []string{s.ns}})
	DeferCleanup(s.stopAuthorityB)
}

func (s *unseenLease) stopAuthorityB() { s.stopB.Do(s.b.Stop) }

// deleteLeaseAfterRelease: W2 releases, B stops (it would write a new
// ledger at once), and the Lease is deleted by hand, its finalizer removed
// (W0 still waits).
func (s *unseenLease) deleteLeaseAfterRelease(w2 *fkv1.FencedLease) {
	deleteClaim(w2)
	EventuallyWithOffset(1, func() string { return getLease(s.ns, s.lock).Annotations[fkv1.AnnotationClaimUID] }, 10*time.Second).Should(BeEmpty())
	s.stopAuthorityB()
	ExpectWithOffset(1, k8s.Delete(ctx, getLease(s.ns, s.lock))).To(Succeed())
	EventuallyWithOffset(1, func() error {
		l := getLease(s.ns, s.lock)
		l.Finalizers = nil
		return k8s.Update(ctx, l)
	}, 10*time.Second).Should(Succeed())
	EventuallyWithOffset(1, func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: s.lock}, &coordinationv1.Lease{}))
	}, 10*time.Second).Should(BeTrue())
}

// grantAfterRelist: W3 asks, A's caches relist to the present (the Lease
// cache first: A never sees the Lease again, nor W2's claim), the late
// reply lands, and W3 must be granted above W2.
func (s *unseenLease) grantAfterRelist(e2 int64) {
	w3 := createClaim(s.ns, "w3", s.lock, "W3", 300)
	inA := func(key client.ObjectKey, obj client.Object) func() error {
		return func() error { return s.a.Mgr.GetCache().Get(ctx, key, obj) }
	}
	s.leases.Expire()
	EventuallyWithOffset(1, func() bool {
		return apierrors.IsNotFound(inA(client.ObjectKey{Namespace: s.ns, Name: s.lock}, &coordinationv1.Lease{})())
	}, 10*time.Second).Should(BeTrue(), "A's Lease cache still shows the Lease")
	s.claims.Expire()
	EventuallyWithOffset(1, inA(client.ObjectKeyFromObject(w3), &fkv1.FencedLease{}), 10*time.Second).Should(Succeed(), "A's claim cache never showed W3")
	s.read.let()
	e3 := eventuallyPhase(s.ns, w3.Name, fkv1.PhaseHeld).Status.Epoch
	ExpectWithOffset(1, s.claims.Relists()).To(BeNumerically(">", 0), "A's claim cache never relisted: this showed nothing")
	ExpectWithOffset(1, e3).To(BeNumerically(">", e2), "W3 was granted epoch %d; W2 held %d", e3, e2)
}

// Two authorities at once, one of them with a stale cache: authority A reads
// its term's floor; the read is answered, but the reply is late. Meanwhile
// authority B grants from a Lease of its own, which A sees. A's watches then
// fall behind: B hands the lock on, the Lease is deleted by hand (possible
// with the chart's leaseGuard off), and A's caches relist straight to the
// present: no Lease, one new waiter. The late reply, from before the Lease
// even existed, must not be where A's epochs start: that would hand the new
// waiter the epoch the unseen holder had. (A's relist starts a new term,
// whose floor is read anew, and A's new ledger starts at the
// resourceVersion of the Lease it creates, above every epoch B issued.)
var _ = Describe("A term floor read answered late", func() {
	It("never starts a new ledger for a later need, after a Lease lived and went unseen", func() {
		s := stageUnseenLease("unseen")
		h := recordHistory(s.ns)
		By("B grants W1 from a Lease of its own, and A looks at that Lease")
		s.startAuthorityB()
		e1 := eventuallyPhase(s.ns, s.w1.Name, fkv1.PhaseHeld).Status.Epoch
		// A's renewal clock records a lock the moment a look finds its Lease.
		Eventually(func() int { return s.a.Authority.Memory().Clock }, 10*time.Second).Should(Equal(1))

		By("A's watches stall; B hands the lock to W2, W2 releases, and the Lease is deleted by hand")
		s.leases.Freeze()
		s.claims.Freeze()
		w2 := createClaim(s.ns, "w2", s.lock, "W2", 300)
		deleteClaim(s.w1)
		e2 := eventuallyPhase(s.ns, w2.Name, fkv1.PhaseHeld).Status.Epoch
		Expect(e2).To(Equal(e1 + 1))
		s.deleteLeaseAfterRelease(w2)

		By("W3 asks; A's caches relist to the present, and the late reply lands")
		s.grantAfterRelist(e2)
		h.verifyClaims()
		h.verifyLeases()
	})

})

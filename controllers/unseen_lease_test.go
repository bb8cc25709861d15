package controllers_test

import (
	"net/http"
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
)

// heldRevisionRead lets the authority's first storage-revision read (a
// cluster-wide LIST of one Lease) reach the apiserver and be answered at
// once, and holds the answer back until release closes: a reply delayed in
// flight.
type heldRevisionRead struct {
	next    http.RoundTripper
	armed   *atomic.Bool
	served  chan struct{}
	release chan struct{}
}

func (h heldRevisionRead) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || req.URL.Path != "/apis/coordination.k8s.io/v1/leases" ||
		req.URL.Query().Get("limit") != "1" || !h.armed.CompareAndSwap(true, false) {
		return h.next.RoundTrip(req)
	}
	resp, err := h.next.RoundTrip(req)
	close(h.served)
	<-h.release
	return resp, err
}

// Two authorities at once, one of them with a stale cache: authority A asks
// for the storage revision a new ledger of the lock starts at; the read is
// answered, but the reply is late. Meanwhile authority B grants from a
// Lease of its own, which A sees (its need for a new ledger is gone). A's
// watches then fall behind: B hands the lock on, the Lease is deleted by
// hand (possible with the chart's leaseGuard off), and A's cache relists
// straight to the present: no Lease, one new waiter. A needs a new ledger
// again, and the late reply, from before the Lease even existed, must not
// be the revision it starts at: that would hand the new waiter the epoch
// the unseen holder had.
var _ = Describe("A revision read answered late", func() {
	It("never starts a new ledger for a later need, after a Lease lived and went unseen", func() {
		ns := newNamespace()
		h := recordHistory(ns)
		DeferCleanup(h.stop)
		const lock = "unseen"

		read := heldRevisionRead{armed: &atomic.Bool{}, served: make(chan struct{}), release: make(chan struct{})}
		read.armed.Store(true)
		var releaseOnce sync.Once
		releaseRead := func() { releaseOnce.Do(func() { close(read.release) }) }
		freezer := envtestutil.NewWatchFreezer(nil)
		a, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns},
			WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
				read.next = rt
				return freezer.Wrap(read)
			}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { releaseRead(); freezer.Thaw(); Expect(a.Stop()).To(Succeed()) })

		By("A asks for a revision for W1's grant; the read is answered, the reply held back")
		w1 := createClaim(ns, "w1", lock, "W1", 300)
		Eventually(read.served, 10*time.Second).Should(BeClosed())

		By("B grants W1 from a Lease of its own, and A looks at that Lease")
		b := startManagerWith(envtestutil.ManagerOptions{Namespaces: []string{ns}})
		var stopB sync.Once
		DeferCleanup(func() { stopB.Do(b.Stop) })
		e1 := eventuallyPhase(ns, w1.Name, fkv1.PhaseHeld).Status.Epoch
		// A's renewal clock records a lock the moment a look finds its Lease.
		Eventually(func() int { return a.Authority.Memory().Clock }, 10*time.Second).Should(Equal(1))

		By("A's watches stall; B hands the lock to W2, W2 releases, and the Lease is deleted by hand")
		freezer.Freeze()
		w2 := createClaim(ns, "w2", lock, "W2", 300)
		deleteClaim(w1)
		e2 := eventuallyPhase(ns, w2.Name, fkv1.PhaseHeld).Status.Epoch
		Expect(e2).To(Equal(e1 + 1))
		deleteClaim(w2)
		Eventually(func() string { return getLease(ns, lock).Annotations[fkv1.AnnotationClaimUID] }, 10*time.Second).Should(BeEmpty())
		Expect(k8s.Delete(ctx, getLease(ns, lock))).To(Succeed())
		Eventually(func() bool { // B lets its finalizer go: no claim remains
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &coordinationv1.Lease{}))
		}, 10*time.Second).Should(BeTrue())
		stopB.Do(b.Stop)

		By("W3 asks; A's cache relists to the present, and the late reply lands")
		w3 := createClaim(ns, "w3", lock, "W3", 300)
		freezer.Expire()
		releaseRead()
		e3 := eventuallyPhase(ns, w3.Name, fkv1.PhaseHeld).Status.Epoch
		Expect(e3).To(BeNumerically(">", e2), "W3 was granted epoch %d; W2 held %d, W1 %d", e3, e2, e1)
		h.verifyClaims()
		h.verifyLeases()
	})
})

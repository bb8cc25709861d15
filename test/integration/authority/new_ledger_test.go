package authority_test

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
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
)

// loseCreateReply lets the first create of a Lease in namespace ns commit
// and loses its reply.
type loseCreateReply struct {
	ns       string
	armed    atomic.Bool
	happened chan struct{}
	once     sync.Once
}

func (l *loseCreateReply) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/namespaces/"+l.ns+"/leases") || !l.armed.CompareAndSwap(true, false) {
			return next.RoundTrip(req)
		}
		resp, err := next.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		_ = resp.Body.Close()
		l.once.Do(func() { close(l.happened) })
		return nil, errors.New("injected: the reply of the Lease create was lost after it committed")
	})
}

// A new ledger starts with its Lease created free; the first grant is a
// guarded update of it, at least the resourceVersion it replaces, with no
// live read per grant.
var _ = Describe("A new ledger", func() {
	It("starts above every epoch issued before when the free Lease's create reply is lost", func() {
		ns := newNamespace()
		h := recordHistory(ns)
		lost := &loseCreateReply{ns: ns, happened: make(chan struct{})}
		lost.armed.Store(true)
		m, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns}, WrapTransport: lost.wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })

		before := storageRevision()
		w1 := createClaim(ns, "w1", "lost-create", "W1", 30)
		Eventually(lost.happened, 10*time.Second).Should(BeClosed(), "the free Lease was never created")
		e1 := eventuallyPhase(ns, w1.Name, fkv1.PhaseHeld).Status.Epoch
		Expect(e1).To(BeNumerically(">", before), "the first epoch is not above the revision before the Lease existed")
		var leases coordinationv1.LeaseList
		Expect(k8s.List(ctx, &leases, client.InNamespace(ns))).To(Succeed())
		Expect(leases.Items).To(HaveLen(1))
		created, err := strconv.ParseInt(h.firstLease("lost-create").ResourceVersion, 10, 64)
		Expect(err).NotTo(HaveOccurred())
		Expect(e1).To(BeNumerically(">=", created), "the first grant is below the free Lease's resourceVersion")

		w2 := createClaim(ns, "w2", "lost-create", "W2", 30)
		deleteClaim(w1)
		Expect(eventuallyPhase(ns, w2.Name, fkv1.PhaseHeld).Status.Epoch).To(Equal(e1+1), "within a term, +1 per grant")
		h.verifyClaims()
		h.verifyLeases()
	})

	It("is created by one of two authorities at once, and each epoch is granted once", func() {
		ns := newNamespace()
		h := recordHistory(ns)
		a := startManagerWith(envtestutil.ManagerOptions{Namespaces: []string{ns}})
		DeferCleanup(a.Stop)
		b := startManagerWith(envtestutil.ManagerOptions{Namespaces: []string{ns}})
		DeferCleanup(b.Stop)
		var claims []*fkv1.FencedLease
		for i := 0; i < 6; i++ {
			for j := 0; j < 2; j++ {
				claims = append(claims, createClaim(ns, fmt.Sprintf("c%d-%d", i, j), fmt.Sprintf("pair-%d", i), fmt.Sprintf("H%d", j), 30))
			}
		}
		for _, c := range claims {
			Eventually(func() fkv1.FencedLeasePhase { return getClaim(ns, c.Name).Status.Phase }, 30*time.Second).ShouldNot(BeEmpty())
		}
		for i := 0; i < 6; i++ {
			for j := 0; j < 2; j++ {
				c := getClaim(ns, fmt.Sprintf("c%d-%d", i, j))
				if c.Status.Phase == fkv1.PhaseHeld {
					deleteClaim(c)
				}
			}
		}
		for _, c := range claims {
			Eventually(func() bool {
				var got fkv1.FencedLease
				err := k8s.Get(ctx, client.ObjectKeyFromObject(c), &got)
				return apierrors.IsNotFound(err) || got.Status.Phase == fkv1.PhaseHeld
			}, 30*time.Second).Should(BeTrue(), "claim %s never held", c.Name)
		}
		grants := h.verifyClaims()
		h.verifyLeases()
		for i := 0; i < 6; i++ {
			Expect(grants[fmt.Sprintf("pair-%d", i)]).To(HaveLen(2), "lock pair-%d", i)
		}
	})

	// The term floor: a counter set back by hand while no manager runs,
	// after the claims that recorded the epochs above it were deleted.
	// Nothing left records those epochs; the next term's floor, read when
	// the manager starts, is above them.
	It("never reissues an epoch after its counter was set back while the manager was stopped", func() {
		ns := newNamespace()
		m := startManagerWith(envtestutil.ManagerOptions{Namespaces: []string{ns}})
		var last int64
		for i := 0; i < 3; i++ {
			c := createClaim(ns, fmt.Sprintf("early-%d", i), "set-back", "H", 30)
			last = eventuallyPhase(ns, c.Name, fkv1.PhaseHeld).Status.Epoch
			deleteClaim(c)
			Eventually(func() string { return leaseAnnotation(ns, "set-back", fkv1.AnnotationClaimUID) }, 10*time.Second).Should(BeEmpty())
		}
		m.Stop()
		Eventually(func() int {
			var claims fkv1.FencedLeaseList
			Expect(k8s.List(ctx, &claims, client.InNamespace(ns))).To(Succeed())
			return len(claims.Items)
		}, 10*time.Second).Should(BeZero(), "a claim recording an epoch is left")

		By(fmt.Sprintf("an admin sets the counter back from %d to %d", last, last-2))
		l := getLease(ns, "set-back")
		l.Annotations[fkv1.AnnotationEpoch] = epochString(last - 2)
		Expect(k8s.Update(ctx, l)).To(Succeed())

		m2 := startManagerWith(envtestutil.ManagerOptions{Namespaces: []string{ns}})
		DeferCleanup(m2.Stop)
		c := createClaim(ns, "after", "set-back", "H", 30)
		Expect(eventuallyPhase(ns, c.Name, fkv1.PhaseHeld).Status.Epoch).To(BeNumerically(">", last),
			"an epoch issued before the manager stopped was issued again")
	})

	// Leases allow create-on-update: an update of a Lease deleted meanwhile
	// must fail, not create a ledger at a stale counter. The authority's
	// updates carry the Lease's UID, which the apiserver checks as a
	// precondition.
	It("is never created by an update of a Lease deleted meanwhile", func() {
		ns := newNamespace()
		m := startManagerWith(envtestutil.ManagerOptions{Namespaces: []string{ns}})
		c := createClaim(ns, "w1", "deleted", "W1", 30)
		eventuallyPhase(ns, c.Name, fkv1.PhaseHeld)
		m.Stop()
		stale := getLease(ns, "deleted")
		Expect(stale.UID).NotTo(BeEmpty())
		deleteClaim(c)
		gone := stale.DeepCopy()
		gone.Finalizers = nil
		Expect(k8s.Update(ctx, gone)).To(Succeed())
		Expect(k8s.Delete(ctx, getLease(ns, "deleted"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "deleted"}, &coordinationv1.Lease{}))
		}, 10*time.Second).Should(BeTrue())

		stale.ResourceVersion = ""
		stale.Annotations[fkv1.AnnotationEpoch] = "1"
		err := k8s.Update(ctx, stale)
		Expect(err).To(HaveOccurred(), "an update of a deleted Lease created it")
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "deleted"}, &coordinationv1.Lease{}))).To(BeTrue())
	})
})

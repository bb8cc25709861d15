package admission_test

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// A leader hand-over with a standby whose cache trails the old leader's
// last writes (the chart's replicas, with --leader-elect). The new leader's
// cache shows the previous holder W1, then delivers W1's last renewal while
// the grant to W2 that came after it is still on its way. A term that
// decided on that cache would see a renewal, vouch for W1, and its webhook
// would admit W1's write from the cache. The term must first catch up with
// the Leases as they are (CatchUp), and vouch for nothing until its cache
// has.
var _ = Describe("A new leader whose cache trails the previous leader's writes", func() {
	It("does not vouch for the holder its stale cache shows renewing", func() {
		leaderHandover(false)
	})
	// Its cache has not even seen the Lease created: the version CatchUp
	// read must not be taken for one the cache has caught up with (or be
	// dropped) while the cache shows no Lease at all.
	It("does not vouch for it either when its cache had not seen the Lease created", func() {
		leaderHandover(true)
	})
})

// leaderHandover runs the hand-over; with leaseUnseen, B's Lease watch
// stalls before the lock's Lease is created (its claim watch after W1
// holds), so B's first reconciles of the lock see W1's claim Held and no
// Lease.
func leaderHandover(leaseUnseen bool) {
	ns := newNamespace()
	lock := "report-2026-07"
	election := &types.NamespacedName{Namespace: ns, Name: "fencekeeper-leader"}

	By("A leads; B is the standby and serves the webhook")
	a, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{LeaderElection: election, SingleAuthority: true})
	Expect(err).NotTo(HaveOccurred())
	aStopped := false
	DeferCleanup(func() {
		if !aStopped {
			Expect(a.Stop()).To(Succeed())
		}
	})
	Eventually(a.Mgr.Elected(), 20*time.Second).Should(BeClosed())
	// B's Lease watch is held an event at a time; its claim watch is
	// held whole, so its cache stays consistent with itself.
	leases := fault.NewWatchFreezer(func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/leases") })
	claims := fault.NewWatchFreezer(func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/fencedleases") })
	b, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{LeaderElection: election, SingleAuthority: true,
		Webhook: &testEnv.WebhookInstallOptions, WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return claims.Wrap(leases.Wrap(rt)) }})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { leases.Thaw(); claims.Thaw(); Expect(b.Stop()).To(Succeed()) })
	// Both informers run before the freeze (a frozen watch would hold
	// an informer's first list too).
	for _, obj := range []client.Object{&coordinationv1.Lease{}, &fkv1.FencedLease{}} {
		_, err := b.Mgr.GetCache().GetInformer(ctx, obj, cache.BlockUntilSynced(true))
		Expect(err).NotTo(HaveOccurred())
	}
	Consistently(b.Mgr.Elected(), 500*time.Millisecond).ShouldNot(BeClosed())

	key := types.NamespacedName{Namespace: ns, Name: lock}
	if leaseUnseen {
		leases.Freeze()
	}
	w1 := acquire(ns, "w1", lock, "W1", 300)
	Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 by W1", nil))).To(Succeed())
	var granted coordinationv1.Lease
	Expect(k8s.Get(ctx, key, &granted)).To(Succeed())
	if leaseUnseen {
		Eventually(func() fkv1.FencedLeasePhase {
			var c fkv1.FencedLease
			_ = b.Mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(w1), &c)
			return c.Status.Phase
		}, 10*time.Second, 20*time.Millisecond).Should(Equal(fkv1.PhaseHeld))
		Expect(cachedLease(b, key).ResourceVersion).To(BeEmpty(), "B's cache must not have seen the Lease")
	} else {
		Eventually(func() string { return cachedLease(b, key).ResourceVersion }, 10*time.Second, 20*time.Millisecond).Should(Equal(granted.ResourceVersion))
	}

	By("B's watches stall; W1 renews; W2 queues, W1's hold is broken and A grants W2")
	leases.Freeze()
	claims.Freeze()
	renewed := granted.DeepCopy()
	now := metav1.NewMicroTime(time.Now())
	renewed.Spec.RenewTime = &now
	Expect(k8s.Update(ctx, renewed)).To(Succeed())
	w2 := newClaimObj(ns, "w2", lock, "W2", 300)
	Expect(k8s.Create(ctx, w2)).To(Succeed())
	breakHold(ns, w1.Name, "W1 hung")
	w2Held := waitPhase(w2, fkv1.PhaseHeld)
	Expect(w2Held.Status.Epoch).To(BeNumerically(">", w1.Status.Epoch))

	By("A steps down; B leads on a cache that still shows W1 before its renewal")
	Expect(a.Stop()).To(Succeed())
	aStopped = true
	Eventually(b.Mgr.Elected(), 20*time.Second).Should(BeClosed())
	Eventually(b.Authority.CaughtUp, 10*time.Second, 20*time.Millisecond).Should(BeTrue())
	time.Sleep(time.Second) // B's first reconciles of the lock, on the stale cache
	want := granted.ResourceVersion
	if leaseUnseen {
		want = ""
	}
	Expect(cachedLease(b, key).ResourceVersion).To(Equal(want), "B's cache moved on")

	By("B's cache delivers W1's renewal, and not yet the grant to W2")
	if leaseUnseen {
		// First the Lease's creation (free, as every new ledger starts),
		// then W1's grant, each reconciled on its own.
		leases.Step(1)
		Eventually(func() string { return cachedLease(b, key).ResourceVersion }, 10*time.Second, 20*time.Millisecond).ShouldNot(BeEmpty())
		time.Sleep(500 * time.Millisecond)
		leases.Step(1)
		Eventually(func() string { return cachedLease(b, key).ResourceVersion }, 10*time.Second, 20*time.Millisecond).Should(Equal(granted.ResourceVersion))
		time.Sleep(500 * time.Millisecond)
	}
	leases.Step(1)
	Eventually(func() string { return cachedLease(b, key).ResourceVersion }, 10*time.Second, 20*time.Millisecond).Should(Equal(renewed.ResourceVersion))
	Expect(fkv1.ReadLedger(cachedLease(b, key), lock).HeldEpoch()).To(Equal(w1.Status.Epoch))
	vouchesForW1 := func() bool {
		held, _, ok := b.Authority.FreshView(key)
		return ok && held == w1.Status.Epoch
	}
	Consistently(vouchesForW1, 1500*time.Millisecond, 5*time.Millisecond).Should(BeFalse(),
		"the new leader vouched for W1 on a cache behind the grant to W2")

	By("the broken W1 writes with its epoch through B's webhook: refused")
	err = publish(ns, lock, w1.Status.Epoch, "v11' by the broken W1")
	Expect(err).To(HaveOccurred(), "the new leader vouched for W1 on a cache behind the grant to W2")
	Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "refused as stale: %v", err)
	Expect(configMapData(ns, lock)).To(Equal("v11 by W1"))

	By("W2, the holder, writes through B's webhook")
	Expect(publish(ns, lock, w2Held.Status.Epoch, "v12 by W2")).To(Succeed())
	Expect(configMapData(ns, lock)).To(Equal("v12 by W2"))
}

func cachedLease(m *envtestutil.Manager, key types.NamespacedName) *coordinationv1.Lease {
	var l coordinationv1.Lease
	if err := m.Mgr.GetCache().Get(ctx, key, &l); err != nil {
		return &coordinationv1.Lease{}
	}
	return &l
}

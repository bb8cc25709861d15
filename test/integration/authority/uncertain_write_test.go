package authority_test

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// Seed §22's lost reply, on the authority: the grant to the next holder
// commits, its reply is lost, and the manager's Lease cache still shows the
// old holder. If that holder's pod turns ready again meanwhile, a reconcile
// deciding on the stale cache keeps the old holder, and must not vouch for
// it to the webhook (which would then admit the old epoch on its cache
// although the Lease already names the new holder).
var _ = Describe("A Lease write whose reply was lost", func() {
	It("is followed by no view of the old holder until the write's outcome is known", func() {
		ns := newNamespace()
		lock := "lost-reply"
		lost := fault.NewLoseLeaseReply(ns, lock)
		freezer := fault.NewWatchFreezer(func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/leases") })
		m, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{SingleAuthority: true,
			WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
				return freezer.Wrap(lost.Wrap(rt))
			}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { freezer.Thaw(); Expect(m.Stop()).To(Succeed()) })

		// Its authority vouches only for grants decided after its term
		// began (CatchUp).
		Eventually(m.Authority.CaughtUp, 10*time.Second).Should(BeTrue())
		holder := leasePod(ns, "holder", lock, "2", true)
		Eventually(stateOf(ns, holder.Name), 10*time.Second).Should(Equal("Held/1"))
		_, held, _ := podLease(ns, holder.Name)
		waiter := leasePod(ns, "waiter", lock, "300", true)
		Eventually(stateOf(ns, waiter.Name), 10*time.Second).Should(Equal("Pending/"))
		key := types.NamespacedName{Namespace: ns, Name: lock}
		vouched := func() string {
			if held, _, ok := m.Authority.FreshView(key); ok {
				return fkv1.FormatEpoch(held)
			}
			return ""
		}
		// The manager is the only authority: it does vouch for its holder
		// once it sees it renew (for a pod, its readiness come back), else
		// the check below could not fail.
		setReady(holder, false)
		setReady(holder, true)
		Eventually(vouched, 10*time.Second, 20*time.Millisecond).Should(Equal(held))

		By("the holder's pod is not ready for its TTL: the grant to the waiter commits, its reply is lost, the manager's Lease watch stalls")
		freezer.Freeze()
		lost.Armed.Store(true)
		setReady(holder, false)
		Eventually(lost.Happened, 15*time.Second).Should(Receive())
		var live coordinationv1.Lease
		Expect(k8s.Get(ctx, key, &live)).To(Succeed())
		Expect(fkv1.FormatEpoch(fkv1.ReadLedger(&live, lock).HeldEpoch())).NotTo(Equal(held), "the grant committed")

		By("the old holder's pod is ready again before the manager sees the grant: no view vouches for its epoch")
		setReady(holder, true)
		Consistently(vouched, 3*time.Second, 20*time.Millisecond).ShouldNot(Equal(held), "vouched for the old holder on a cache behind a committed grant")

		By("once the watch goes on, the waiter holds")
		freezer.Thaw()
		Eventually(stateOf(ns, waiter.Name), 15*time.Second).Should(Equal("Held/2"))
	})
})

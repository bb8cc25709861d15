package admission_test

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// Seed §22's lost reply, on the authority that serves the webhook: the
// grant to the next holder commits, its reply is lost, and the manager's
// Lease cache still shows the old holder. The old holder's pod turns ready
// again meanwhile, so a reconcile deciding on the stale cache keeps the old
// holder. The old holder then writes its report with its epoch, with its
// pod's own token: every such write must be refused, and the report's
// history must go from the old holder's last version straight to the new
// holder's. (test/integration/authority/uncertain_write_test.go pins the
// authority's view in the same interleaving; this test pins the writes.)
var _ = Describe("A grant whose reply was lost", func() {
	It("lets no write of the old holder through while the manager's cache still shows it", func() {
		ns := newNamespace()
		lock := "report-2026-07"
		lost := fault.NewLoseLeaseReply(ns, lock)
		freezer := fault.NewWatchFreezer(func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/leases") })
		m, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{Webhook: &testEnv.WebhookInstallOptions, SingleAuthority: true,
			WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
				return freezer.Wrap(lost.Wrap(rt))
			}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { freezer.Thaw(); Expect(m.Stop()).To(Succeed()) })
		Eventually(m.Authority.CaughtUp, 10*time.Second).Should(BeTrue())

		By("W1, a pod, holds the lock and writes the report with its epoch")
		workerAccount(ns)
		w1 := leasePod(ns, "w1", lock, "2", true)
		Eventually(func() int64 { return heldEpoch(ns, w1.Name) }, 10*time.Second, 20*time.Millisecond).ShouldNot(BeZero())
		held := heldEpoch(ns, w1.Name)
		asW1 := asPod(w1)
		Expect(asW1.Create(ctx, fencedConfigMap(ns, lock, lock, held, "v1 by W1", nil))).To(Succeed())
		w2 := leasePod(ns, "w2", lock, "300", true)
		Eventually(func() string { s, _, _ := envtestutil.PodLease(ctx, k8s, ns, w2.Name); return s }, 10*time.Second).Should(Equal(fkv1.LeaseStatePending))

		By("the manager vouches for W1 once it sees it renew (its pod ready again), so its webhook answers from its cache")
		setPodReady(w1, false)
		setPodReady(w1, true)
		key := types.NamespacedName{Namespace: ns, Name: lock}
		vouched := func() int64 {
			if held, _, ok := m.Authority.FreshView(key); ok {
				return held
			}
			return 0
		}
		Eventually(vouched, 10*time.Second, 20*time.Millisecond).Should(Equal(held))
		Expect(publishAs(asW1, ns, lock, held, "v2 by W1")).To(Succeed(), "W1 holds: its write is admitted")

		By("W1's pod is not ready for its TTL: the grant to W2 commits, its reply is lost, the manager's Lease watch stalls")
		history := watchConfigMaps(ns)
		DeferCleanup(history.stop)
		freezer.Freeze()
		lost.Armed.Store(true)
		setPodReady(w1, false)
		Eventually(lost.Happened, 15*time.Second).Should(Receive())
		var live coordinationv1.Lease
		Expect(k8s.Get(ctx, key, &live)).To(Succeed())
		granted := fkv1.ReadLedger(&live, lock).HeldEpoch()
		Expect(granted).To(BeNumerically(">", held), "the grant committed")

		By("W1's pod is ready again before the manager sees the grant; W1 writes with its epoch until the watch goes on: every write is refused")
		setPodReady(w1, true)
		deadline := time.Now().Add(3 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			err := publishAs(asW1, ns, lock, held, "stale v"+strconv.Itoa(i)+" by W1")
			Expect(err).To(HaveOccurred(), "W1's write was admitted on a cache behind a committed grant")
			Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "refused as stale: %v", err)
			time.Sleep(50 * time.Millisecond)
		}

		By("once the watch goes on, W2 holds and its write is admitted")
		freezer.Thaw()
		Eventually(func() int64 { return heldEpoch(ns, w2.Name) }, 15*time.Second, 20*time.Millisecond).Should(Equal(granted))
		Expect(publishAs(asPod(w2), ns, lock, granted, "v3 by W2")).To(Succeed())

		By("the report's history: W1's versions, then W2's, nothing stale in between")
		Eventually(func() string {
			v := history.versions(lock)
			if len(v) == 0 {
				return ""
			}
			return v[len(v)-1].Data["report.csv"]
		}, 5*time.Second).Should(Equal("v3 by W2"))
		for _, cm := range history.versions(lock) {
			Expect(cm.Data["report.csv"]).To(BeElementOf("v2 by W1", "v3 by W2"), "version %s", cm.ResourceVersion)
		}
	})
})

// leasePod creates a pod asking for lock, running as the "worker"
// ServiceAccount (workerAccount), and plays its kubelet.
func leasePod(ns, name, lock, ttl string, ready bool) *corev1.Pod {
	p, err := envtestutil.LeasePod(ctx, k8s, ns, name, lock, ttl, ready, func(p *corev1.Pod) { p.Spec.ServiceAccountName = "worker" })
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return p
}

func setPodReady(p *corev1.Pod, ready bool) {
	ExpectWithOffset(1, envtestutil.SetPodReady(ctx, k8s, p, ready)).To(Succeed())
}

// heldEpoch is the epoch the pod bridge published on a pod whose lease is
// Held, or 0.
func heldEpoch(ns, name string) int64 {
	state, epoch, _ := envtestutil.PodLease(ctx, k8s, ns, name)
	if state != fkv1.LeaseStateHeld {
		return 0
	}
	n, _ := strconv.ParseInt(epoch, 10, 64)
	return n
}

package admission_test

import (
	"net/url"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/manager"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// Seed §22's paused coordinator, as the chart runs it: under leader
// election. Leader A (a real process serving the webhook) vouches for its
// cache; it is stopped (SIGSTOP) past its leader lease with the old
// holder's stamped writes queued on its port, and its route to the
// apiserver fails too (its watches and its renewals hang); B takes the
// leadership, the old holder's hold is broken and B grants the next
// holder. When A resumes, its elector starts a new renewal round with a
// fresh deadline and has not noticed that its term is over (for up to
// its renew deadline), and its cache shows the old holder: its webhook
// must not admit the writes on that view. Once the route heals, they are
// refused as stale.
var _ = Describe("A leader paused past its leader lease", func() {
	It("resumes with a stale, stamped write in flight and refuses it", func() {
		ns := newNamespace()
		lock := "report-2026-07"
		longerWebhookTimeout(30)
		addr := freeLocalAddress()

		By("leader A (a real process) serves the webhook")
		server, err := url.Parse(adminCfg.Host)
		Expect(err).NotTo(HaveOccurred())
		route, err := fault.NewProxy(server.Host)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(route.Close)
		a, err := envtestutil.StartManagerProcessVia(ctx, testEnv, k8s, GinkgoT().TempDir(), GinkgoWriter, route,
			// B must lead, break W1's hold and grant W2 well within the
			// webhook's 5 s timeout of W1's paused writes (with a 4 s lease a
			// loaded CI machine took 4.7 s, and the writes timed out first).
			"--leader-elect", "--leader-election-namespace="+ns, "--leader-elect-lease-duration=2s",
			"--leader-elect-renew-deadline=1500ms", "--leader-elect-retry-period=250ms", "--metrics-bind-address="+addr)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(a.Stop)
		w1 := acquire(ns, "w1", lock, "W1", 300)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 by W1", nil))).To(Succeed())
		liveReads := func() float64 {
			return scrapeMetrics(addr).value("fencekeeper_admission_live_lease_reads_total")
		}
		before := liveReads()
		Expect(publish(ns, lock, w1.Status.Epoch, "v12 by W1")).To(Succeed())
		Expect(liveReads()).To(Equal(before), "A must answer W1's writes from its cache (else this test could not fail)")

		By("B is the standby")
		b, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{SingleAuthority: true,
			LeaderElection: &types.NamespacedName{Namespace: ns, Name: manager.LeaderElectionID}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(b.Stop()).To(Succeed()) })
		Consistently(b.Mgr.Elected(), time.Second).ShouldNot(BeClosed())
		w2 := newClaimObj(ns, "w2", lock, "W2", 300)
		Expect(k8s.Create(ctx, w2)).To(Succeed())
		// Several objects W1 wrote, so several of its writes queue at once:
		// on resume each races A's elector noticing that its term is over.
		names := []string{lock, "part-1", "part-2", "part-3", "part-4"}
		var stored []*corev1.ConfigMap
		for _, name := range names {
			if name != lock {
				Expect(k8s.Create(ctx, fencedConfigMap(ns, name, lock, w1.Status.Epoch, "v12 by W1", nil))).To(Succeed())
			}
			var cm corev1.ConfigMap
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm)).To(Succeed())
			stored = append(stored, &cm)
		}
		history := watchConfigMaps(ns)
		DeferCleanup(history.stop)

		By("SIGSTOP leader A; W1's writes, stamped with its epoch, queue on A's webhook port")
		Expect(a.Signal(syscall.SIGSTOP)).To(Succeed())
		route.Partition()
		stopped := true
		DeferCleanup(func() {
			if stopped {
				_ = a.Signal(syscall.SIGCONT)
			}
		})
		result := make(chan error, len(stored))
		for _, cm := range stored {
			go func() {
				defer GinkgoRecover()
				stale := cm.DeepCopy()
				lease.Stamp(stale, lock, w1.Status.Epoch)
				stale.Data = map[string]string{"report.csv": "v13' by W1"}
				result <- k8s.Update(ctx, stale)
			}()
		}

		By("A's leader lease lapses; B leads, W1's hold is broken and B grants W2")
		Eventually(b.Mgr.Elected(), 30*time.Second).Should(BeClosed())
		breakHold(ns, w1.Name, "W1 hung")
		granted := waitPhase(w2, fkv1.PhaseHeld)
		Expect(granted.Status.Epoch).To(BeNumerically(">", w1.Status.Epoch))
		Consistently(result, 200*time.Millisecond).ShouldNot(Receive(), "the write must still be in flight on the stopped leader")

		By("SIGCONT A: it must not admit the write on its old view")
		Expect(a.Signal(syscall.SIGCONT)).To(Succeed())
		stopped = false
		// A's webhook answers now: from its cache (the write lands), or
		// with a live read that waits for the route.
		Consistently(result, 1500*time.Millisecond).ShouldNot(Receive(), "a write was answered before the route healed: from A's stale cache")
		route.Heal()
		for range stored {
			var werr error
			Eventually(result, 25*time.Second).Should(Receive(&werr))
			Expect(werr).To(HaveOccurred(), "the paused leader admitted the broken holder's write")
			Expect(lease.IsStaleEpoch(werr)).To(BeTrue(), "refused, as stale: %v", werr)
		}
		for _, name := range names {
			Expect(configMapData(ns, name)).To(Equal("v12 by W1"))
			for _, cm := range history.versions(name) {
				Expect(cm.Data["report.csv"]).NotTo(ContainSubstring("v13'"), "the stale write landed")
			}
		}
	})
})

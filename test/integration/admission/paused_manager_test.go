package admission_test

import (
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// Seed §22's paused coordinator, on the admission side: the manager that
// serves the webhook is stopped (SIGSTOP) with a stale holder's stamped write
// queued on its port, the lock is granted to the next holder meanwhile (by
// another manager), and the resumed manager must refuse the write although
// its cache last showed that holder as current.
var _ = Describe("A paused webhook-serving manager", func() {
	It("resumes with a stale, stamped write in flight and refuses it", func() {
		ns := newNamespace()
		lock := "report-2026-07"
		longerWebhookTimeout(20)

		By("manager B (in process) is an authority; manager A (a real process) serves the webhook and is an authority too")
		b, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(b.Stop()).To(Succeed()) })
		a := startManagerProcess()
		DeferCleanup(a.Stop)

		w1 := acquire(ns, "w1", lock, "W1", 2) // W1 never renews: it expires 2 s after its grant
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 by W1", nil))).To(Succeed())
		var before corev1.ConfigMap
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &before)).To(Succeed())
		w2 := &fkv1.FencedLease{}
		*w2 = *newClaimObj(ns, "w2", lock, "W2", 300)
		Expect(k8s.Create(ctx, w2)).To(Succeed())
		history := watchConfigMaps(ns)
		DeferCleanup(history.stop)

		By("SIGSTOP manager A; W1's write, stamped with its epoch, queues on A's webhook port")
		Expect(a.Signal(syscall.SIGSTOP)).To(Succeed())
		stopped := true
		DeferCleanup(func() {
			if stopped {
				_ = a.Signal(syscall.SIGCONT)
			}
		})
		result := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			stale := before.DeepCopy()
			lease.Stamp(stale, lock, w1.Status.Epoch)
			stale.Data = map[string]string{"report.csv": "v11' by W1"}
			result <- k8s.Update(ctx, stale)
		}()

		By("W1's lease lapses; manager B grants W2 while A is stopped")
		granted := waitPhase(w2, fkv1.PhaseHeld)
		Expect(granted.Status.Epoch).To(BeNumerically(">", w1.Status.Epoch))
		// A may not even have started its controllers before the stop: when it
		// resumes it sees W1 for the first time with a fresh TTL (right for
		// expiry, late never early), which must not count as proof that W1
		// is alive (this test once caught exactly that).
		Consistently(result, 200*time.Millisecond).ShouldNot(Receive(), "the write must still be in flight on the stopped manager")

		By("SIGCONT manager A: it must not admit the write on its old view")
		Expect(a.Signal(syscall.SIGCONT)).To(Succeed())
		stopped = false
		var werr error
		Eventually(result, 15*time.Second).Should(Receive(&werr))
		Expect(werr).To(HaveOccurred(), "the stale write was admitted")
		Expect(lease.IsStaleEpoch(werr)).To(BeTrue(), "refused, as stale: %v", werr)
		Expect(configMapData(ns, lock)).To(Equal("v11 by W1"))
		for _, cm := range history.versions(lock) {
			Expect(cm.Data["report.csv"]).NotTo(ContainSubstring("v11'"), "the stale write landed")
		}
	})
})

func newClaimObj(ns, name, lock, holder string, ttl int32) *fkv1.FencedLease {
	c := &fkv1.FencedLease{}
	c.Namespace, c.Name = ns, name
	c.Spec = fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: holder, LeaseDurationSeconds: &ttl}
	return c
}

// longerWebhookTimeout raises the fencing webhooks' timeout for one test, so
// a paused manager answers before the apiserver gives up on it.
func longerWebhookTimeout(seconds int32) {
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	Expect(k8s.Get(ctx, types.NamespacedName{Name: testEnv.WebhookInstallOptions.MutatingWebhooks[0].Name}, &cfg)).To(Succeed())
	orig := cfg.DeepCopy()
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].TimeoutSeconds = &seconds
	}
	Expect(k8s.Update(ctx, &cfg)).To(Succeed())
	DeferCleanup(func() {
		var now admissionregistrationv1.MutatingWebhookConfiguration
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(orig), &now)).To(Succeed())
		now.Webhooks = orig.Webhooks
		Expect(k8s.Update(ctx, &now)).To(Succeed())
	})
}

func startManagerProcess() *envtestutil.ManagerProcess {
	By("starting a manager process and waiting until it answers admission")
	p, err := envtestutil.StartManagerProcess(ctx, testEnv, k8s, GinkgoT().TempDir(), GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	return p
}

package admission_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// Several authorities without leader election: the replica serving the
// webhook stops seeing the apiserver's watch events, another replica breaks
// the lock (kubectl fence break) and grants the next holder. The broken
// holder's writes must be refused at once, not only once the stalled
// replica's view of it lapses a TTL later: a replica that is not the only
// authority reads the Lease live.
var _ = Describe("A webhook-serving replica whose watches stalled", func() {
	It("refuses the broken holder's write after another replica broke the lock", func() {
		ns := newNamespace()
		lock := "report-2026-07"

		By("manager A serves the webhook and is an authority; manager B is another authority; no leader election")
		freezer := fault.NewWatchFreezer(nil)
		a, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{Webhook: &testEnv.WebhookInstallOptions,
			WrapTransport: freezer.Wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { freezer.Thaw(); Expect(a.Stop()).To(Succeed()) })
		b, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(b.Stop()).To(Succeed()) })

		w1 := acquire(ns, "w1", lock, "W1", 300)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 by W1", nil))).To(Succeed())
		By("W1 renews, and both authorities see it: each now vouches for W1 for a TTL")
		var l coordinationv1.Lease
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: lock}, &l)).To(Succeed())
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		Expect(k8s.Update(ctx, &l)).To(Succeed())
		Eventually(func() bool {
			var seen coordinationv1.Lease
			return a.Mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(&l), &seen) == nil && seen.ResourceVersion == l.ResourceVersion
		}, 10*time.Second, 20*time.Millisecond).Should(BeTrue())
		time.Sleep(300 * time.Millisecond) // A's reconcile of that renewal

		By("A's watches stall; W2 queues; an operator breaks W1's hold; B grants W2")
		freezer.Freeze()
		time.Sleep(300 * time.Millisecond) // an event already being read gets through
		w2 := newClaimObj(ns, "w2", lock, "W2", 300)
		Expect(k8s.Create(ctx, w2)).To(Succeed())
		breakHold(ns, w1.Name, "W1 hung")
		granted := waitPhase(w2, fkv1.PhaseHeld)
		Expect(granted.Status.Epoch).To(BeNumerically(">", w1.Status.Epoch))
		var cached coordinationv1.Lease
		Expect(a.Mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(&l), &cached)).To(Succeed())
		Expect(fkv1.ReadLedger(&cached, lock).HeldEpoch()).To(Equal(w1.Status.Epoch), "A's cache must still show W1: the watches did not stall")

		By("the broken W1 writes with its epoch; A's webhook must refuse it")
		err = publish(ns, lock, w1.Status.Epoch, "v11' by the broken W1")
		Expect(err).To(HaveOccurred(), "the broken holder's write was admitted on a stalled cache")
		Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "refused as stale: %v", err)
		Expect(configMapData(ns, lock)).To(Equal("v11 by W1"))
	})
})

package admission_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// The authority vouches for the holders it grants: the grant is the
// holder's first renewal, seen by the process that wrote it. A lock new to
// the authority (or forgotten while idle) used to be vouched for only from
// the holder's first renewal on, so a holder with a long TTL, or a pod
// holder (which never writes), had every fenced write read its Lease live.
var _ = Describe("A holder granted a lock new to the only authority", func() {
	It("writes on the authority's cache before it ever renews", func() {
		ns := newNamespace()
		lock := "report-2026-07"
		m, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{Webhook: &testEnv.WebhookInstallOptions, SingleAuthority: true})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })
		Eventually(m.Authority.CaughtUp, 10*time.Second).Should(BeTrue())

		w1 := acquire(ns, "w1", lock, "W1", 300)
		key := types.NamespacedName{Namespace: ns, Name: lock}
		vouched := func() int64 {
			held, _, _ := m.Authority.FreshView(key)
			return held
		}
		// The reconciles that follow the grant (its own Lease and status
		// writes) must not withdraw the view.
		Eventually(vouched, 5*time.Second, 20*time.Millisecond).Should(Equal(w1.Status.Epoch))
		Consistently(vouched, 2*time.Second, 20*time.Millisecond).Should(Equal(w1.Status.Epoch), "the authority stopped vouching for the holder it granted")

		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v0 by W1", nil))).To(Succeed())
		before := liveLeaseReads()
		for i := 1; i <= 5; i++ {
			Expect(publish(ns, lock, w1.Status.Epoch, fmt.Sprintf("v%d by W1", i))).To(Succeed())
		}
		Expect(liveLeaseReads()-before).To(BeZero(), "the holder's writes read the Lease live")
		Expect(configMapData(ns, lock)).To(Equal("v5 by W1"))
	})
})

// liveLeaseReads is fencekeeper_admission_live_lease_reads_total (one per
// process: the in-process managers share it).
func liveLeaseReads() float64 {
	families, err := metrics.Registry.Gather()
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() == "fencekeeper_admission_live_lease_reads_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

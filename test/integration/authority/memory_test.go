package authority_test

import (
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// registrySum sums the gauge or counter values of metric name in this
// process's registry whose label has value (summed over the managers this
// process started).
func registrySum(name, label, value string) float64 {
	families, err := metrics.Registry.Gather()
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					total += s.GetGauge().GetValue() + s.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// reconcileErrors reads controller_runtime_reconcile_errors_total of a
// controller.
func reconcileErrors(controller string) float64 {
	return registrySum("controller_runtime_reconcile_errors_total", "controller", controller)
}

var _ = Describe("The authority's memory", func() {
	It("shrinks back after 200 distinct locks churn: idle locks are forgotten, floors stay only while Leases exist", func() {
		ns := newNamespace()
		// A manager that sees only this namespace, read directly: earlier
		// specs' locks, whose claims expire and hand over on their own
		// timers, and other managers in this process reporting to the same
		// gauges, would move the numbers under this test (CI runs saw
		// both).
		m := startManagerWith(envtestutil.ManagerOptions{ForeignLeaseRecheck: time.Second, Namespaces: []string{ns}})
		DeferCleanup(m.Stop)
		transient := func() float64 {
			mem := m.Authority.Memory()
			return float64(mem.Clock + mem.Views + mem.Expectations + mem.Uncertain)
		}
		baseline := transient()

		const n = 200
		var peak float64
		var mu sync.Mutex
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
					mu.Lock()
					peak = max(peak, transient())
					mu.Unlock()
				}
			}
		}()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 20)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				c := createClaim(ns, fmt.Sprintf("c-%03d", i), fmt.Sprintf("mem-%03d", i), "W", 30)
				deleteClaim(eventuallyPhase(ns, c.Name, fkv1.PhaseHeld))
			}()
		}
		wg.Wait()
		close(stop)
		mu.Lock()
		Expect(peak).To(BeNumerically(">=", baseline+10), "the churn never showed in memory: this test would not see a leak")
		mu.Unlock()
		Eventually(transient, 30*time.Second).Should(BeNumerically("<=", baseline), "idle locks stay in memory")

		var leases coordinationv1.LeaseList
		Expect(k8s.List(ctx, &leases, client.InNamespace(ns), client.MatchingLabels{fkv1.LabelManagedBy: fkv1.ManagedByValue})).To(Succeed())
		Expect(m.Authority.Memory().Floors).To(BeNumerically("<=", len(leases.Items)), "floors of locks without a Lease")
	})
})

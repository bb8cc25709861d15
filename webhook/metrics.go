package webhook

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var (
	decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_admission_decisions_total",
		Help: "Fencing admission decisions by outcome and reason (StaleEpoch, NotCurrentEpoch, FutureEpoch, ...).",
	}, []string{"allowed", "reason"})
	latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencekeeper_admission_duration_seconds",
		Help:    "Time the fencing handler spends on one admission request.",
		Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
	}, []string{"allowed"})
	liveReads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_admission_live_lease_reads_total",
		Help: "Admission requests that read the lock's Lease live because the cache was behind the presented epoch.",
	})
)

func init() {
	metrics.Registry.MustRegister(decisions, latency, liveReads)
	// The series the dashboard and alerts key on exist from the start (at
	// zero): /metrics shows every name, and rate() sees the first one.
	decisions.WithLabelValues("true", string(fkv1.AdmissionEpochAccepted))
	for _, r := range []fkv1.AdmissionReason{fkv1.AdmissionStaleEpoch, fkv1.AdmissionNotCurrentEpoch} {
		decisions.WithLabelValues("false", string(r))
	}
	latency.WithLabelValues("true")
	latency.WithLabelValues("false")
}

func observe(_ admission.Request, allowed bool, reason string, d time.Duration) {
	a := "false"
	if allowed {
		a = "true"
	}
	decisions.WithLabelValues(a, reason).Inc()
	latency.WithLabelValues(a).Observe(d.Seconds())
}

package claimcleanup

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var deleted = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "fencekeeper_expired_claims_deleted_total",
	Help: "Expired claims deleted by the clean-up (--expired-claim-retention after they ended).",
})

func init() { metrics.Registry.MustRegister(deleted) }

package lease

import "github.com/prometheus/client_golang/prometheus"

var (
	transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_client_state_transitions_total", Help: "Lease state transitions by target state (SUSPECT, LOST, ...).",
	}, []string{"to"})
	renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_client_renewals_total", Help: "Renewal attempts by result.",
	}, []string{"result"})
	staleWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_client_stale_writes_total", Help: "Writes the protected object refused as a stale epoch.",
	})
)

// MustRegisterMetrics registers the library's metrics with reg (for example
// prometheus.DefaultRegisterer or controller-runtime's metrics.Registry).
func MustRegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(transitions, renewals, staleWrites)
}

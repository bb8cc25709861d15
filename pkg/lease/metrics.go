package lease

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_client_transitions_total", Help: "Lease state transitions by target state (SUSPECT, LOST, ...).",
	}, []string{"to"})
	renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_client_renewals_total", Help: "Renewal attempts by result.",
	}, []string{"result"})
	staleWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_client_stale_writes_total", Help: "Writes the protected object refused as a stale epoch.",
	})
	renewalDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekeeper_client_renewal_duration_seconds",
		Help:    "Round trip of a successful renewal: from sending the Lease update to its acknowledgement.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	})
	remainingAtAck = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "fencekeeper_client_remaining_ttl_at_ack_seconds",
		Help: "Safe time the holder had left (a TTL after the send time of the previous acknowledged renewal) when a renewal was acknowledged; " +
			"low values are renewals that barely made it. The first renewal of a lease, which anchors the safe time, is not observed.",
		Buckets: []float64{0, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60, 300},
	})
	grants = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_client_grants_total",
		Help: "Grants this process learned of, by where it saw the grant first: source=\"lease\" (the lock's Lease naming the claim " +
			"with an epoch, written first) or source=\"claim\" (the claim's status turning Held).",
	}, []string{"source"})
	workCancelled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_client_work_cancelled_total",
		Help: "Times the library cancelled a holder's work context (Lease.Context) because the lease was lost while held.",
	})
)

// MustRegisterMetrics registers the library's metrics with reg (for example
// prometheus.DefaultRegisterer or controller-runtime's metrics.Registry).
func MustRegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(transitions, renewals, staleWrites, renewalDuration, remainingAtAck, grants, workCancelled)
}

// observeRenewalAck records a renewal sent at sent and acknowledged at
// acked: its round trip, and the safe time that was left by the previous
// acknowledged renewal (sent at prevSent; zero for a lease's first renewal).
func observeRenewalAck(prevSent, sent, acked time.Time, ttl time.Duration) {
	renewalDuration.Observe(max(acked.Sub(sent), 0).Seconds())
	if !prevSent.IsZero() {
		remainingAtAck.Observe(max(prevSent.Add(ttl).Sub(acked), 0).Seconds())
	}
}

// cancelsHeldWork reports whether the transition from to cancels work the
// holder was doing under the lease: a loss while it held the lease (not a
// release, nor a grant that was never renewed and so never handed out).
func cancelsHeldWork(from, to State) bool {
	return to == Lost && (from == Held || from == Suspect)
}

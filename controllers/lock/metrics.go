package lock

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	grants = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_grants_total", Help: "Locks granted (each with a new epoch).",
	})
	expirations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_expirations_total", Help: "Holders expired because no renewal was observed for a TTL.",
	})
	releases = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_releases_total", Help: "Holders released by deleting their claim.",
	})
	floorRepairs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_epoch_floor_repairs_total", Help: "Lease epoch counters found below an epoch already issued (or unreadable) and raised.",
	})
	epochsExhausted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_epochs_exhausted_total", Help: "Reconciles that could not grant a waiter because the lock issued the largest epoch (2^63-1).",
	})
	lockConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_lock_conflicts_total", Help: "Reconciles of locks blocked by a same-named Lease fencekeeper does not manage.",
	})
)

func init() {
	metrics.Registry.MustRegister(grants, expirations, releases, floorRepairs, lockConflicts, epochsExhausted)
}

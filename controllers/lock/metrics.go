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
	memoryLocks = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencekeeper_authority_memory_locks",
		Help: "Locks the authority remembers, per memory: renewal clock, views, expectations (idle locks are forgotten), floors (kept while the lock's Lease exists).",
	}, []string{"memory"})
	lockConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_lock_conflicts_total", Help: "Reconciles of locks blocked by a same-named Lease fencekeeper does not manage.",
	})
)

func init() {
	metrics.Registry.MustRegister(grants, expirations, releases, floorRepairs, lockConflicts, epochsExhausted, memoryLocks)
}

// reportMemory sets fencekeeper_authority_memory_locks from r's maps.
func (r *Reconciler) reportMemory() {
	r.clock.mu.Lock()
	clockN := len(r.clock.seen)
	r.clock.mu.Unlock()
	r.floors.mu.Lock()
	floorsN := len(r.floors.floors)
	r.floors.mu.Unlock()
	r.views.mu.Lock()
	viewsN := len(r.views.m)
	r.views.mu.Unlock()
	r.expect.mu.Lock()
	expectN := len(r.expect.written)
	r.expect.mu.Unlock()
	memoryLocks.WithLabelValues("clock").Set(float64(clockN))
	memoryLocks.WithLabelValues("floors").Set(float64(floorsN))
	memoryLocks.WithLabelValues("views").Set(float64(viewsN))
	memoryLocks.WithLabelValues("expectations").Set(float64(expectN))
}

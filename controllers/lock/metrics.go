package lock

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
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
	acquireTimeoutsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_acquire_timeouts_total", Help: "Waiting claims ended without an epoch because their spec.acquireTimeoutSeconds ran out.",
	})
	queueFullRejections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_queue_full_rejections_total", Help: "New claims turned away because their lock already had --max-waiters-per-lock waiting claims.",
	})
	forcedReleases = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_forced_releases_total", Help: "Holds ended by an operator's forced release (kubectl fence break).",
	})
	lockConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_lock_conflicts_total", Help: "Reconciles of locks blocked by a same-named Lease fencekeeper does not manage.",
	})
	acquireWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekeeper_acquire_wait_seconds",
		Help:    "Time from a claim's creation (its creationTimestamp, 1 s resolution) to its grant, on the granting authority's clock.",
		Buckets: []float64{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600},
	})
	holdDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencekeeper_hold_duration_seconds",
		Help:    "How long a holder held its lock, from its grant (the Lease's acquireTime) to the end of the hold, by how it ended: released, expired, superseded, forced.",
		Buckets: []float64{0.1, 0.5, 1, 5, 15, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 12 * 3600, 24 * 3600, 7 * 24 * 3600},
	}, []string{"ended"})
)

// Values of fencekeeper_hold_duration_seconds{ended}: a fixed set.
const (
	holdEndedReleased   = "released"
	holdEndedExpired    = "expired"
	holdEndedSuperseded = "superseded"
	holdEndedForced     = "forced"
)

func init() {
	metrics.Registry.MustRegister(grants, expirations, releases, forcedReleases, queueFullRejections, acquireTimeoutsTotal, floorRepairs, lockConflicts, epochsExhausted,
		acquireWait, holdDuration, newQueueCollector(gaugeSources, clock.RealClock{}))
	// Every series exists from the start (at zero), so /metrics shows every
	// name and rate() sees the first hold that ends.
	for _, ended := range []string{holdEndedReleased, holdEndedExpired, holdEndedSuperseded, holdEndedForced} {
		holdDuration.WithLabelValues(ended)
	}
}

// holdEndedLabel is the ended label of a holder's end ("" for none).
func holdEndedLabel(end holderEnd) string {
	switch end {
	case holderReleased:
		return holdEndedReleased
	case holderExpired:
		return holdEndedExpired
	case holderGaveUp, holderEpochLost:
		// A hold the ledger could no longer show as the holder's ends as
		// Superseded, like one whose claim was already Expired.
		return holdEndedSuperseded
	case holderForced:
		return holdEndedForced
	}
	return ""
}

// observeAcquireWait records a grant of c at now (once per grant: called
// after the one Lease write that granted it succeeded).
func observeAcquireWait(c *fkv1.FencedLease, now time.Time) {
	if c == nil || c.CreationTimestamp.IsZero() {
		return
	}
	acquireWait.Observe(max(now.Sub(c.CreationTimestamp.Time), 0).Seconds())
}

// observeHoldEnded records the end of the hold the Lease write of a ended
// (at now): from the ended holder's grant, the Lease's acquireTime as read
// before the write, or else its claim's status.acquireTime.
func observeHoldEnded(g gathered, a action, now time.Time) {
	label := holdEndedLabel(a.end)
	if label == "" {
		return
	}
	var since time.Time
	if g.lease != nil && g.lease.Spec.AcquireTime != nil {
		since = g.lease.Spec.AcquireTime.Time
	} else if c := findClaim(g.claims, a.endedUID); c != nil && c.Status.AcquireTime != nil {
		since = c.Status.AcquireTime.Time
	}
	if since.IsZero() {
		return
	}
	holdDuration.WithLabelValues(label).Observe(max(now.Sub(since), 0).Seconds())
}

// Memory returns what r holds in memory now.
func (r *Reconciler) Memory() Memory { return r.memory.counts() }

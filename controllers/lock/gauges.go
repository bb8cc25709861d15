package lock

import (
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// contendedTop is how many locks fencekeeper_contended_locks reports: the
// most contended only, so its cardinality stays bounded.
const contendedTop = 10

// summarizeQueue records the lock's waiters as the action leaves them: the
// claims that may still be granted, less the one this action grants.
func summarizeQueue(m *lockMemory, g gathered, a action) {
	n, oldest := 0, time.Time{}
	for _, c := range g.claims {
		if !grantable(c, g.ledger) || (a.kind == actGrant && a.grantee(c.UID)) {
			continue
		}
		n++
		if t := c.CreationTimestamp.Time; oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	m.waiting, m.oldestWaiter = n, oldest
	m.heldSince = holdStart(g, a)
}

// holdStart is when the hold the action leaves began: now for a grant, the
// Lease's acquireTime (or the claim's) for a kept holder, zero when free.
func holdStart(g gathered, a action) time.Time {
	if a.semaphore {
		return oldestPermit(g, a)
	}
	switch {
	case a.holder == nil:
		return time.Time{}
	case a.kind == actGrant:
		return g.now
	case g.lease != nil && g.lease.Spec.AcquireTime != nil:
		return g.lease.Spec.AcquireTime.Time
	case a.holder.Status.AcquireTime != nil:
		return a.holder.Status.AcquireTime.Time
	}
	return g.now
}

// oldestPermit is when the oldest permit the action leaves live began: its
// claim's acquireTime, now for a permit granted now or whose claim records
// none; zero when no permit is live.
func oldestPermit(g gathered, a action) time.Time {
	var oldest time.Time
	for _, p := range a.permits {
		since := g.now
		if c := findClaim(g.claims, p.UID); c != nil && c.Status.AcquireTime != nil && c.Status.Epoch == p.Epoch {
			since = c.Status.AcquireTime.Time
		}
		if oldest.IsZero() || since.Before(oldest) {
			oldest = since
		}
	}
	return oldest
}

var (
	waitersDesc = prometheus.NewDesc("fencekeeper_waiters",
		"Claims waiting (Pending) across the locks this authority knows.", nil, nil)
	oldestWaiterDesc = prometheus.NewDesc("fencekeeper_oldest_waiter_age_seconds",
		"Age of the oldest waiting claim (from its creationTimestamp); 0 when nobody waits.", nil, nil)
	longestHoldDesc = prometheus.NewDesc("fencekeeper_longest_hold_seconds",
		"How long the longest current hold has lasted (since its grant) across the locks this authority knows; 0 when nothing is held.", nil, nil)
	memoryLocksDesc = prometheus.NewDesc("fencekeeper_authority_memory_locks",
		"Locks the authority remembers, per memory: renewal clock, views, expectations (idle locks are forgotten), floors (kept while the lock's Lease exists).",
		[]string{"memory"}, nil)
	contendedDesc = prometheus.NewDesc("fencekeeper_contended_locks",
		"Waiting claims of the 10 most contended locks (only those: bounded cardinality).", []string{"namespace", "lock"}, nil)
)

// queueCollector computes the waiter and hold gauges from the authorities'
// memories on each scrape: fencekeeper_contended_locks carries the current
// top 10 only, so a lock that stops being contended disappears from it.
type queueCollector struct {
	sources *memorySet
	clock   clock.PassiveClock
}

func newQueueCollector(sources *memorySet, c clock.PassiveClock) *queueCollector {
	return &queueCollector{sources: sources, clock: c}
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- waitersDesc
	ch <- oldestWaiterDesc
	ch <- longestHoldDesc
	ch <- contendedDesc
	ch <- memoryLocksDesc
}

// collectMemory reports fencekeeper_authority_memory_locks, counted on
// the scrape (one pass over the memories) rather than on every reconcile,
// whose cost would then grow with the number of locks. Several authorities
// in one process (tests) are summed.
func (c *queueCollector) collectMemory(ch chan<- prometheus.Metric) {
	var sum Memory
	c.sources.each(func(m *memory) { m.addCounts(&sum) })
	for _, v := range []struct {
		name string
		n    int
	}{{"clock", sum.Clock}, {"floors", sum.Floors}, {"views", sum.Views}, {"expectations", sum.Expectations}, {"uncertain", sum.Uncertain}} {
		ch <- prometheus.MustNewConstMetric(memoryLocksDesc, prometheus.GaugeValue, float64(v.n), v.name)
	}
}

type contended struct {
	lock    types.NamespacedName
	waiting int
}

// more orders by waiters (most first), then by namespace and name.
func (a contended) more(b contended) bool {
	if a.waiting != b.waiting {
		return a.waiting > b.waiting
	}
	if a.lock.Namespace != b.lock.Namespace {
		return a.lock.Namespace < b.lock.Namespace
	}
	return a.lock.Name < b.lock.Name
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	c.collectMemory(ch)
	// Several authorities in one process (tests) may know the same lock:
	// each lock counts once, as the authority that saw the most waiters
	// and the earliest hold shows it.
	type summary struct {
		waiting           int
		oldest, heldSince time.Time
	}
	locks := map[types.NamespacedName]summary{}
	c.sources.each(func(m *memory) {
		m.mu.Lock()
		defer m.mu.Unlock()
		for lock, l := range m.locks {
			if l.waiting <= 0 && l.heldSince.IsZero() {
				continue
			}
			s := locks[lock]
			if l.waiting > s.waiting {
				s.waiting, s.oldest = l.waiting, l.oldestWaiter
			}
			if !l.heldSince.IsZero() && (s.heldSince.IsZero() || l.heldSince.Before(s.heldSince)) {
				s.heldSince = l.heldSince
			}
			locks[lock] = s
		}
	})
	total, oldest, longest := 0, time.Time{}, time.Time{}
	top := make([]contended, 0, contendedTop+1)
	for lock, s := range locks {
		if !s.heldSince.IsZero() && (longest.IsZero() || s.heldSince.Before(longest)) {
			longest = s.heldSince
		}
		if s.waiting <= 0 {
			continue
		}
		total += s.waiting
		if oldest.IsZero() || s.oldest.Before(oldest) {
			oldest = s.oldest
		}
		e := contended{lock: lock, waiting: s.waiting}
		if len(top) == contendedTop && !e.more(top[contendedTop-1]) {
			continue
		}
		i := sort.Search(len(top), func(i int) bool { return e.more(top[i]) })
		top = append(top, contended{})
		copy(top[i+1:], top[i:])
		top[i] = e
		if len(top) > contendedTop {
			top = top[:contendedTop]
		}
	}

	held := 0.0
	if !longest.IsZero() {
		held = max(c.clock.Now().Sub(longest), 0).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(longestHoldDesc, prometheus.GaugeValue, held)
	age := 0.0
	if !oldest.IsZero() {
		age = max(c.clock.Now().Sub(oldest), 0).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(waitersDesc, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(oldestWaiterDesc, prometheus.GaugeValue, age)
	for _, e := range top {
		ch <- prometheus.MustNewConstMetric(contendedDesc, prometheus.GaugeValue, float64(e.waiting), e.lock.Namespace, e.lock.Name)
	}
}

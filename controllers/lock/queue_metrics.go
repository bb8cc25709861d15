package lock

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// contendedTop is how many locks fencekeeper_contended_locks reports: the
// most contended only, so its cardinality stays bounded.
const contendedTop = 10

// queueSummary is, per lock with waiters, how many claims wait and when the
// oldest of them was created, as of the lock's last reconcile. It is all the
// waiter gauges need: a scrape never lists claims. Locks without waiters
// have no entry, and a forgotten (idle) lock loses its entry.
type queueSummary struct {
	mu    sync.Mutex
	locks map[types.NamespacedName]lockQueue
	// heldSince is, per held lock, when its current hold began: what
	// fencekeeper_longest_hold_seconds needs (the hold-duration histogram
	// only sees holds that ended).
	heldSince map[types.NamespacedName]time.Time
}

type lockQueue struct {
	waiting int
	oldest  time.Time // creationTimestamp of the oldest waiter
}

// queues is the process's summary, shared by its reconcilers (one in
// production) and read by the collector registered in init.
var queues = newQueueSummary()

func newQueueSummary() *queueSummary {
	return &queueSummary{locks: map[types.NamespacedName]lockQueue{}, heldSince: map[types.NamespacedName]time.Time{}}
}

// set records lock's waiters (none: the entry goes).
func (q *queueSummary) set(lock types.NamespacedName, waiting int, oldest time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if waiting <= 0 {
		delete(q.locks, lock)
		return
	}
	q.locks[lock] = lockQueue{waiting: waiting, oldest: oldest}
}

// setHold records when lock's current hold began (zero: not held).
func (q *queueSummary) setHold(lock types.NamespacedName, since time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if since.IsZero() {
		delete(q.heldSince, lock)
		return
	}
	q.heldSince[lock] = since
}

func (q *queueSummary) forget(lock types.NamespacedName) {
	q.set(lock, 0, time.Time{})
	q.setHold(lock, time.Time{})
}

func (q *queueSummary) size() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.locks)
}

// summarizeQueue records the lock's waiters as the action leaves them: the
// claims that may still be granted, less the one this action grants.
func (r *Reconciler) summarizeQueue(lock types.NamespacedName, g gathered, a action) {
	n, oldest := 0, time.Time{}
	for _, c := range g.claims {
		if !grantable(c, g.ledger) || (a.kind == actGrant && a.holder != nil && c.UID == a.holder.UID) {
			continue
		}
		n++
		if t := c.CreationTimestamp.Time; oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	r.queue.set(lock, n, oldest)
	r.queue.setHold(lock, holdStart(g, a))
}

// holdStart is when the hold the action leaves began: now for a grant, the
// Lease's acquireTime (or the claim's) for a kept holder, zero when free.
func holdStart(g gathered, a action) time.Time {
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

var (
	waitersDesc = prometheus.NewDesc("fencekeeper_waiters",
		"Claims waiting (Pending) across the locks this authority knows.", nil, nil)
	oldestWaiterDesc = prometheus.NewDesc("fencekeeper_oldest_waiter_age_seconds",
		"Age of the oldest waiting claim (from its creationTimestamp); 0 when nobody waits.", nil, nil)
	longestHoldDesc = prometheus.NewDesc("fencekeeper_longest_hold_seconds",
		"How long the longest current hold has lasted (since its grant) across the locks this authority knows; 0 when nothing is held.", nil, nil)
	contendedDesc = prometheus.NewDesc("fencekeeper_contended_locks",
		"Waiting claims of the 10 most contended locks (only those: bounded cardinality).", []string{"namespace", "lock"}, nil)
)

// queueCollector computes the waiter gauges from a queueSummary on each
// scrape: fencekeeper_contended_locks carries the current top 10 only, so a
// lock that stops being contended disappears from it.
type queueCollector struct {
	q     *queueSummary
	clock clock.PassiveClock
}

func newQueueCollector(q *queueSummary, c clock.PassiveClock) *queueCollector {
	return &queueCollector{q: q, clock: c}
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- waitersDesc
	ch <- oldestWaiterDesc
	ch <- longestHoldDesc
	ch <- contendedDesc
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
	total, oldest := 0, time.Time{}
	top := make([]contended, 0, contendedTop+1)
	c.q.mu.Lock()
	for lock, s := range c.q.locks {
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
	longest := time.Time{}
	for _, since := range c.q.heldSince {
		if longest.IsZero() || since.Before(longest) {
			longest = since
		}
	}
	c.q.mu.Unlock()

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

package lock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// histogram reads the sample count and sum of a histogram series from
// controller-runtime's registry (labels: name=value pairs it must carry).
func histogram(t *testing.T, name string, labels ...string) (uint64, float64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue series
				}
			}
			return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	return 0, 0
}

// gauges reads the gauge series of the named families from g, keyed
// name{label="value",...} with the labels in the order they are exposed.
func gauges(t *testing.T, g prometheus.Gatherer, names ...string) map[string]float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := f.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

func TestMetricsQueueCollector(t *testing.T) {
	g := NewWithT(t)
	fc := clocktesting.NewFakePassiveClock(t0.Add(100 * time.Second))
	q := &memory{locks: map[types.NamespacedName]*lockMemory{}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newQueueCollector(only(q), fc))
	names := []string{"fencekeeper_waiters", "fencekeeper_oldest_waiter_age_seconds", "fencekeeper_contended_locks"}
	contendedKey := func(ns, lock string) string {
		return fmt.Sprintf("fencekeeper_contended_locks{lock=%q,namespace=%q}", lock, ns)
	}

	g.Expect(gauges(t, reg, names...)).To(Equal(map[string]float64{
		"fencekeeper_waiters": 0, "fencekeeper_oldest_waiter_age_seconds": 0,
	}), "nobody waits")

	// 12 contended locks: lock-i has i waiters, the oldest created at t0+i s.
	for i := 1; i <= 12; i++ {
		setWaiting(q, types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("lock-%02d", i)}, i, t0.Add(time.Duration(i)*time.Second))
	}
	want := map[string]float64{"fencekeeper_waiters": 78, "fencekeeper_oldest_waiter_age_seconds": 99}
	for i := 12; i >= 3; i-- {
		want[contendedKey("ns", fmt.Sprintf("lock-%02d", i))] = float64(i)
	}
	g.Expect(gauges(t, reg, names...)).To(Equal(want), "the 10 most contended locks only")

	// The age grows with the clock; a lock leaving the top 10 leaves the
	// metric, and one entering it appears.
	fc.SetTime(t0.Add(160 * time.Second))
	remember(&Reconciler{memory: q}, types.NamespacedName{Namespace: "ns", Name: "lock-01"}, func(m *lockMemory) { m.forget(false) })
	setWaiting(q, types.NamespacedName{Namespace: "ns", Name: "lock-12"}, 0, time.Time{})
	setWaiting(q, types.NamespacedName{Namespace: "other", Name: "hot"}, 50, t0.Add(150*time.Second))
	want = map[string]float64{"fencekeeper_waiters": 115, "fencekeeper_oldest_waiter_age_seconds": 158, contendedKey("other", "hot"): 50}
	for i := 11; i >= 3; i-- {
		want[contendedKey("ns", fmt.Sprintf("lock-%02d", i))] = float64(i)
	}
	g.Expect(gauges(t, reg, names...)).To(Equal(want))

	// Ties are broken by namespace and name, so the top 10 is stable.
	q2 := &memory{locks: map[types.NamespacedName]*lockMemory{}}
	for i := 0; i < 30; i++ {
		setWaiting(q2, types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("tie-%02d", i)}, 1, t0)
	}
	reg2 := prometheus.NewPedanticRegistry()
	reg2.MustRegister(newQueueCollector(only(q2), fc))
	got := gauges(t, reg2, "fencekeeper_contended_locks")
	g.Expect(got).To(HaveLen(contendedTop))
	g.Expect(got).To(HaveKey(contendedKey("ns", "tie-00")))
	g.Expect(got).To(HaveKey(contendedKey("ns", "tie-09")))

	// The process-wide collector is served by the manager's registry.
	g.Expect(gauges(t, metrics.Registry, names...)).To(HaveKey("fencekeeper_waiters"))
	g.Expect(gauges(t, metrics.Registry, names...)).To(HaveKey("fencekeeper_oldest_waiter_age_seconds"))
}

// The summary a reconcile leaves: the claims still waiting once the action
// is done, and nothing once the lock is forgotten.
func TestMetricsQueueSummaryFollowsTheDecision(t *testing.T) {
	g := NewWithT(t)
	r := NewReconciler(nil, nil, nil, Options{})
	lock := types.NamespacedName{Namespace: "reports", Name: "report-2026-07"}
	summarize := func(g gathered, a action) { remember(r, lock, func(m *lockMemory) { summarizeQueue(m, g, a) }) }
	queued := func() (int, time.Time) {
		m, _ := remembered(r, lock)
		return m.waiting, m.oldestWaiter
	}
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	old := claim("old", -5, fkv1.PhaseExpired, 40)
	w2 := claim("w2", 2, fkv1.PhasePending, 0)
	w3 := claim("w3", 3, "", 0) // not queued yet: it waits too
	gath := gathered{snapshot: snapshot{ledger: held(41, "w1"), hasLease: true, claims: []*fkv1.FencedLease{w3, w1, old, w2}}}

	summarize(gath, action{kind: actKeep, holder: w1})
	n, oldest := queued()
	g.Expect(n).To(Equal(2))
	g.Expect(oldest).To(Equal(w2.CreationTimestamp.Time))

	summarize(gath, action{kind: actGrant, holder: w2, end: holderReleased})
	n, oldest = queued()
	g.Expect(n).To(Equal(1), "the grantee no longer waits")
	g.Expect(oldest).To(Equal(w3.CreationTimestamp.Time))

	gath.claims = []*fkv1.FencedLease{w1}
	summarize(gath, action{kind: actKeep, holder: w1})
	n, _ = queued()
	g.Expect(n).To(Equal(0), "a lock without waiters has no waiters in its summary")

	setWaiting(r.memory, lock, 3, t0)
	_, err := actOn(r, lock, gathered{}, action{kind: actIdle})
	g.Expect(err).NotTo(HaveOccurred())
	_, kept := remembered(r, lock)
	g.Expect(kept).To(BeFalse(), "a forgotten lock leaves the summary")
}

// A grant observes its wait; an ended hold its duration, by how it ended.
func TestMetricsGrantAndHoldEnd(t *testing.T) {
	g := NewWithT(t)
	fc := clocktesting.NewFakePassiveClock(t0.Add(100 * time.Second))
	r := NewReconciler(nil, nil, events.NewFakeRecorder(10), Options{Clock: fc})
	lock := types.NamespacedName{Namespace: "reports", Name: "report-2026-07"}
	acquired := metav1.NewMicroTime(t0.Add(40 * time.Second))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lock.Namespace, Name: lock.Name},
		Spec: coordinationv1.LeaseSpec{AcquireTime: &acquired}}
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	w2 := claim("w2", 10, fkv1.PhasePending, 0)
	gath := gathered{snapshot: snapshot{ledger: held(41, "w1"), hasLease: true, claims: []*fkv1.FencedLease{w1, w2}}, lease: lease}

	for _, tc := range []struct {
		end   holderEnd
		label string
	}{
		{holderReleased, "released"},
		{holderExpired, "expired"},
		{holderGaveUp, "superseded"},
		{holderForced, "forced"},
		{holderEpochLost, "superseded"},
	} {
		waits, waitSum := histogram(t, "fencekeeper_acquire_wait_seconds")
		holds, holdSum := histogram(t, "fencekeeper_hold_duration_seconds", "ended", tc.label)
		r.recordLeaseWrite(context.Background(), lock, gath, action{kind: actGrant, holder: w2, epoch: 42,
			end: tc.end, endedUID: w1.UID, endedName: w1.Name})
		gotWaits, gotWaitSum := histogram(t, "fencekeeper_acquire_wait_seconds")
		g.Expect(gotWaits).To(Equal(waits+1), "one grant, one wait observed")
		g.Expect(gotWaitSum-waitSum).To(BeNumerically("~", 90, 1e-9), "created at t0+10s, granted at t0+100s")
		gotHolds, gotHoldSum := histogram(t, "fencekeeper_hold_duration_seconds", "ended", tc.label)
		g.Expect(gotHolds).To(Equal(holds+1), tc.label)
		g.Expect(gotHoldSum-holdSum).To(BeNumerically("~", 60, 1e-9), "acquired at t0+40s, ended at t0+100s")
	}

	// Without a Lease acquireTime, the ended holder's status.acquireTime.
	st := metav1.NewTime(t0.Add(70 * time.Second))
	w1.Status.AcquireTime = &st
	gath.lease = &coordinationv1.Lease{}
	holds, holdSum := histogram(t, "fencekeeper_hold_duration_seconds", "ended", "expired")
	waits, _ := histogram(t, "fencekeeper_acquire_wait_seconds")
	r.recordLeaseWrite(context.Background(), lock, gath, action{kind: actFree, epoch: 41, end: holderExpired, endedUID: w1.UID, endedName: w1.Name})
	gotHolds, gotHoldSum := histogram(t, "fencekeeper_hold_duration_seconds", "ended", "expired")
	g.Expect(gotHolds).To(Equal(holds + 1))
	g.Expect(gotHoldSum - holdSum).To(BeNumerically("~", 30, 1e-9))
	gotWaits, _ := histogram(t, "fencekeeper_acquire_wait_seconds")
	g.Expect(gotWaits).To(Equal(waits), "freeing the lock grants nobody")

	// A write that ends no hold (a repair) observes nothing.
	r.recordLeaseWrite(context.Background(), lock, gath, action{kind: actRepair, holder: w1, epoch: 41})
	gotHolds, _ = histogram(t, "fencekeeper_hold_duration_seconds", "ended", "expired")
	g.Expect(gotHolds).To(Equal(holds + 1))

	g.Expect(holdEndedLabel(holderContinues)).To(BeEmpty())
}

// fencekeeper_longest_hold_seconds follows the holds in progress: a grant
// starts one now, a kept holder's began at the Lease's acquireTime, a free
// or forgotten lock has none.
func TestMetricsLongestHold(t *testing.T) {
	g := NewWithT(t)
	fc := clocktesting.NewFakePassiveClock(t0.Add(100 * time.Second))
	reg := prometheus.NewPedanticRegistry()
	r := NewReconciler(nil, nil, nil, Options{})
	reg.MustRegister(newQueueCollector(only(r.memory), fc))
	summarize := func(lock types.NamespacedName, g gathered, a action) {
		remember(r, lock, func(m *lockMemory) { summarizeQueue(m, g, a) })
	}
	longest := func() float64 {
		return gauges(t, reg, "fencekeeper_longest_hold_seconds")["fencekeeper_longest_hold_seconds"]
	}
	a := types.NamespacedName{Namespace: "reports", Name: "a"}
	b := types.NamespacedName{Namespace: "reports", Name: "b"}
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	w2 := claim("w2", 2, fkv1.PhasePending, 0)

	g.Expect(longest()).To(BeZero(), "nothing held")

	lease := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{AcquireTime: &metav1.MicroTime{Time: t0.Add(10 * time.Second)}}}
	summarize(a, gathered{snapshot: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1}}, lease: lease}, action{kind: actKeep, holder: w1})
	g.Expect(longest()).To(Equal(90.0), "held since the Lease's acquireTime")

	summarize(b, gathered{snapshot: snapshot{ledger: free(7), claims: []*fkv1.FencedLease{w2}, now: t0.Add(95 * time.Second)}}, action{kind: actGrant, holder: w2})
	g.Expect(longest()).To(Equal(90.0), "the longest of the holds")

	summarize(a, gathered{snapshot: snapshot{ledger: held(41, "w1"), claims: nil}}, action{kind: actFree, end: holderReleased})
	g.Expect(longest()).To(Equal(5.0), "a's hold ended: b's (granted 5 s ago) is the longest")

	_, err := actOn(r, b, gathered{}, action{kind: actIdle})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(longest()).To(BeZero(), "a forgotten lock holds nothing")
}

// only is a set of one memory, for a collector of its own.
func only(m *memory) *memorySet { return &memorySet{set: map[*memory]struct{}{m: {}}} }

// setWaiting records lock's waiters in m, as a reconcile would.
func setWaiting(m *memory, lock types.NamespacedName, n int, oldest time.Time) {
	remember(&Reconciler{memory: m}, lock, func(l *lockMemory) { l.waiting, l.oldestWaiter = n, oldest })
}

// Two authorities in one process that both know a lock report it once.
func TestMetricsLockKnownToTwoAuthorities(t *testing.T) {
	g := NewWithT(t)
	fc := clocktesting.NewFakePassiveClock(t0.Add(100 * time.Second))
	a := &memory{locks: map[types.NamespacedName]*lockMemory{}}
	b := &memory{locks: map[types.NamespacedName]*lockMemory{}}
	lock := types.NamespacedName{Namespace: "ns", Name: "busy"}
	setWaiting(a, lock, 3, t0)
	setWaiting(b, lock, 5, t0.Add(10*time.Second))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newQueueCollector(&memorySet{set: map[*memory]struct{}{a: {}, b: {}}}, fc))
	got := gauges(t, reg, "fencekeeper_waiters", "fencekeeper_contended_locks")
	g.Expect(got["fencekeeper_waiters"]).To(Equal(5.0))
	g.Expect(got).To(HaveLen(2))
}

// fencekeeper_authority_memory_locks is counted on the scrape, from the
// memories as they are then (not as a reconcile last left a gauge).
func TestMetricsMemoryLocksOnScrape(t *testing.T) {
	g := NewWithT(t)
	q := &memory{locks: map[types.NamespacedName]*lockMemory{}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newQueueCollector(only(q), clocktesting.NewFakePassiveClock(t0)))
	key := func(m string) string { return fmt.Sprintf("fencekeeper_authority_memory_locks{memory=%q}", m) }
	g.Expect(gauges(t, reg, "fencekeeper_authority_memory_locks")).To(Equal(map[string]float64{
		key("clock"): 0, key("floors"): 0, key("views"): 0, key("expectations"): 0, key("uncertain"): 0,
	}))
	r := &Reconciler{memory: q}
	for i := range 3 {
		remember(r, types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("l%d", i)}, func(m *lockMemory) {
			m.renewalSeen, m.floor = true, int64(10+i)
			m.uncertain = i == 0
		})
	}
	g.Expect(gauges(t, reg, "fencekeeper_authority_memory_locks")).To(Equal(map[string]float64{
		key("clock"): 3, key("floors"): 3, key("views"): 0, key("expectations"): 0, key("uncertain"): 1,
	}))
}

package lease

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// clientMetrics gathers the library's metrics from a registry of their own
// (the way a holder registers them), keyed name or name{to=...}: counters by
// value, histograms by sample count (and name_sum by sample sum).
func clientMetrics(t *testing.T) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	MustRegisterMetrics(reg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
				out[key+"_sum"] = m.GetHistogram().GetSampleSum()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func TestClientMetricsRenewalAck(t *testing.T) {
	before := clientMetrics(t)
	ttl := 15 * time.Second
	t0 := time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC)

	// A lease's first renewal: a round trip, no safe time before it.
	observeRenewalAck(time.Time{}, t0, t0.Add(40*time.Millisecond), ttl)
	// The next, sent 10 s later and acknowledged 2 s after that: 3 s of the
	// first renewal's safe time were left.
	observeRenewalAck(t0, t0.Add(10*time.Second), t0.Add(12*time.Second), ttl)
	// One acknowledged after the safe time ran out: nothing was left.
	observeRenewalAck(t0, t0.Add(14*time.Second), t0.Add(16*time.Second), ttl)

	after := clientMetrics(t)
	delta := func(k string) float64 { return after[k] - before[k] }
	for k, want := range map[string]float64{
		"fencekeeper_client_renewal_duration_seconds":         3,
		"fencekeeper_client_renewal_duration_seconds_sum":     4.04,
		"fencekeeper_client_remaining_ttl_at_ack_seconds":     2,
		"fencekeeper_client_remaining_ttl_at_ack_seconds_sum": 3,
		"fencekeeper_client_transitions_total{to=HELD}":       0,
		"fencekeeper_client_work_cancelled_total":             0,
		"fencekeeper_client_stale_writes_total":               0,
	} {
		if got := delta(k); got < want-1e-9 || got > want+1e-9 {
			t.Errorf("%s moved by %v, want %v", k, got, want)
		}
	}
}

// newTestLease is a Lease with no API client: enough for its state machine.
func newTestLease() *Lease {
	return newLease(&Client{log: logr.Discard()}, "report-2026-07", "w1", Options{})
}

func TestClientMetricsWorkCancelledOnLoss(t *testing.T) {
	before := clientMetrics(t)

	// Held, then lost: the holder's work context is cancelled, and counted.
	lost := newTestLease()
	lost.transition(Acquiring, "test")
	lost.transition(Held, "test")
	lost.transition(Suspect, "test")
	lost.transition(Lost, "test")
	if lost.Context().Err() == nil {
		t.Fatal("a lost lease's work context is not cancelled")
	}
	lost.transition(Lost, "again") // final: no second count

	// Released: cancelled, but not because the lease was lost.
	released := newTestLease()
	released.transition(Acquiring, "test")
	released.transition(Held, "test")
	released.transition(Releasing, "test")
	released.transition(Released, "test")

	// Granted but the first renewal failed: the context was never handed
	// to the holder (Acquire returns an error).
	never := newTestLease()
	never.transition(Acquiring, "test")
	never.transition(Lost, "first renewal failed")

	after := clientMetrics(t)
	for k, want := range map[string]float64{
		"fencekeeper_client_work_cancelled_total":           1,
		"fencekeeper_client_transitions_total{to=LOST}":     2,
		"fencekeeper_client_transitions_total{to=HELD}":     2,
		"fencekeeper_client_transitions_total{to=SUSPECT}":  1,
		"fencekeeper_client_transitions_total{to=RELEASED}": 1,
	} {
		if got := after[k] - before[k]; got != want {
			t.Errorf("%s moved by %v, want %v", k, got, want)
		}
	}
	if _, old := after["fencekeeper_client_state_transitions_total{to=LOST}"]; old {
		t.Error("the old name fencekeeper_client_state_transitions_total is still exported")
	}
}

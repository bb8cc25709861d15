// API writes the manager makes, as the apiserver itself counts them
// (cluster.writes: mutating requests to leases and fencedleases/status,
// minus the apiserver's own identity-Lease heartbeats and the bench's floor
// samples): around a phase's timed part (per grant, per handoff), and over
// one resync window after writes settle (a no-op reconcile of every lock).
package main

import (
	"fmt"
	"time"
)

// window counts the manager's writes and the request costs
// (requestcost.go) from open to close, around a phase's timed part only.
type window struct {
	cl     *cluster
	w0     float64
	times0 requestTimes
}

func (c *cluster) open() *window {
	l, s := c.writes()
	return &window{cl: c, w0: l + s, times0: c.requestTimes()}
}

// close waits a second for writes in flight, then returns the writes and
// request costs since open.
func (w *window) close() (writes float64, cost map[string]float64) {
	time.Sleep(time.Second)
	l, s := w.cl.writes()
	return l + s - w.w0, requestCostMS(w.times0, w.cl.requestTimes())
}

// measureNoopResync waits for the manager to settle, then counts its writes
// over one sync period plus 3s: every lock so far resynced with nothing to do.
func measureNoopResync(cl *cluster, syncPeriod time.Duration) (float64, error) {
	if err := settle(cl); err != nil {
		return 0, err
	}
	l0, s0 := cl.writes()
	time.Sleep(syncPeriod + 3*time.Second)
	l1, s1 := cl.writes()
	return l1 - l0 + s1 - s0, nil
}

// settle waits until the manager has written nothing for 3s (at most 2m).
func settle(cl *cluster) error {
	return settleOn(func() float64 { l, s := cl.writes(); return l + s }, "the manager kept writing for 2m")
}

// settleOn waits until count has not moved for 3s (at most 2m).
func settleOn(count func() float64, what string) error {
	deadline := time.Now().Add(2 * time.Minute)
	n := count()
	for time.Now().Before(deadline) {
		time.Sleep(3 * time.Second)
		n2 := count()
		if n2 == n {
			return nil
		}
		n = n2
	}
	return fmt.Errorf("%s", what)
}

// API writes the manager makes, as the apiserver itself counts them
// (cluster.writes: mutating requests to leases and fencedleases/status,
// minus the apiserver's own identity-Lease heartbeats): around the grant
// latency run (per grant), around the handoff rounds (per handoff), and over
// one resync window after writes settle (a no-op reconcile of every lock).
package main

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// writesAround runs f and returns the writes counted from just before it to
// one second after it returned.
func writesAround(cl *cluster, f func() error) (float64, error) {
	l0, s0 := cl.writes()
	if err := f(); err != nil {
		return 0, err
	}
	time.Sleep(time.Second)
	l1, s1 := cl.writes()
	return l1 - l0 + s1 - s0, nil
}

// measureHandoffWrites is measureHandoff, also returning the writes counted
// around the handoff rounds only (not while the queue is built).
func measureHandoffWrites(ctx context.Context, c client.WithWatch, cl *cluster, waiters, rounds int) (latency, float64, error) {
	var before, after [2]float64
	lat, err := measureHandoffCounting(ctx, c, waiters, rounds, func(b bool) {
		l, s := cl.writes()
		if b {
			before = [2]float64{l, s}
		} else {
			after = [2]float64{l, s}
		}
	})
	return lat, after[0] - before[0] + after[1] - before[1], err
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
	deadline := time.Now().Add(2 * time.Minute)
	l, s := cl.writes()
	for time.Now().Before(deadline) {
		time.Sleep(3 * time.Second)
		l2, s2 := cl.writes()
		if l2 == l && s2 == s {
			return nil
		}
		l, s = l2, s2
	}
	return fmt.Errorf("the manager kept writing for 2m")
}

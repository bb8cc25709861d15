// API writes the manager makes, as the apiserver itself counts them
// (cluster.writes: mutating requests to leases and fencedleases/status,
// minus the apiserver's own identity-Lease heartbeats): around the grant
// latency run (per grant), around the handoff rounds (per handoff), and over
// one resync window after writes settle (a no-op reconcile of every lock).
package main

import (
	"context"
	"fmt"
	"os"
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
// and the request costs (requestcost.go) around the handoff rounds only (not
// while the queue is built).
// With profilePath set, the manager's CPU is profiled for 3 s from the
// first round on, into that file.
func measureHandoffWrites(ctx context.Context, c client.WithWatch, cl *cluster, waiters, rounds int, profilePath string) (held, named latency, writes float64, cost map[string]float64, err error) {
	var before, after [2]float64
	var timesBefore, timesAfter requestTimes
	profiled := make(chan error, 1)
	held, named, err = measureHandoffCounting(ctx, c, waiters, rounds, func(b bool) {
		l, s := cl.writes()
		if b {
			before, timesBefore = [2]float64{l, s}, cl.requestTimes()
			if profilePath != "" {
				go func() { profiled <- cl.profile("profile", 3, profilePath) }()
			}
		} else {
			after, timesAfter = [2]float64{l, s}, cl.requestTimes()
		}
	})
	if profilePath != "" && timesBefore != nil {
		if perr := <-profiled; perr != nil {
			fmt.Fprintln(os.Stderr, "bench: handoff CPU profile:", perr)
		}
	}
	return held, named, after[0] - before[0] + after[1] - before[1], requestCostMS(timesBefore, timesAfter), err
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

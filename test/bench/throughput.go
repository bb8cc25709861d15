// Throughput: `conc` workers, each on a lock of its own whose Lease exists
// (one untimed cycle each first), run grant cycles (create a claim, wait
// until it is seen Held, delete it) until `cycles` are done: grants/s. It
// is judged against the chain floor (chainfloor.go: the same cycle's
// requests, replayed at the same concurrency with no authority), and
// reported beside RV-guarded updates of as many distinct Leases with the
// same concurrency (the floor's updates/s).
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// grantThroughput: grant cycles on conc existing locks at once.
func grantThroughput(ctx context.Context, c client.WithWatch, cycles, conc int) (float64, error) {
	ns, h, err := watchedNS(ctx, c, "grants")
	if err != nil {
		return 0, err
	}
	defer h.stop()
	cycle := func(w, j int) error {
		name := fmt.Sprintf("w%d-%d", w, j)
		ch := h.expect(name)
		if err := c.Create(ctx, claim(ns, name, "lock-"+strconv.Itoa(w), 3600)); err != nil {
			return err
		}
		if _, err := wait(ch, 30*time.Second); err != nil {
			return err
		}
		return c.Delete(ctx, claim(ns, name, "", 0))
	}
	if err := workers(conc, func(w int) error { return cycle(w, 0) }); err != nil {
		return 0, err
	}
	if err := waitFree(ctx, c, ns, conc); err != nil {
		return 0, err
	}
	return timedCycles(cycles, conc, cycle)
}

// timedCycles runs cycle(w, 1) .. cycle(w, cycles/conc) on each of conc
// workers w at once: cycles a second.
func timedCycles(cycles, conc int, cycle func(w, j int) error) (float64, error) {
	per := cycles / conc
	start := time.Now()
	err := workers(conc, func(w int) error {
		for j := 1; j <= per; j++ {
			if err := cycle(w, j); err != nil {
				return err
			}
		}
		return nil
	})
	return float64(per*conc) / time.Since(start).Seconds(), err
}

// workers runs f(0) .. f(n-1) at once.
func workers(n int, f func(w int) error) error {
	var g errgroup.Group
	for w := 0; w < n; w++ {
		g.Go(func() error { return f(w) })
	}
	return g.Wait()
}

// floorThroughput: RV-guarded updates of n distinct Leases with the given concurrency.
func floorThroughput(ctx context.Context, c client.Client, n, conc int) (float64, error) {
	ns, err := newNS(ctx, c, "floortp")
	if err != nil {
		return 0, err
	}
	leases := make([]*coordinationv1.Lease, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := range leases {
		g.Go(func() error {
			leases[i] = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "l" + strconv.Itoa(i)}}
			return c.Create(gctx, leases[i])
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	start := time.Now()
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := range leases {
		g.Go(func() error {
			now := metav1.NewMicroTime(time.Now())
			leases[i].Spec.RenewTime = &now
			return c.Update(gctx, leases[i])
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

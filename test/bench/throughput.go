// Throughput: claims on `locks` free locks created with `conc` workers until
// all are seen Held (grants/s), against RV-guarded updates of as many
// distinct Leases with the same concurrency (the floor's updates/s).
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

// grantThroughput: claims on `locks` free locks at once -> all Held.
func grantThroughput(ctx context.Context, c client.WithWatch, locks, conc int) (float64, error) {
	ns, h, err := watchedNS(ctx, c, "grants")
	if err != nil {
		return 0, err
	}
	defer h.stop()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := 0; i < locks; i++ {
		g.Go(func() error { return c.Create(gctx, claim(ns, "c"+strconv.Itoa(i), "lock-"+strconv.Itoa(i), 3600)) })
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	for h.countHeld() < locks {
		if time.Since(start) > 5*time.Minute {
			return 0, fmt.Errorf("only %d of %d granted after 5m", h.countHeld(), locks)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return float64(locks) / time.Since(start).Seconds(), nil
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

// Scale: `claims` claims over `locks` locks created with `conc` workers,
// until every lock has one Held claim and the rest are Pending; then the
// manager's RSS (VmRSS) and whether every grant was correct (one Held per
// lock, at its first epoch).
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// scale: claims over locks (claims/locks per lock), all granted or queued;
// returns the manager's RSS and whether every grant was correct.
func scale(ctx context.Context, c client.WithWatch, cl *cluster, claims, locks, conc int) (float64, bool, string, error) {
	ns, err := newNS(ctx, c, "scale")
	if err != nil {
		return 0, false, "", err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := 0; i < claims; i++ {
		g.Go(func() error {
			return c.Create(gctx, claim(ns, "c"+strconv.Itoa(i), "lock-"+strconv.Itoa(i%locks), 3600))
		})
	}
	if err := g.Wait(); err != nil {
		return 0, false, "", err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var list fkv1.FencedLeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0, false, "", err
		}
		held, pending := 0, 0
		heldPerLock := map[string]int{}
		badEpoch := 0
		for _, it := range list.Items {
			switch it.Status.Phase {
			case fkv1.PhaseHeld:
				held++
				heldPerLock[it.Spec.LockName]++
				// A lock's first grant is at the storage revision: a
				// positive epoch, one per lock (checked below).
				if it.Status.Epoch < 1 {
					badEpoch++
				}
			case fkv1.PhasePending:
				pending++
			}
		}
		if held+pending == claims && held == locks {
			correct := badEpoch == 0
			for _, n := range heldPerLock {
				if n != 1 {
					correct = false
				}
			}
			time.Sleep(2 * time.Second)
			return cl.rssMiB(), correct, fmt.Sprintf("%d held (one per lock, first epochs: %v), %d queued", held, correct, pending), nil
		}
		if time.Now().After(deadline) {
			return 0, false, "", fmt.Errorf("after 10m: %d held, %d pending of %d", held, pending, claims)
		}
		time.Sleep(time.Second)
	}
}

// Handoff latency: one holder plus `waiters` claims on the same lock, all
// Pending (queue in place) first; delete the holder's claim and stop the
// clock when the namespace watch sees the next waiter Held; `rounds`
// handoffs in a row. markHook lets writes.go count writes around the rounds.
package main

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// markHook, when set, is called before (true) and after (false) the handoff
// rounds, to count writes around them only.
var markHook func(before bool)

func measureHandoffCounting(ctx context.Context, c client.WithWatch, waiters, rounds int, mark func(before bool)) (latency, error) {
	markHook = mark
	defer func() { markHook = nil }()
	return measureHandoff(ctx, c, waiters, rounds)
}

// handoff: holder deletes its claim -> the next waiter's watch sees Held,
// with `waiters` claims queued; rounds handoffs in a row.
func measureHandoff(ctx context.Context, c client.WithWatch, waiters, rounds int) (latency, error) {
	ns, err := newNS(ctx, c, fmt.Sprintf("handoff%d", waiters))
	if err != nil {
		return latency{}, err
	}
	h, err := watchHeld(ctx, c, ns)
	if err != nil {
		return latency{}, err
	}
	defer h.stop()
	total := waiters + rounds
	names := make([]string, total+1)
	for i := range names {
		names[i] = fmt.Sprintf("c%05d", i)
	}
	first := h.expect(names[0])
	if err := c.Create(ctx, claim(ns, names[0], "lock", 3600)); err != nil {
		return latency{}, err
	}
	if _, err := wait(first, 30*time.Second); err != nil {
		return latency{}, err
	}
	// Queue in name order within one creationTimestamp second is FIFO by name.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 1; i <= total; i++ {
		g.Go(func() error { return c.Create(gctx, claim(ns, names[i], "lock", 3600)) })
	}
	if err := g.Wait(); err != nil {
		return latency{}, err
	}
	// Measure handoffs with the queue in place: every waiter's Queued
	// status written.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var list fkv1.FencedLeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return latency{}, err
		}
		pending := 0
		for _, it := range list.Items {
			if it.Status.Phase == fkv1.PhasePending {
				pending++
			}
		}
		if pending == total {
			break
		}
		if time.Now().After(deadline) {
			return latency{}, fmt.Errorf("only %d of %d waiters queued after 5m", pending, total)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var d []time.Duration
	holder := names[0]
	if markHook != nil {
		markHook(true)
	}
	defer func() {
		if markHook != nil {
			time.Sleep(time.Second)
			markHook(false)
		}
	}()
	for r := 0; r < rounds; r++ {
		var list fkv1.FencedLeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return latency{}, err
		}
		next := nextPending(list.Items)
		if next == "" {
			return latency{}, fmt.Errorf("no waiter left")
		}
		ch := h.expect(next)
		start := time.Now()
		if err := c.Delete(ctx, claim(ns, holder, "lock", 300)); err != nil {
			return latency{}, err
		}
		t, err := wait(ch, 30*time.Second)
		if err != nil {
			return latency{}, fmt.Errorf("handoff to %s: %w", next, err)
		}
		d = append(d, t.Sub(start))
		holder = next
	}
	return summarize(d), nil
}

func nextPending(items []fkv1.FencedLease) string {
	var best *fkv1.FencedLease
	for i := range items {
		it := &items[i]
		if it.Status.Phase != fkv1.PhasePending {
			continue
		}
		if best == nil || it.CreationTimestamp.Before(&best.CreationTimestamp) ||
			(it.CreationTimestamp.Equal(&best.CreationTimestamp) && it.Name < best.Name) {
			best = it
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}

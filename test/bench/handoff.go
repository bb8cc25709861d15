// Handoff latency: one holder plus `waiters` claims on the same lock, all
// Pending (queue in place) first; delete the holder's claim and stop the
// clock when the namespace watch sees the next waiter Held; `rounds`
// handoffs, spaced with jitter, a floor round trip between consecutive
// ones. Queues of fewer than 1,000 are topped up before each round (a new
// waiter created and seen Pending before the clock starts), so every
// handoff has `waiters` waiters; the 1,000-waiter queue starts with 1,000 +
// rounds instead, so the writes counted around its rounds are the
// handoffs' alone.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// measureHandoff: holder deletes its claim -> the next waiter's watch sees
// Held, with `waiters` claims queued; the manager's writes and the request
// costs are counted around the rounds only. With profilePath set, the
// manager's CPU is profiled for 3 s from the first round on, into that file.
func measureHandoff(ctx context.Context, c client.WithWatch, cl *cluster, waiters, rounds int, profilePath string) (timed, error) {
	ns, err := newNS(ctx, c, fmt.Sprintf("handoff%d", waiters))
	if err != nil {
		return timed{}, err
	}
	h, err := watchHeld(ctx, c, ns)
	if err != nil {
		return timed{}, err
	}
	defer h.stop()
	f, err := newFloorSampler(ctx, c)
	if err != nil {
		return timed{}, err
	}
	topUp := waiters < 1000
	queued := waiters
	if !topUp {
		queued += rounds
	}
	name := func(i int) string { return fmt.Sprintf("c%05d", i) }
	first := h.expect(name(0))
	if err := c.Create(ctx, claim(ns, name(0), "lock", 3600)); err != nil {
		return timed{}, err
	}
	if _, err := wait(first, 30*time.Second); err != nil {
		return timed{}, err
	}
	// Queue in name order within one creationTimestamp second is FIFO by name.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 1; i <= queued; i++ {
		g.Go(func() error { return c.Create(gctx, claim(ns, name(i), "lock", 3600)) })
	}
	if err := g.Wait(); err != nil {
		return timed{}, err
	}
	// Measure handoffs with the queue in place: every waiter's Queued
	// status written. The queue's order is read once, before the rounds:
	// listing every claim in each round would load the apiserver (a
	// 1,000-claim list is tens of ms of its CPU) right when the next
	// handoff is timed. Top-ups join at its end.
	var queue []string
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var list fkv1.FencedLeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return timed{}, err
		}
		if queue = pendingInOrder(list.Items); len(queue) == queued {
			break
		}
		if time.Now().After(deadline) {
			return timed{}, fmt.Errorf("only %d of %d waiters queued after 5m", len(queue), queued)
		}
	}
	w := cl.open()
	profiled := make(chan error, 1)
	if profilePath != "" {
		go func() { profiled <- cl.profile("profile", 3, profilePath) }()
	}
	var d, dn []time.Duration
	holder := name(0)
	for r := 0; r < rounds; r++ {
		if topUp && r > 0 {
			next := name(queued + r)
			ch := h.expectPending(next)
			if err := c.Create(ctx, claim(ns, next, "lock", 3600)); err != nil {
				return timed{}, err
			}
			if _, err := wait(ch, 30*time.Second); err != nil {
				return timed{}, fmt.Errorf("top-up %s not queued: %w", next, err)
			}
			queue = append(queue, next)
		}
		// The FIFO head: a wrong guess times out below.
		next := queue[r]
		ch, chn := h.expect(next), h.expectNamed(next)
		start := time.Now()
		if err := c.Delete(ctx, claim(ns, holder, "lock", 300)); err != nil {
			return timed{}, err
		}
		t, err := wait(ch, 30*time.Second)
		if err != nil {
			return timed{}, fmt.Errorf("handoff to %s: %w", next, err)
		}
		tn, err := wait(chn, 30*time.Second)
		if err != nil {
			return timed{}, fmt.Errorf("no Lease named %s: %w", next, err)
		}
		d, dn = append(d, t.Sub(start)), append(dn, tn.Sub(start))
		holder = next
		if err := f.sample(ctx); err != nil {
			return timed{}, err
		}
		spacing()
	}
	res := timed{held: summarize(d), named: summarize(dn), floor: f.latency()}
	res.writes, res.cost = w.close()
	if profilePath != "" {
		if err := <-profiled; err != nil {
			fmt.Fprintln(os.Stderr, "bench: handoff CPU profile:", err)
		}
	}
	return res, nil
}

// pendingInOrder is the Pending claims in queue order: FIFO by
// creationTimestamp, then by name.
func pendingInOrder(items []fkv1.FencedLease) []string {
	var pending []*fkv1.FencedLease
	for i := range items {
		if items[i].Status.Phase == fkv1.PhasePending {
			pending = append(pending, &items[i])
		}
	}
	sort.Slice(pending, func(i, j int) bool {
		a, b := pending[i], pending[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	names := make([]string, len(pending))
	for i, p := range pending {
		names[i] = p.Name
	}
	return names
}

// Handoff latency: one holder plus `waiters` claims on the same lock, all
// Pending (queue in place) first; delete the holder's claim and stop the
// clock when the namespace watch sees the next waiter Held; `rounds`
// handoffs in a row. markHook lets writes.go count writes around the rounds.
package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// markHook, when set, is called before (true) and after (false) the handoff
// rounds, to count writes around them only.
var markHook func(before bool)

func measureHandoffCounting(ctx context.Context, c client.WithWatch, waiters, rounds int, mark func(before bool)) (held, named latency, err error) {
	markHook = mark
	defer func() { markHook = nil }()
	return measureHandoff(ctx, c, waiters, rounds)
}

// handoff: holder deletes its claim -> the next waiter's watch sees Held
// (held), and -> a watch of the Lease sees it name that waiter (named), with
// `waiters` claims queued; rounds handoffs in a row.
func measureHandoff(ctx context.Context, c client.WithWatch, waiters, rounds int) (held, named latency, err error) {
	ns, err := newNS(ctx, c, fmt.Sprintf("handoff%d", waiters))
	if err != nil {
		return latency{}, latency{}, err
	}
	h, err := watchHeld(ctx, c, ns)
	if err != nil {
		return latency{}, latency{}, err
	}
	defer h.stop()
	total := waiters + rounds
	names := make([]string, total+1)
	for i := range names {
		names[i] = fmt.Sprintf("c%05d", i)
	}
	first := h.expect(names[0])
	if err := c.Create(ctx, claim(ns, names[0], "lock", 3600)); err != nil {
		return latency{}, latency{}, err
	}
	if _, err := wait(first, 30*time.Second); err != nil {
		return latency{}, latency{}, err
	}
	// Queue in name order within one creationTimestamp second is FIFO by name.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 1; i <= total; i++ {
		g.Go(func() error { return c.Create(gctx, claim(ns, names[i], "lock", 3600)) })
	}
	if err := g.Wait(); err != nil {
		return latency{}, latency{}, err
	}
	// Measure handoffs with the queue in place: every waiter's Queued
	// status written.
	// The queue's order is read once, before the rounds: listing every
	// claim in each round would load the apiserver (a 1,000-claim list is
	// tens of ms of its CPU) right when the next handoff is timed.
	var queue []string
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var list fkv1.FencedLeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return latency{}, latency{}, err
		}
		if queue = pendingInOrder(list.Items); len(queue) == total {
			break
		}
		if time.Now().After(deadline) {
			return latency{}, latency{}, fmt.Errorf("only %d of %d waiters queued after 5m", len(queue), total)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var d, dn []time.Duration
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
		// The FIFO head: a wrong guess times out below.
		next := queue[r]
		ch, chn := h.expect(next), h.expectNamed(next)
		start := time.Now()
		if err := c.Delete(ctx, claim(ns, holder, "lock", 300)); err != nil {
			return latency{}, latency{}, err
		}
		t, err := wait(ch, 30*time.Second)
		if err != nil {
			return latency{}, latency{}, fmt.Errorf("handoff to %s: %w", next, err)
		}
		tn, err := wait(chn, 30*time.Second)
		if err != nil {
			return latency{}, latency{}, fmt.Errorf("no Lease named %s: %w", next, err)
		}
		d, dn = append(d, t.Sub(start)), append(dn, tn.Sub(start))
		holder = next
	}
	return summarize(d), summarize(dn), nil
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

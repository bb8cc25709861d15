package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// heldWatch timestamps, from one watch on a namespace, the first moment each
// claim is seen Held: what a holder's own watch would see.
type heldWatch struct {
	mu      sync.Mutex
	held    map[string]time.Time
	waiters map[string]chan time.Time
	stop    func()
}

func watchHeld(ctx context.Context, c client.WithWatch, ns string) (*heldWatch, error) {
	w, err := c.Watch(ctx, &fkv1.FencedLeaseList{}, client.InNamespace(ns))
	if err != nil {
		return nil, err
	}
	h := &heldWatch{held: map[string]time.Time{}, waiters: map[string]chan time.Time{}, stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			now := time.Now()
			cl, ok := ev.Object.(*fkv1.FencedLease)
			if !ok || cl.Status.Phase != fkv1.PhaseHeld {
				continue
			}
			h.mu.Lock()
			if _, seen := h.held[cl.Name]; !seen {
				h.held[cl.Name] = now
				if ch, ok := h.waiters[cl.Name]; ok {
					ch <- now
				}
			}
			h.mu.Unlock()
		}
	}()
	return h, nil
}

// expect registers interest in a claim before it can be granted.
func (h *heldWatch) expect(name string) chan time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan time.Time, 1)
	if t, ok := h.held[name]; ok {
		ch <- t
	} else {
		h.waiters[name] = ch
	}
	return ch
}

func (h *heldWatch) countHeld() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

func wait(ch chan time.Time, d time.Duration) (time.Time, error) {
	select {
	case t := <-ch:
		return t, nil
	case <-time.After(d):
		return time.Time{}, fmt.Errorf("not granted within %v", d)
	}
}

func claim(ns, name, lock string, ttl int32) *fkv1.FencedLease {
	return &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(ttl)}}
}

// watchedNS creates a namespace and starts watching its claims.
func watchedNS(ctx context.Context, c client.WithWatch, prefix string) (string, *heldWatch, error) {
	ns, err := newNS(ctx, c, prefix)
	if err != nil {
		return "", nil, err
	}
	h, err := watchHeld(ctx, c, ns)
	return ns, h, err
}

func newNS(ctx context.Context, c client.Client, prefix string) (string, error) {
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1000000)
	return ns, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
}

// floor: one resourceVersion-guarded Lease update round trip.
func measureFloor(ctx context.Context, c client.Client, n int) (latency, error) {
	ns, err := newNS(ctx, c, "floor")
	if err != nil {
		return latency{}, err
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "floor"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("bench")}}
	if err := c.Create(ctx, l); err != nil {
		return latency{}, err
	}
	var d []time.Duration
	for i := 0; i < n; i++ {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		start := time.Now()
		if err := c.Update(ctx, l); err != nil { // carries l.ResourceVersion
			return latency{}, err
		}
		d = append(d, time.Since(start))
	}
	return summarize(d), nil
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

// grant: claim created on a free lock -> the holder's watch sees Held.
func measureGrant(ctx context.Context, c client.WithWatch, n int) (latency, error) {
	ns, h, err := watchedNS(ctx, c, "grant")
	if err != nil {
		return latency{}, err
	}
	defer h.stop()
	var d []time.Duration
	for i := 0; i < n; i++ {
		name := "g" + strconv.Itoa(i)
		ch := h.expect(name)
		start := time.Now()
		if err := c.Create(ctx, claim(ns, name, "lock-"+strconv.Itoa(i), 3600)); err != nil {
			return latency{}, err
		}
		t, err := wait(ch, 30*time.Second)
		if err != nil {
			return latency{}, err
		}
		d = append(d, t.Sub(start))
	}
	return summarize(d), nil
}

// markHook, when set, is called before (true) and after (false) the handoff
// rounds, to count writes around them only.
var markHook func(before bool)

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

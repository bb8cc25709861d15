// Grant latency: create a claim on a free lock and stop the clock when the
// namespace watch sees it Held (and, diagnostic, when a Lease is first seen
// naming it); n grants, each on a lock of its own, spaced with jitter, a
// floor round trip between consecutive grants. Two figures: on new locks
// (no Lease yet: the authority creates it free, then updates it) and on
// existing ones (a Lease left free by an earlier grant and release, made
// before the clock starts).
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// timed is a sampled phase's figures: the clock stopped when the claim's
// watch sees it Held (held) and when a Lease watch first sees the Lease
// name it (named); the floor sampled between the phase's samples; the
// manager's writes and the request costs around the timed part.
type timed struct {
	held, named, floor latency
	writes             float64
	cost               map[string]float64
}

// measureGrant: claim created on a free lock -> Held, n times.
func measureGrant(ctx context.Context, c client.WithWatch, cl *cluster, n int, existing bool) (timed, error) {
	ns, h, err := watchedNS(ctx, c, "grant")
	if err != nil {
		return timed{}, err
	}
	defer h.stop()
	f, err := newFloorSampler(ctx, c)
	if err != nil {
		return timed{}, err
	}
	if existing {
		if err := freeLeases(ctx, c, h, ns, n); err != nil {
			return timed{}, err
		}
	}
	w := cl.open()
	var d, dn []time.Duration
	for i := 0; i < n; i++ {
		name := "g" + strconv.Itoa(i)
		ch, chn := h.expect(name), h.expectNamed(name)
		start := time.Now()
		if err := c.Create(ctx, claim(ns, name, "lock-"+strconv.Itoa(i), 3600)); err != nil {
			return timed{}, err
		}
		t, err := wait(ch, 30*time.Second)
		if err != nil {
			return timed{}, err
		}
		tn, err := wait(chn, 30*time.Second)
		if err != nil {
			return timed{}, fmt.Errorf("no Lease named %s: %w", name, err)
		}
		d, dn = append(d, t.Sub(start)), append(dn, tn.Sub(start))
		if err := f.sample(ctx); err != nil {
			return timed{}, err
		}
		spacing()
	}
	res := timed{held: summarize(d), named: summarize(dn), floor: f.latency()}
	res.writes, res.cost = w.close()
	return res, nil
}

// freeLeases leaves locks lock-0 .. lock-(n-1) of ns with a Lease and no
// holder: each is granted once and released, and the authority has freed
// every Lease before it returns.
func freeLeases(ctx context.Context, c client.WithWatch, h *heldWatch, ns string, n int) error {
	for i := 0; i < n; i++ {
		name := "prep" + strconv.Itoa(i)
		ch := h.expect(name)
		if err := c.Create(ctx, claim(ns, name, "lock-"+strconv.Itoa(i), 3600)); err != nil {
			return err
		}
		if _, err := wait(ch, 30*time.Second); err != nil {
			return err
		}
		if err := c.Delete(ctx, claim(ns, name, "", 0)); err != nil {
			return err
		}
	}
	return waitFree(ctx, c, ns, n)
}

// waitFree waits until ns has n Leases and none names a holder (at most 2m).
func waitFree(ctx context.Context, c client.Client, ns string, n int) error {
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var list coordinationv1.LeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		free := 0
		for i := range list.Items {
			if fkv1.ReadLedger(&list.Items[i], list.Items[i].Name).HolderClaim == "" {
				free++
			}
		}
		if free == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d Leases free 2m after their release", free, n)
		}
	}
}

// Grant latency: create a claim on a free lock (a new lock each time) and
// stop the clock when the namespace watch sees it Held; n grants in a row.
// Also when a Lease is first seen naming it (the Lease path, diagnostic).
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// grant: claim created on a free lock -> the holder's watch sees Held
// (held), and -> a watch of the Lease sees it name the claim (named).
func measureGrant(ctx context.Context, c client.WithWatch, n int) (held, named latency, err error) {
	ns, h, err := watchedNS(ctx, c, "grant")
	if err != nil {
		return latency{}, latency{}, err
	}
	defer h.stop()
	var d, dn []time.Duration
	for i := 0; i < n; i++ {
		name := "g" + strconv.Itoa(i)
		ch, chn := h.expect(name), h.expectNamed(name)
		start := time.Now()
		if err := c.Create(ctx, claim(ns, name, "lock-"+strconv.Itoa(i), 3600)); err != nil {
			return latency{}, latency{}, err
		}
		t, err := wait(ch, 30*time.Second)
		if err != nil {
			return latency{}, latency{}, err
		}
		tn, err := wait(chn, 30*time.Second)
		if err != nil {
			return latency{}, latency{}, fmt.Errorf("no Lease named %s: %w", name, err)
		}
		d, dn = append(d, t.Sub(start)), append(dn, tn.Sub(start))
	}
	return summarize(d), summarize(dn), nil
}

// Grant latency: create a claim on a free lock (a new lock each time) and
// stop the clock when the namespace watch sees it Held; n grants in a row.
package main

import (
	"context"
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

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

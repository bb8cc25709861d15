// Admission cost in CEL enforcement mode: a second control plane whose
// fencing rules are the admission policies (webhook/celmode), the same
// interleaved guarded/unguarded updates as the webhook's figure, and the
// guarded and unguarded updates again with 10, 100, 1,000 and 5,000 locks bound
// (the apiserver matches every binding of a policy against each request the
// policy matches; the unguarded update shows what writes outside any lock
// pay for them).
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// celPoint is the CEL-mode curve at one bound-lock count (report key
// cel_by_bindings).
type celPoint struct {
	Bindings    int     `json:"bindings"`
	GuardedMS   latency `json:"guarded_ms"`
	UnguardedMS latency `json:"unguarded_ms"`
	// GuardedOverUnguarded: the tails' ratio (p99, or max below 200 samples).
	GuardedOverUnguarded float64 `json:"guarded_over_unguarded"`
}

func celAdmission(ctx context.Context, n int, bindingCounts []int) (guarded, unguarded latency, curve []celPoint, err error) {
	env, err := envtestutil.StartCELEnv(ctx, []string{"configmaps"})
	if err != nil {
		return guarded, unguarded, nil, err
	}
	defer func() { _ = env.Env.Stop() }()
	m, err := env.StartManager()
	if err != nil {
		return guarded, unguarded, nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = m.Stop()
		}
	}()
	cfg := rest.CopyConfig(env.Admin)
	cfg.QPS, cfg.Burst = 2000, 4000
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return guarded, unguarded, nil, err
	}
	a, err := setupAdmission(ctx, c, func(ns, epoch string) error {
		// The apiserver loads the policies and the lock's bindings
		// asynchronously.
		e, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return err
		}
		return envtestutil.WaitFencingEnforced(ctx, c, ns, "report", e)
	})
	if err != nil {
		return guarded, unguarded, nil, err
	}
	defer a.stop()
	if _, _, err := a.measure(ctx, c, 20); err != nil { // warm-up
		return guarded, unguarded, nil, err
	}
	if guarded, unguarded, err = a.measure(ctx, c, n); err != nil {
		return guarded, unguarded, nil, err
	}
	// Stop the manager so the extra bindings (locks nobody claims) stay.
	if err := m.Stop(); err != nil {
		return guarded, unguarded, nil, err
	}
	stopped = true
	bound := 1 // the lock "report"
	for _, want := range bindingCounts {
		for ; bound < want; bound++ {
			// Both at once: these locks have no Lease, so nothing is
			// consumed or checked either way.
			for _, obj := range celmode.Bindings(fmt.Sprintf("bench-lock-%d", bound)).Objects() {
				if err := c.Create(ctx, obj); err != nil {
					return guarded, unguarded, nil, err
				}
			}
		}
		// Let the apiserver's policy source take the new bindings in.
		time.Sleep(3 * time.Second)
		if _, _, err := a.measure(ctx, c, 20); err != nil {
			return guarded, unguarded, nil, err
		}
		g, u, err := a.measure(ctx, c, n/2)
		if err != nil {
			return guarded, unguarded, nil, err
		}
		curve = append(curve, celPoint{Bindings: want, GuardedMS: g, UnguardedMS: u, GuardedOverUnguarded: round2(g.tail() / u.tail())})
		fmt.Fprintf(os.Stderr, " [%d locks bound: guarded %s, unguarded %s]", want, latText(g), latText(u))
	}
	return guarded, unguarded, curve, nil
}

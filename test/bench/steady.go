// Steady-state writes: every mutating request the apiserver serves while
// locks are only held (cluster.mutations, less its own heartbeats and the
// floor's samples), over windows of several TTLs, for two kinds of holder:
//   - pods holding leases through the pod bridge (their claims renewed by
//     the pods being live): the contract's 0 writes in steady state;
//   - holders using the library, each renewing its lock's Lease every
//     TTL/3: the contract's 1 write per renewal, counted against the
//     renewals the library itself acknowledged (its renewals counter).
//     The holders' requests pass a gate the bench closes around each
//     reading of the two counters, once their requests in flight are
//     answered, so no renewal is counted on one side of a reading and not
//     the other.
package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

const (
	steadyLocks = 10
	steadyTTL   = 3 * time.Second
	// steadyWindow: three TTLs, so every holder renews (or would be
	// renewed by the authority's own bookkeeping) several times in it.
	steadyWindow = 3 * steadyTTL
)

// measurePodHeldWrites: steadyLocks pods each hold a lock of their own;
// once all show Held and the manager has settled, the mutating requests
// over steadyWindow.
func measurePodHeldWrites(ctx context.Context, cl *cluster, c client.Client) (float64, error) {
	ns, err := newNS(ctx, c, "steady-pods")
	if err != nil {
		return 0, err
	}
	ttl := strconv.Itoa(int(steadyTTL / time.Second))
	for i := range steadyLocks {
		name := "worker-" + strconv.Itoa(i)
		if _, err := envtestutil.LeasePod(ctx, c, ns, name, "pod-lock-"+strconv.Itoa(i), ttl, true); err != nil {
			return 0, err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < steadyLocks; {
		if st, _, _ := envtestutil.PodLease(ctx, c, ns, "worker-"+strconv.Itoa(i)); st == "Held" {
			i++
			continue
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("pod worker-%d in %s not shown Held within a minute", i, ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := settleOn(cl.mutations, "the pods' grants kept writing for 2m"); err != nil {
		return 0, err
	}
	m0 := cl.mutations()
	time.Sleep(steadyWindow)
	return cl.mutations() - m0, nil
}

// measureWritesPerRenewal: steadyLocks library holders on locks of their
// own renew for steadyWindow; the mutating requests in it over the
// renewals they acknowledged.
func measureWritesPerRenewal(ctx context.Context, cl *cluster, cfg *rest.Config, c client.Client) (float64, error) {
	ns, err := newNS(ctx, c, "steady-holders")
	if err != nil {
		return 0, err
	}
	reg := prometheus.NewRegistry()
	lease.MustRegisterMetrics(reg)
	g := &requestGate{}
	gcfg := rest.CopyConfig(cfg)
	gcfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return gatedTransport{next: rt, gate: g} }
	holders, err := lease.NewClient(gcfg, ns)
	if err != nil {
		return 0, err
	}
	var held []*lease.Lease
	defer func() {
		for _, l := range held {
			_ = l.Release(context.WithoutCancel(ctx))
		}
	}()
	for i := range steadyLocks {
		l, err := holders.Acquire(ctx, "lib-lock-"+strconv.Itoa(i), "holder-"+strconv.Itoa(i), lease.Options{TTL: steadyTTL})
		if err != nil {
			return 0, err
		}
		held = append(held, l)
	}
	// The renewals never stop: wait until the grants' own writes (the
	// claims' statuses) have.
	if err := settleOn(func() float64 { _, s := cl.writes(); return s }, "the grants kept writing for 2m"); err != nil {
		return 0, err
	}
	read := func() (m, r float64) {
		g.mu.Lock() // waits for the holders' requests in flight
		defer g.mu.Unlock()
		time.Sleep(20 * time.Millisecond) // their acknowledgements counted
		return cl.mutations(), okRenewals(reg)
	}
	m0, r0 := read()
	time.Sleep(steadyWindow)
	m, r := read()
	m, r = m-m0, r-r0
	if r <= 0 {
		return 0, fmt.Errorf("no renewal acknowledged in %v", steadyWindow)
	}
	for _, l := range held {
		if s := l.State(); s != lease.Held {
			return 0, fmt.Errorf("holder of %s is %s after the window, not Held", l.Lock, s)
		}
	}
	return m / r, nil
}

// requestGate holds the holders' requests (watches excepted) while the
// bench reads its counters: a reading takes mu, so it starts once every
// request in flight has been answered, and none starts until it is done.
type requestGate struct{ mu sync.RWMutex }

type gatedTransport struct {
	next http.RoundTripper
	gate *requestGate
}

func (t gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Query().Get("watch") == "true" {
		return t.next.RoundTrip(req)
	}
	t.gate.mu.RLock()
	defer t.gate.mu.RUnlock()
	return t.next.RoundTrip(req)
}

// okRenewals is the library's fencekeeper_client_renewals_total{result="ok"}.
func okRenewals(reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != "fencekeeper_client_renewals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == "ok" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

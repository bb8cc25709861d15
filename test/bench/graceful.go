// Graceful handoff: the leader shuts down cleanly (its elector's context is
// cancelled, ReleaseOnCancel) while a second candidate waits; the figure is
// the time from that cancel to the successor's OnStartedLeading. Both sides
// run client-go's LeaderElector with the same TTL: the fenced Lock
// (pkg/election, timings as its ManagerOptions sets them) and client-go's
// LeaseLock (controller-runtime's default timings: 15s / 10s / 2s). What
// each side waits on: the fenced successor on the release and then its
// grant (its claim queued; the elector sees the grant at its next 10 ms
// poll of its own cache); client-go's on its next RetryPeriod (2 s) try
// after the release.
package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fencekeeper/fencekeeper/pkg/election"
)

const gracefulTTL = 15 * time.Second

// measureGracefulHandoff runs `runs` handoffs at once, each on its own lock.
func measureGracefulHandoff(ctx context.Context, newLock candidateLock, cs kubernetes.Interface, prefix string, t electorTimings, runs int) (latency, error) {
	ns, err := benchNamespace(ctx, cs, prefix)
	if err != nil {
		return latency{}, err
	}
	var mu sync.Mutex
	var d []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	for r := 0; r < runs; r++ {
		g.Go(func() error {
			p, err := startPair(gctx, newLock, ns, "election-"+strconv.Itoa(r), gracefulTTL, t, true)
			if err != nil {
				return err
			}
			defer p.stopB()
			time.Sleep(time.Second) // b is queued (fenced) or polling (client-go)
			released := time.Now()
			go p.stopA() // a clean shutdown: the elector releases
			led, err := wait(p.bLed, 2*gracefulTTL)
			if err != nil {
				return fmt.Errorf("%s: the successor did not lead: %w", prefix, err)
			}
			mu.Lock()
			d = append(d, led.Sub(released))
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return latency{}, err
	}
	return summarize(d), nil
}

// gracefulHandoffs measures the fenced Lock and client-go's LeaseLock.
func gracefulHandoffs(ctx context.Context, cfg *rest.Config, runs int) (fenced, clientgo latency, err error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return latency{}, latency{}, err
	}
	fencedLock := func(ns, name, id string) (resourcelock.Interface, func(), error) {
		l, err := election.New(cfg, election.Config{Namespace: ns, Name: name, Identity: id, TTL: gracefulTTL})
		return l, nil, err
	}
	fenced, err = measureGracefulHandoff(ctx, fencedLock, cs, "graceful-fenced",
		electorTimings{renewDeadline: time.Second, retryPeriod: election.RetryPeriod}, runs)
	if err != nil {
		return latency{}, latency{}, err
	}
	leaseLock := func(ns, name, id string) (resourcelock.Interface, func(), error) {
		l, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, name, cs.CoreV1(), cs.CoordinationV1(),
			resourcelock.ResourceLockConfig{Identity: id})
		return l, nil, err
	}
	clientgo, err = measureGracefulHandoff(ctx, leaseLock, cs, "graceful-clientgo",
		electorTimings{renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}, runs)
	return fenced, clientgo, err
}

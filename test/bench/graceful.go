// Graceful handoff: the leader shuts down cleanly (its elector's context is
// cancelled, ReleaseOnCancel) while a second candidate waits; the figure is
// the time from that cancel to the successor's OnStartedLeading. Both sides
// run client-go's LeaderElector with the same TTL: the fenced Lock
// (pkg/election, timings as its ManagerOptions sets them) and client-go's
// LeaseLock (controller-runtime's default timings: 15s / 10s / 2s).
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
			name := "election-" + strconv.Itoa(r)
			la, _, err := newLock(ns, name, "a")
			if err != nil {
				return err
			}
			aLed, bLed := make(chan time.Time, 1), make(chan time.Time, 1)
			stopA, err := elect(gctx, la, gracefulTTL, t, true, aLed)
			if err != nil {
				return err
			}
			if _, err := wait(aLed, 30*time.Second); err != nil {
				return err
			}
			lb, _, err := newLock(ns, name, "b")
			if err != nil {
				return err
			}
			stopB, err := elect(gctx, lb, gracefulTTL, t, true, bLed)
			if err != nil {
				return err
			}
			defer stopB()
			time.Sleep(time.Second) // b is queued (fenced) or polling (client-go)
			released := time.Now()
			go stopA() // a clean shutdown: the elector releases
			led, err := wait(bLed, 2*gracefulTTL)
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

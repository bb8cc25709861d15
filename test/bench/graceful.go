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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fencekeeper/fencekeeper/pkg/election"
)

const gracefulTTL = 15 * time.Second

type electorTimings struct{ renewDeadline, retryPeriod time.Duration }

// measureGracefulHandoff runs `runs` handoffs at once, each on its own lock.
func measureGracefulHandoff(ctx context.Context, newLock func(ns, name, id string) (resourcelock.Interface, error),
	cs kubernetes.Interface, prefix string, t electorTimings, runs int) (latency, error) {
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1000000)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return latency{}, err
	}
	var mu sync.Mutex
	var d []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	for r := 0; r < runs; r++ {
		g.Go(func() error {
			name := "election-" + strconv.Itoa(r)
			candidate := func(id string, led chan<- time.Time) (context.CancelFunc, <-chan struct{}, error) {
				lock, err := newLock(ns, name, id)
				if err != nil {
					return nil, nil, err
				}
				le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
					Lock: lock, LeaseDuration: gracefulTTL, RenewDeadline: t.renewDeadline, RetryPeriod: t.retryPeriod,
					ReleaseOnCancel: true,
					Callbacks: leaderelection.LeaderCallbacks{
						OnStartedLeading: func(context.Context) { led <- time.Now() },
						OnStoppedLeading: func() {},
					},
				})
				if err != nil {
					return nil, nil, err
				}
				cctx, cancel := context.WithCancel(gctx)
				done := make(chan struct{})
				go func() { le.Run(cctx); close(done) }()
				return cancel, done, nil
			}
			aLed, bLed := make(chan time.Time, 1), make(chan time.Time, 1)
			stopA, _, err := candidate("a", aLed)
			if err != nil {
				return err
			}
			if _, err := wait(aLed, 30*time.Second); err != nil {
				return err
			}
			stopB, bDone, err := candidate("b", bLed)
			if err != nil {
				return err
			}
			defer func() { stopB(); <-bDone }()
			time.Sleep(time.Second) // b is queued (fenced) or polling (client-go)
			released := time.Now()
			stopA() // a clean shutdown: the elector releases
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
	fencedLock := func(ns, name, id string) (resourcelock.Interface, error) {
		return election.New(cfg, election.Config{Namespace: ns, Name: name, Identity: id, TTL: gracefulTTL})
	}
	fenced, err = measureGracefulHandoff(ctx, fencedLock, cs, "graceful-fenced",
		electorTimings{renewDeadline: time.Second, retryPeriod: election.RetryPeriod}, runs)
	if err != nil {
		return latency{}, latency{}, err
	}
	leaseLock := func(ns, name, id string) (resourcelock.Interface, error) {
		return resourcelock.New(resourcelock.LeasesResourceLock, ns, name, cs.CoreV1(), cs.CoordinationV1(),
			resourcelock.ResourceLockConfig{Identity: id})
	}
	clientgo, err = measureGracefulHandoff(ctx, leaseLock, cs, "graceful-clientgo",
		electorTimings{renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}, runs)
	return fenced, clientgo, err
}

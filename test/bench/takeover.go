// Takeover overshoot: the holder renews its Lease three times and stops
// right after the last acknowledged renewal; the figure is the next waiter's
// grant (seen by the namespace watch) minus that moment minus the TTL, for
// `runs` locks at once. The client-go reference runs two leaderelection
// candidates on a plain Lease with the same TTL and measures from the moment
// the leader's context is cancelled.
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// takeover: the holder stops renewing -> the next waiter is granted; the
// figure is the time beyond the TTL, measured from the send time of the
// holder's last acknowledged renewal.
func measureTakeover(ctx context.Context, c client.WithWatch, runs int, ttl time.Duration) (latency, error) {
	ns, h, err := watchedNS(ctx, c, "takeover")
	if err != nil {
		return latency{}, err
	}
	defer h.stop()
	var mu sync.Mutex
	var d []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	for r := 0; r < runs; r++ {
		g.Go(func() error {
			lock := "lock-" + strconv.Itoa(r)
			holder, next := "h"+strconv.Itoa(r), "n"+strconv.Itoa(r)
			hc := h.expect(holder)
			if err := c.Create(gctx, claim(ns, holder, lock, int32(ttl/time.Second))); err != nil {
				return err
			}
			if _, err := wait(hc, 30*time.Second); err != nil {
				return err
			}
			nc := h.expect(next)
			if err := c.Create(gctx, claim(ns, next, lock, int32(ttl/time.Second))); err != nil {
				return err
			}
			// Renew a few times, then stop (the holder pauses) right after
			// the last renewal is acknowledged: that moment is the reference.
			var stopped time.Time
			for i := 0; i < 3; i++ {
				if i > 0 {
					time.Sleep(ttl / 4)
				}
				var l coordinationv1.Lease
				if err := c.Get(gctx, client.ObjectKey{Namespace: ns, Name: lock}, &l); err != nil {
					return err
				}
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				if err := c.Update(gctx, &l); err != nil {
					return err
				}
				stopped = time.Now()
			}
			t, err := wait(nc, ttl+30*time.Second)
			if err != nil {
				return err
			}
			mu.Lock()
			d = append(d, t.Sub(stopped)-ttl)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return latency{}, err
	}
	return summarize(d), nil
}

// clientgoTakeover: the same with two client-go leader-election candidates on
// a plain Lease with the same TTL.
func measureClientGoTakeover(ctx context.Context, cfg *rest.Config, runs int, ttl time.Duration) (latency, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return latency{}, err
	}
	ns := fmt.Sprintf("clientgo-%d", time.Now().UnixNano()%1000000)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return latency{}, err
	}
	var mu sync.Mutex
	var d []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	for r := 0; r < runs; r++ {
		g.Go(func() error {
			name := "election-" + strconv.Itoa(r)
			candidate := func(id string, led chan<- time.Time) (context.CancelFunc, error) {
				lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, name, cs.CoreV1(), cs.CoordinationV1(),
					resourcelock.ResourceLockConfig{Identity: id})
				if err != nil {
					return nil, err
				}
				cctx, cancel := context.WithCancel(gctx)
				le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
					Lock: lock, LeaseDuration: ttl, RenewDeadline: ttl * 2 / 3, RetryPeriod: ttl / 10,
					Callbacks: leaderelection.LeaderCallbacks{
						OnStartedLeading: func(context.Context) { led <- time.Now() },
						OnStoppedLeading: func() {},
					},
				})
				if err != nil {
					cancel()
					return nil, err
				}
				go le.Run(cctx)
				return cancel, nil
			}
			aLed, bLed := make(chan time.Time, 1), make(chan time.Time, 1)
			stopA, err := candidate("a", aLed)
			if err != nil {
				return err
			}
			if _, err := wait(aLed, 30*time.Second); err != nil {
				return err
			}
			stopB, err := candidate("b", bLed)
			if err != nil {
				return err
			}
			defer stopB()
			time.Sleep(ttl / 2)
			stopA() // A pauses: no more renewals, no release
			stopped := time.Now()
			t, err := wait(bLed, ttl+30*time.Second)
			if err != nil {
				return err
			}
			mu.Lock()
			d = append(d, t.Sub(stopped)-ttl)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return latency{}, err
	}
	return summarize(d), nil
}

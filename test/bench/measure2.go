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

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
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

// grantThroughput: claims on `locks` free locks at once -> all Held.
func grantThroughput(ctx context.Context, c client.WithWatch, locks, conc int) (float64, error) {
	ns, h, err := watchedNS(ctx, c, "grants")
	if err != nil {
		return 0, err
	}
	defer h.stop()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := 0; i < locks; i++ {
		g.Go(func() error { return c.Create(gctx, claim(ns, "c"+strconv.Itoa(i), "lock-"+strconv.Itoa(i), 3600)) })
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	for h.countHeld() < locks {
		if time.Since(start) > 5*time.Minute {
			return 0, fmt.Errorf("only %d of %d granted after 5m", h.countHeld(), locks)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return float64(locks) / time.Since(start).Seconds(), nil
}

// guardedVsUnguarded: the same ConfigMap update with and without the fencing
// label, interleaved.
func guardedVsUnguarded(ctx context.Context, c client.WithWatch, n int) (latency, latency, error) {
	ns, h, err := watchedNS(ctx, c, "admission")
	if err != nil {
		return latency{}, latency{}, err
	}
	defer h.stop()
	ch := h.expect("writer")
	if err := c.Create(ctx, claim(ns, "writer", "report", 3600)); err != nil {
		return latency{}, latency{}, err
	}
	if _, err := wait(ch, 30*time.Second); err != nil {
		return latency{}, latency{}, err
	}
	guarded := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded",
		Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: map[string]string{fkv1.AnnotationEpoch: "1"}}}
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain",
		Annotations: map[string]string{fkv1.AnnotationEpoch: "1"}}}
	for _, cm := range []*corev1.ConfigMap{guarded, plain} {
		if err := c.Create(ctx, cm); err != nil {
			return latency{}, latency{}, err
		}
	}
	var dg, du []time.Duration
	for i := 0; i < n; i++ {
		for _, cm := range []*corev1.ConfigMap{guarded, plain} {
			cm.Data = map[string]string{"v": strconv.Itoa(i)}
			start := time.Now()
			if err := c.Update(ctx, cm); err != nil {
				return latency{}, latency{}, err
			}
			if cm == guarded {
				dg = append(dg, time.Since(start))
			} else {
				du = append(du, time.Since(start))
			}
		}
	}
	return summarize(dg), summarize(du), nil
}

// scale: claims over locks (claims/locks per lock), all granted or queued;
// returns the manager's RSS and whether every grant was correct.
func scale(ctx context.Context, c client.WithWatch, cl *cluster, claims, locks, conc int) (float64, bool, string, error) {
	ns, err := newNS(ctx, c, "scale")
	if err != nil {
		return 0, false, "", err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := 0; i < claims; i++ {
		g.Go(func() error {
			return c.Create(gctx, claim(ns, "c"+strconv.Itoa(i), "lock-"+strconv.Itoa(i%locks), 3600))
		})
	}
	if err := g.Wait(); err != nil {
		return 0, false, "", err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var list fkv1.FencedLeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0, false, "", err
		}
		held, pending := 0, 0
		heldPerLock := map[string]int{}
		badEpoch := 0
		for _, it := range list.Items {
			switch it.Status.Phase {
			case fkv1.PhaseHeld:
				held++
				heldPerLock[it.Spec.LockName]++
				if it.Status.Epoch != 1 {
					badEpoch++
				}
			case fkv1.PhasePending:
				pending++
			}
		}
		if held+pending == claims && held == locks {
			correct := badEpoch == 0
			for _, n := range heldPerLock {
				if n != 1 {
					correct = false
				}
			}
			time.Sleep(2 * time.Second)
			return cl.rssMiB(), correct, fmt.Sprintf("%d held (one per lock, epoch 1: %v), %d queued", held, correct, pending), nil
		}
		if time.Now().After(deadline) {
			return 0, false, "", fmt.Errorf("after 10m: %d held, %d pending of %d", held, pending, claims)
		}
		time.Sleep(time.Second)
	}
}

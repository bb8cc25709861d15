// Takeover overshoot: the holder renews its Lease three times and stops
// right after the last acknowledged renewal; the figure is the next waiter's
// grant (seen by the namespace watch) minus that moment minus the TTL, for
// `runs` locks at once. The client-go reference runs two leaderelection
// candidates on a plain Lease with the same TTL; its reference point is the
// last renewal the leader actually wrote, read back from the Lease (the
// renewTime of the last version a watch saw with the leader as holder), not
// the moment its context was cancelled: a renewal may or may not have been
// in flight then, which swung the old figure by most of a RetryPeriod.
package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
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

	"github.com/fencekeeper/fencekeeper/pkg/election"
)

// takeover: the holder stops renewing -> the next waiter is granted; the
// figure is the time beyond the TTL, measured from the holder's last
// renewal as written (the renewTime it put in the Lease), the same
// reference as client-go's below.
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
			// the last renewal is acknowledged; the renewTime it wrote is
			// the reference.
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
				stopped = now.Time
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
	// The leader's renewals, as written: the last renewTime per Lease while
	// candidate "a" holds it.
	w, err := cs.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return latency{}, err
	}
	defer w.Stop()
	var mu sync.Mutex
	lastRenewal := map[string]time.Time{}
	go func() {
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "a" && l.Spec.RenewTime != nil {
				mu.Lock()
				lastRenewal[l.Name] = l.Spec.RenewTime.Time
				mu.Unlock()
			}
		}
	}()
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
			t, err := wait(bLed, ttl+30*time.Second)
			if err != nil {
				return err
			}
			mu.Lock()
			last, seen := lastRenewal[name]
			if seen {
				d = append(d, t.Sub(last)-ttl)
			}
			mu.Unlock()
			if !seen {
				return fmt.Errorf("client-go takeover %s: no renewal by the leader was seen", name)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return latency{}, err
	}
	return summarize(d), nil
}

// measureElectionTakeover: the same crash takeover for pkg/election's Lock
// under client-go's LeaderElector (timings as its ManagerOptions sets
// them). The leader's connection to the apiserver hangs (renewals stop, no
// release: a crash as the others see it); the figure is the successor's
// OnStartedLeading minus the leader's last renewal read back from the
// Lease, minus the TTL.
func measureElectionTakeover(ctx context.Context, cfg *rest.Config, runs int, ttl time.Duration) (latency, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return latency{}, err
	}
	ns := fmt.Sprintf("election-takeover-%d", time.Now().UnixNano()%1000000)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return latency{}, err
	}
	w, err := cs.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return latency{}, err
	}
	defer w.Stop()
	var mu sync.Mutex
	lastRenewal := map[string]time.Time{}
	go func() {
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "a" && l.Spec.RenewTime != nil {
				mu.Lock()
				lastRenewal[l.Name] = l.Spec.RenewTime.Time
				mu.Unlock()
			}
		}
	}()
	var d []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	for r := 0; r < runs; r++ {
		g.Go(func() error {
			name := "election-" + strconv.Itoa(r)
			candidate := func(id string, hang *atomic.Bool, led chan<- time.Time) (context.CancelFunc, error) {
				c := rest.CopyConfig(cfg)
				c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return hangingTransport{next: rt, hang: hang} }
				lock, err := election.New(c, election.Config{Namespace: ns, Name: name, Identity: id, TTL: ttl})
				if err != nil {
					return nil, err
				}
				le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
					Lock: lock, LeaseDuration: ttl, RenewDeadline: min(ttl/2, time.Second), RetryPeriod: election.RetryPeriod,
					Callbacks: leaderelection.LeaderCallbacks{
						OnStartedLeading: func(context.Context) { led <- time.Now() },
						OnStoppedLeading: func() {},
					},
				})
				if err != nil {
					return nil, err
				}
				cctx, cancel := context.WithCancel(gctx)
				go le.Run(cctx)
				return cancel, nil
			}
			var hangA, never atomic.Bool
			aLed, bLed := make(chan time.Time, 1), make(chan time.Time, 1)
			stopA, err := candidate("a", &hangA, aLed)
			if err != nil {
				return err
			}
			defer stopA()
			if _, err := wait(aLed, 30*time.Second); err != nil {
				return err
			}
			stopB, err := candidate("b", &never, bLed)
			if err != nil {
				return err
			}
			defer stopB()
			time.Sleep(ttl / 2)
			hangA.Store(true) // A's apiserver connection hangs: no renewals, no release
			t, err := wait(bLed, ttl+30*time.Second)
			if err != nil {
				return fmt.Errorf("fenced election takeover %s: %w", name, err)
			}
			mu.Lock()
			last, seen := lastRenewal[name]
			if seen {
				d = append(d, t.Sub(last)-ttl)
			}
			mu.Unlock()
			if !seen {
				return fmt.Errorf("fenced election takeover %s: no renewal by the leader was seen", name)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return latency{}, err
	}
	return summarize(d), nil
}

// hangingTransport never answers while hang is set.
type hangingTransport struct {
	next http.RoundTripper
	hang *atomic.Bool
}

func (h hangingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if h.hang.Load() {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	return h.next.RoundTrip(req)
}

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
	"k8s.io/apimachinery/pkg/watch"
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
// a plain Lease with the same TTL; the leader's elector is cancelled (no
// release). Reported as min/max (a reference, not a goal) and the share of
// runs taken over before the TTL had run out since the last renewal.
func measureClientGoTakeover(ctx context.Context, cfg *rest.Config, runs int, ttl time.Duration) (l latency, beforeTTL float64, err error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return latency{}, 0, err
	}
	lock := func(ns, name, id string) (resourcelock.Interface, func(), error) {
		l, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, name, cs.CoreV1(), cs.CoordinationV1(),
			resourcelock.ResourceLockConfig{Identity: id})
		return l, nil, err
	}
	d, err := measureElectorTakeover(ctx, cs, "clientgo", lock, electorTimings{renewDeadline: ttl * 2 / 3, retryPeriod: ttl / 10}, runs, ttl)
	early := 0
	for _, x := range d {
		if x < 0 {
			early++
		}
	}
	if len(d) > 0 {
		beforeTTL = round2(float64(early) / float64(len(d)))
	}
	return summarize(d), beforeTTL, err
}

// measureElectionTakeover: the same crash takeover for pkg/election's Lock
// under client-go's LeaderElector (timings as its ManagerOptions sets
// them). The leader's connection to the apiserver hangs (renewals stop, no
// release: a crash as the others see it).
func measureElectionTakeover(ctx context.Context, cfg *rest.Config, runs int, ttl time.Duration) (latency, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return latency{}, err
	}
	lock := func(ns, name, id string) (resourcelock.Interface, func(), error) {
		var hang atomic.Bool
		c := rest.CopyConfig(cfg)
		c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return hangingTransport{next: rt, hang: &hang} }
		l, err := election.New(c, election.Config{Namespace: ns, Name: name, Identity: id, TTL: ttl})
		return l, func() { hang.Store(true) }, err
	}
	d, err := measureElectorTakeover(ctx, cs, "election-takeover", lock, electorTimings{renewDeadline: min(ttl/2, time.Second), retryPeriod: election.RetryPeriod}, runs, ttl)
	return summarize(d), err
}

// candidateLock makes candidate id's lock on ns/name, and how to crash it
// (nil: cancel its elector without a release).
type candidateLock func(ns, name, id string) (resourcelock.Interface, func(), error)

// measureElectorTakeover runs `runs` takeovers at once, each on its own
// lock: candidate "a" leads, "b" waits, "a" crashes; the figure is b's
// OnStartedLeading minus a's last renewal as written (read back from the
// Lease), minus the TTL.
func measureElectorTakeover(ctx context.Context, cs kubernetes.Interface, prefix string, newLock candidateLock, t electorTimings, runs int, ttl time.Duration) ([]time.Duration, error) {
	ns, err := benchNamespace(ctx, cs, prefix)
	if err != nil {
		return nil, err
	}
	renewals, err := watchRenewals(ctx, cs, ns, "a")
	if err != nil {
		return nil, err
	}
	defer renewals.stop()
	var mu sync.Mutex
	var d []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	for r := 0; r < runs; r++ {
		g.Go(func() error {
			name := "election-" + strconv.Itoa(r)
			p, err := startPair(gctx, newLock, ns, name, ttl, t, false)
			if err != nil {
				return err
			}
			defer p.stopA()
			defer p.stopB()
			time.Sleep(ttl / 2)
			p.crashA() // a stops renewing, and releases nothing
			led, err := wait(p.bLed, ttl+30*time.Second)
			if err != nil {
				return fmt.Errorf("%s takeover %s: %w", prefix, name, err)
			}
			last, seen := renewals.lastOf(name)
			if !seen {
				return fmt.Errorf("%s takeover %s: no renewal by the leader was seen", prefix, name)
			}
			mu.Lock()
			d = append(d, led.Sub(last)-ttl)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return d, nil
}

type electorTimings struct{ renewDeadline, retryPeriod time.Duration }

// pair is a leader ("a") and a successor ("b") waiting behind it on one lock.
type pair struct {
	stopA, stopB func() // stop an elector (and wait for it)
	crashA       func() // a stops renewing without a release
	bLed         chan time.Time
}

// startPair starts a on ns/name, waits until it leads, then starts b.
func startPair(ctx context.Context, newLock candidateLock, ns, name string, ttl time.Duration, t electorTimings, release bool) (*pair, error) {
	la, crash, err := newLock(ns, name, "a")
	if err != nil {
		return nil, err
	}
	aLed := make(chan time.Time, 1)
	p := &pair{bLed: make(chan time.Time, 1)}
	if p.stopA, err = elect(ctx, la, ttl, t, release, aLed); err != nil {
		return nil, err
	}
	if _, err := wait(aLed, 30*time.Second); err != nil {
		p.stopA()
		return nil, err
	}
	lb, _, err := newLock(ns, name, "b")
	if err == nil {
		p.stopB, err = elect(ctx, lb, ttl, t, release, p.bLed)
	}
	if err != nil {
		p.stopA()
		return nil, err
	}
	p.crashA = crash
	if crash == nil {
		p.crashA = p.stopA
	}
	return p, nil
}

// elect runs client-go's LeaderElector on lock until stop (which waits for
// it); led gets the moment it starts leading.
func elect(ctx context.Context, lock resourcelock.Interface, ttl time.Duration, t electorTimings, release bool, led chan<- time.Time) (func(), error) {
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: ttl, RenewDeadline: t.renewDeadline, RetryPeriod: t.retryPeriod,
		ReleaseOnCancel: release,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { led <- time.Now() },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { le.Run(cctx); close(done) }()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }, nil
}

func benchNamespace(ctx context.Context, cs kubernetes.Interface, prefix string) (string, error) {
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1000000)
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	return ns, err
}

// renewalWatch keeps, per Lease, the renewTime of the last version that
// names holder: the holder's last renewal as written.
type renewalWatch struct {
	w    watch.Interface
	mu   sync.Mutex
	last map[string]time.Time
}

func watchRenewals(ctx context.Context, cs kubernetes.Interface, ns, holder string) (*renewalWatch, error) {
	w, err := cs.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	r := &renewalWatch{w: w, last: map[string]time.Time{}}
	go func() {
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == holder && l.Spec.RenewTime != nil {
				r.mu.Lock()
				r.last[l.Name] = l.Spec.RenewTime.Time
				r.mu.Unlock()
			}
		}
	}()
	return r, nil
}

func (r *renewalWatch) lastOf(name string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.last[name]
	return t, ok
}

func (r *renewalWatch) stop() { r.w.Stop() }

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

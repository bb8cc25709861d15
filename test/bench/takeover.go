// Takeover overshoot: the holder renews its Lease three times and stops
// right after the last acknowledged renewal; the figure is the next waiter's
// grant (seen by the namespace watch) minus that moment minus the TTL, on
// `runs` locks whose holders stop one after another (see schedule). The
// same takeovers all at once are reported beside them (a burst: what 2
// cores do with 20 takeovers in the same few milliseconds). The client-go
// reference runs two leaderelection
// candidates on a plain Lease with the same TTL; its reference point is the
// last renewal the leader actually wrote, read back from the Lease (the
// renewTime of the last version a watch saw with the leader as holder), not
// the moment its context was cancelled: a renewal may or may not have been
// in flight then, which swung the old figure by most of a RetryPeriod.
package main

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// takeoverSpacing is the mean time between two holders stopping in a
// staggered run: longer than one takeover's own writes (about 30 ms on an
// idle machine), so each is measured on its own, as a lock whose holder
// crashes meets it, not queued behind the others' writes (a burst is
// measured apart).
const takeoverSpacing = 150 * time.Millisecond

// schedule is when run r of a staggered set starts (r spacings, with up to
// half a spacing of jitter so no run locks onto a server timer), or at
// once in a burst.
func schedule(r int, burst bool) time.Duration {
	if burst {
		return 0
	}
	return time.Duration(r)*takeoverSpacing + rand.N(takeoverSpacing/2)
}

// takeover: the holder stops renewing -> the next waiter is granted; the
// figure is the time beyond the TTL, measured from the holder's last
// renewal as written (the renewTime it put in the Lease), the same
// reference as client-go's below.
func measureTakeover(ctx context.Context, c client.WithWatch, runs int, ttl time.Duration, burst bool) (latency, error) {
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
			time.Sleep(schedule(r, burst))
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
	d, _, err := measureElectorTakeover(ctx, cs, "clientgo", lock, electorTimings{renewDeadline: ttl * 2 / 3, retryPeriod: ttl / 10}, runs, ttl, false)
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
// release: a crash as the others see it). phases splits the overshoot.
func measureElectionTakeover(ctx context.Context, cfg *rest.Config, runs int, ttl time.Duration, burst bool) (_ latency, phases takeoverPhases, _ error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return latency{}, phases, err
	}
	lock := func(ns, name, id string) (resourcelock.Interface, func(), error) {
		var hang atomic.Bool
		c := rest.CopyConfig(cfg)
		c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return hangingTransport{next: rt, hang: &hang} }
		l, err := election.New(c, election.Config{Namespace: ns, Name: name, Identity: id, TTL: ttl})
		return l, func() { hang.Store(true) }, err
	}
	d, ph, err := measureElectorTakeover(ctx, cs, "election-takeover", lock, electorTimings{renewDeadline: min(ttl/2, time.Second), retryPeriod: election.RetryPeriod}, runs, ttl, burst)
	return summarize(d), ph.summary(), err
}

// takeoverPhases splits each fenced takeover's overshoot at two moments the
// bench's Lease watch sees: the leader's last renewal arriving (the
// authority's TTL runs from its own sight of it) and the Lease naming the
// successor (the grant). The three parts add up to the overshoot.
type takeoverPhases struct {
	// LastRenewalSeenMS: the last renewal's renewTime to the watch seeing it.
	LastRenewalSeenMS latency `json:"last_renewal_seen_ms"`
	// GrantAfterTTLMS: a TTL after the watch saw that renewal, to the watch
	// seeing the grant (the authority's timer, queue and Lease write).
	GrantAfterTTLMS latency `json:"grant_after_ttl_ms"`
	// LedAfterGrantMS: the grant seen, to the successor's OnStartedLeading
	// (its library sees the grant and sends its first renewal; client-go's
	// elector polls the Lock every RetryPeriod).
	LedAfterGrantMS latency `json:"led_after_grant_ms"`

	seen, grant, led []time.Duration
}

// String is the three parts' p50 / max.
func (p takeoverPhases) String() string {
	part := func(l latency) string { return fmt.Sprintf("p50 %.1f / max %.1f", l.P50, l.Max) }
	return fmt.Sprintf("last renewal seen %s; grant after the TTL %s; led after the grant %s (n=%d)",
		part(p.LastRenewalSeenMS), part(p.GrantAfterTTLMS), part(p.LedAfterGrantMS), p.GrantAfterTTLMS.N)
}

func (p takeoverPhases) summary() takeoverPhases {
	return takeoverPhases{LastRenewalSeenMS: summarize(p.seen), GrantAfterTTLMS: summarize(p.grant), LedAfterGrantMS: summarize(p.led)}
}

// candidateLock makes candidate id's lock on ns/name, and how to crash it
// (nil: cancel its elector without a release).
type candidateLock func(ns, name, id string) (resourcelock.Interface, func(), error)

// measureElectorTakeover runs `runs` takeovers (staggered, or at once in a
// burst), each on its own lock: candidate "a" leads, "b" waits, "a"
// crashes; the figure is b's OnStartedLeading minus a's last renewal as
// written (read back from the Lease), minus the TTL.
func measureElectorTakeover(ctx context.Context, cs kubernetes.Interface, prefix string, newLock candidateLock, t electorTimings, runs int, ttl time.Duration, burst bool) ([]time.Duration, takeoverPhases, error) {
	var ph takeoverPhases
	ns, err := benchNamespace(ctx, cs, prefix)
	if err != nil {
		return nil, ph, err
	}
	renewals, err := watchRenewals(ctx, cs, ns, "a", "b")
	if err != nil {
		return nil, ph, err
	}
	defer renewals.stop()
	var mu sync.Mutex
	var d []time.Duration
	g, gctx := errgroup.WithContext(ctx)
	for r := 0; r < runs; r++ {
		g.Go(func() error {
			time.Sleep(schedule(r, burst))
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
			m, seen := renewals.of(name)
			if !seen {
				return fmt.Errorf("%s takeover %s: no renewal by the leader was seen", prefix, name)
			}
			mu.Lock()
			d = append(d, led.Sub(m.lastRenewal)-ttl)
			if !m.successorSeen.IsZero() {
				ph.seen = append(ph.seen, m.lastSeen.Sub(m.lastRenewal))
				ph.grant = append(ph.grant, m.successorSeen.Sub(m.lastSeen.Add(ttl)))
				ph.led = append(ph.led, led.Sub(m.successorSeen))
			}
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, ph, err
	}
	return d, ph, nil
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
// names holder (the holder's last renewal as written) and when the watch
// delivered it, and when it first delivered a version naming successor.
type renewalWatch struct {
	w  watch.Interface
	mu sync.Mutex
	by map[string]leaseMoments
}

type leaseMoments struct {
	lastRenewal, lastSeen, successorSeen time.Time
}

func watchRenewals(ctx context.Context, cs kubernetes.Interface, ns, holder, successor string) (*renewalWatch, error) {
	w, err := cs.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	r := &renewalWatch{w: w, by: map[string]leaseMoments{}}
	go func() {
		for ev := range w.ResultChan() {
			now := time.Now()
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || l.Spec.HolderIdentity == nil {
				continue
			}
			r.mu.Lock()
			m := r.by[l.Name]
			switch *l.Spec.HolderIdentity {
			case holder:
				if l.Spec.RenewTime != nil {
					m.lastRenewal, m.lastSeen = l.Spec.RenewTime.Time, now
				}
			case successor:
				if m.successorSeen.IsZero() {
					m.successorSeen = now
				}
			}
			r.by[l.Name] = m
			r.mu.Unlock()
		}
	}()
	return r, nil
}

// of is what the watch saw of the Lease name; false until it saw the
// holder's renewal.
func (r *renewalWatch) of(name string) (leaseMoments, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.by[name]
	return m, ok && !m.lastRenewal.IsZero()
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

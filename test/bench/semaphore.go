// Semaphore locks (DESIGN §9 rev. 3): a 3-permit lock measured beside a
// mutex, in the same phase, interleaved, against the floor sampled
// throughout that phase. Reported figures: DESIGN §7 sets no goal for them.
//
//   - Grant on an existing lock: a claim with maxHolders 3 created on a lock
//     whose Lease exists (recorded capacity 3) with 0, 1 or 2 permits held
//     by other claims -> the claim seen Held (and, diagnostic, the lock's
//     Lease first seen listing its permit), as grant.go times a grant; the
//     mutex beside it is an existing free mutex lock. Each lock is reused:
//     after each sample the claim is deleted and the release seen through
//     (the claim gone, the Lease back to its holders, a permit's renewal
//     Lease deleted) before the floor round trip and the jittered pause.
//   - Handoff: 3 holders and 1 waiter; the oldest holder deletes its claim
//     -> the waiter seen Held, as handoff.go times a 1-waiter handoff (the
//     waiter topped up and seen Pending before each round); the mutex
//     beside it has 1 holder and 1 waiter.
//   - Admission: a fenced ConfigMap update presenting a live permit's epoch
//     (the three permits' in turn) on an object of the semaphore lock, the
//     same on a mutex lock's object presenting its holder's epoch, and the
//     unfenced update (the webhook skips it), interleaved, in webhook mode,
//     as admission.go times guarded against unguarded.
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// semaphoreMax is the semaphore lock's capacity.
const semaphoreMax = 3

// semClaim is claim with spec.maxHolders set (1: a mutex's claim).
func semClaim(ns, name, lock string, maxHolders int32) *fkv1.FencedLease {
	c := claim(ns, name, lock, 3600)
	if maxHolders > 1 {
		c.Spec.MaxHolders = ptr.To(maxHolders)
	}
	return c
}

// grantHeld creates a claim and waits until it is seen Held.
func grantHeld(ctx context.Context, c client.Client, h *heldWatch, cl *fkv1.FencedLease) error {
	ch := h.expect(cl.Name)
	if err := c.Create(ctx, cl); err != nil {
		return err
	}
	if _, err := wait(ch, 30*time.Second); err != nil {
		return fmt.Errorf("%s on lock %s: %w", cl.Name, cl.Spec.LockName, err)
	}
	return nil
}

// semGrantLock is one lock of the grant phase: its key in the report, its
// capacity and how many permits other claims hold while it is measured.
type semGrantLock struct {
	key, lock  string
	maxHolders int32
	held       int
}

// measureSemaphoreGrant: on each lock, a claim created -> seen Held (held)
// and its Lease first seen naming it or listing its permit (named), n
// times, the locks taken in turn (each round starting at the next one).
func measureSemaphoreGrant(ctx context.Context, c client.WithWatch, n int) (held, named map[string]latency, floor latency, err error) {
	ns, h, err := watchedNS(ctx, c, "semgrant")
	if err != nil {
		return nil, nil, latency{}, err
	}
	defer h.stop()
	f, err := newFloorSampler(ctx, c)
	if err != nil {
		return nil, nil, latency{}, err
	}
	locks := []semGrantLock{{key: "mutex", lock: "mutex", maxHolders: 1}}
	for k := 0; k < semaphoreMax; k++ {
		locks = append(locks, semGrantLock{key: "permits_held_" + strconv.Itoa(k), lock: "sem-" + strconv.Itoa(k), maxHolders: semaphoreMax, held: k})
	}
	// Each lock's Lease made and left free (one grant and its release),
	// then its standing holders granted.
	for _, l := range locks {
		if err := grantHeld(ctx, c, h, semClaim(ns, l.lock+"-prep", l.lock, l.maxHolders)); err != nil {
			return nil, nil, latency{}, err
		}
		if err := c.Delete(ctx, semClaim(ns, l.lock+"-prep", "", 0)); err != nil {
			return nil, nil, latency{}, err
		}
		if err := waitReleased(ctx, c, ns, l, l.lock+"-prep", 0); err != nil {
			return nil, nil, latency{}, err
		}
		for j := 0; j < l.held; j++ {
			if err := grantHeld(ctx, c, h, semClaim(ns, fmt.Sprintf("%s-holder%d", l.lock, j), l.lock, l.maxHolders)); err != nil {
				return nil, nil, latency{}, err
			}
		}
	}
	d, dn := map[string][]time.Duration{}, map[string][]time.Duration{}
	for i := 0; i < n; i++ {
		for j := range locks {
			l := locks[(i+j)%len(locks)]
			name := fmt.Sprintf("%s-g%d", l.lock, i)
			ch, chn := h.expect(name), h.expectNamed(name)
			start := time.Now()
			if err := c.Create(ctx, semClaim(ns, name, l.lock, l.maxHolders)); err != nil {
				return nil, nil, latency{}, err
			}
			t, err := wait(ch, 30*time.Second)
			if err != nil {
				return nil, nil, latency{}, fmt.Errorf("grant of %s: %w", name, err)
			}
			tn, err := wait(chn, 30*time.Second)
			if err != nil {
				return nil, nil, latency{}, fmt.Errorf("no Lease naming %s or listing its permit: %w", name, err)
			}
			d[l.key], dn[l.key] = append(d[l.key], t.Sub(start)), append(dn[l.key], tn.Sub(start))
			// The lock as it was before the next sample on it.
			if err := c.Delete(ctx, semClaim(ns, name, "", 0)); err != nil {
				return nil, nil, latency{}, err
			}
			if err := waitReleased(ctx, c, ns, l, name, l.held); err != nil {
				return nil, nil, latency{}, err
			}
			if err := f.sample(ctx); err != nil {
				return nil, nil, latency{}, err
			}
			spacing()
		}
	}
	held, named = map[string]latency{}, map[string]latency{}
	for k := range d {
		held[k], named[k] = summarize(d[k]), summarize(dn[k])
	}
	return held, named, f.latency(), nil
}

// waitReleased waits until the deleted claim is gone and its release is
// through: a mutex's Lease names no holder; a semaphore's Lease lists
// `holders` permits (its standing holders') and only they have renewal
// Leases (at most 30 s).
func waitReleased(ctx context.Context, c client.Client, ns string, l semGrantLock, name string, holders int) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		done, err := released(ctx, c, ns, l, name, holders)
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the release of %s on lock %s not through after 30s", name, l.lock)
		}
	}
}

func released(ctx context.Context, c client.Client, ns string, l semGrantLock, name string, holders int) (bool, error) {
	var fl fkv1.FencedLease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &fl); err == nil || !apierrors.IsNotFound(err) {
		return false, client.IgnoreNotFound(err)
	}
	var lease coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: l.lock}, &lease); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	led := fkv1.ReadLedger(&lease, l.lock)
	if l.maxHolders == 1 {
		return led.HolderClaim == "", nil
	}
	if len(led.Permits) != holders {
		return false, nil
	}
	var permits coordinationv1.LeaseList
	if err := c.List(ctx, &permits, client.InNamespace(ns), client.MatchingLabels{fkv1.LabelLock: l.lock}, client.HasLabels{fkv1.LabelPermitEpoch}); err != nil {
		return false, err
	}
	return len(permits.Items) == holders, nil
}

// semHandoffLock is one lock of the handoff phase: its holders, oldest
// first, and its one waiter ("" until topped up).
type semHandoffLock struct {
	key, lock  string
	maxHolders int32
	holders    []string
	waiter     string
	next       int
}

func (l *semHandoffLock) newName() string {
	l.next++
	return fmt.Sprintf("%s-c%05d", l.lock, l.next-1)
}

// queueWaiter creates the lock's waiter and waits until it is seen Pending.
func (l *semHandoffLock) queueWaiter(ctx context.Context, c client.Client, h *heldWatch, ns string) error {
	name := l.newName()
	ch := h.expectPending(name)
	if err := c.Create(ctx, semClaim(ns, name, l.lock, l.maxHolders)); err != nil {
		return err
	}
	if _, err := wait(ch, 30*time.Second); err != nil {
		return fmt.Errorf("waiter %s not queued: %w", name, err)
	}
	l.waiter = name
	return nil
}

// measureSemaphoreHandoff: the oldest holder deletes its claim -> the one
// waiter seen Held (held) and the Lease first seen naming it or listing
// its permit (named), rounds times on each lock, the two locks alternating
// which goes first.
func measureSemaphoreHandoff(ctx context.Context, c client.WithWatch, rounds int) (held, named map[string]latency, floor latency, err error) {
	ns, h, err := watchedNS(ctx, c, "semhandoff")
	if err != nil {
		return nil, nil, latency{}, err
	}
	defer h.stop()
	f, err := newFloorSampler(ctx, c)
	if err != nil {
		return nil, nil, latency{}, err
	}
	locks := []*semHandoffLock{{key: "semaphore", lock: "sem", maxHolders: semaphoreMax}, {key: "mutex", lock: "mutex", maxHolders: 1}}
	for _, l := range locks {
		for range l.maxHolders {
			name := l.newName()
			if err := grantHeld(ctx, c, h, semClaim(ns, name, l.lock, l.maxHolders)); err != nil {
				return nil, nil, latency{}, err
			}
			l.holders = append(l.holders, name)
		}
		if err := l.queueWaiter(ctx, c, h, ns); err != nil {
			return nil, nil, latency{}, err
		}
	}
	d, dn := map[string][]time.Duration{}, map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for j := range locks {
			l := locks[(r+j)%len(locks)]
			if l.waiter == "" {
				if err := l.queueWaiter(ctx, c, h, ns); err != nil {
					return nil, nil, latency{}, err
				}
			}
			next := l.waiter
			ch, chn := h.expect(next), h.expectNamed(next)
			start := time.Now()
			if err := c.Delete(ctx, semClaim(ns, l.holders[0], "", 0)); err != nil {
				return nil, nil, latency{}, err
			}
			t, err := wait(ch, 30*time.Second)
			if err != nil {
				return nil, nil, latency{}, fmt.Errorf("handoff to %s: %w", next, err)
			}
			tn, err := wait(chn, 30*time.Second)
			if err != nil {
				return nil, nil, latency{}, fmt.Errorf("no Lease naming %s or listing its permit: %w", next, err)
			}
			d[l.key], dn[l.key] = append(d[l.key], t.Sub(start)), append(dn[l.key], tn.Sub(start))
			l.holders, l.waiter = append(l.holders[1:], next), ""
			if err := f.sample(ctx); err != nil {
				return nil, nil, latency{}, err
			}
			spacing()
		}
	}
	held, named = map[string]latency{}, map[string]latency{}
	for k := range d {
		held[k], named[k] = summarize(d[k]), summarize(dn[k])
	}
	return held, named, f.latency(), nil
}

// measureSemaphoreAdmission: n updates each of a ConfigMap of the
// semaphore lock (presenting its three permits' epochs in turn), one of a
// mutex lock (its holder's epoch) and an unfenced one, interleaved (each
// round starting at the next), a floor round trip after each round.
func measureSemaphoreAdmission(ctx context.Context, c client.WithWatch, n int) (map[string]latency, latency, error) {
	ns, h, err := watchedNS(ctx, c, "semadmission")
	if err != nil {
		return nil, latency{}, err
	}
	defer h.stop()
	f, err := newFloorSampler(ctx, c)
	if err != nil {
		return nil, latency{}, err
	}
	for i := 0; i < semaphoreMax; i++ {
		if err := grantHeld(ctx, c, h, semClaim(ns, "sem-writer"+strconv.Itoa(i), "sem", semaphoreMax)); err != nil {
			return nil, latency{}, err
		}
	}
	if err := grantHeld(ctx, c, h, semClaim(ns, "mutex-writer", "mutex", 1)); err != nil {
		return nil, latency{}, err
	}
	var semLease, mutexLease coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sem"}, &semLease); err != nil {
		return nil, latency{}, err
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mutex"}, &mutexLease); err != nil {
		return nil, latency{}, err
	}
	var semEpochs []string
	for _, p := range fkv1.ReadLedger(&semLease, "sem").Permits {
		semEpochs = append(semEpochs, strconv.FormatInt(p.Epoch, 10))
	}
	mutexEpoch := fkv1.ReadLedger(&mutexLease, "mutex").HeldEpoch()
	if len(semEpochs) != semaphoreMax || mutexEpoch == 0 {
		return nil, latency{}, fmt.Errorf("the semaphore's Lease lists %d permits (want %d), the mutex's epoch %d", len(semEpochs), semaphoreMax, mutexEpoch)
	}
	type target struct {
		key    string
		cm     *corev1.ConfigMap
		epochs []string
	}
	fenced := func(name, lock string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{fkv1.LabelLock: lock}, Annotations: map[string]string{}}}
	}
	targets := []target{
		{key: "semaphore", cm: fenced("sem", "sem"), epochs: semEpochs},
		{key: "mutex", cm: fenced("mutex", "mutex"), epochs: []string{strconv.FormatInt(mutexEpoch, 10)}},
		{key: "unguarded", cm: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain", Annotations: map[string]string{}}},
			epochs: []string{strconv.FormatInt(mutexEpoch, 10)}},
	}
	for _, t := range targets {
		t.cm.Annotations[fkv1.AnnotationEpoch] = t.epochs[0]
		if err := c.Create(ctx, t.cm); err != nil {
			return nil, latency{}, fmt.Errorf("creating ConfigMap %s: %w", t.cm.Name, err)
		}
	}
	d := map[string][]time.Duration{}
	for i := 0; i < n; i++ {
		for j := range targets {
			t := targets[(i+j)%len(targets)]
			t.cm.Data = map[string]string{"v": strconv.Itoa(i)}
			// Every content write presents its epoch (admission consumes it).
			t.cm.Annotations[fkv1.AnnotationEpoch] = t.epochs[i%len(t.epochs)]
			start := time.Now()
			if err := c.Update(ctx, t.cm); err != nil {
				return nil, latency{}, fmt.Errorf("update %d of ConfigMap %s: %w", i, t.cm.Name, err)
			}
			d[t.key] = append(d[t.key], time.Since(start))
		}
		if err := f.sample(ctx); err != nil {
			return nil, latency{}, err
		}
	}
	out := map[string]latency{}
	for k := range d {
		out[k] = summarize(d[k])
	}
	return out, f.latency(), nil
}

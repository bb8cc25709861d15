// How every latency in the bench is timed: one watch per namespace
// timestamps the first moment each claim is seen Held, which is what a
// holder's own watch would see (and another the moment a Lease names it).
// Also the claim and namespace helpers the measurements share.
package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// heldWatch timestamps, from one watch on a namespace's claims, the first
// moment each claim is seen Held: what a holder's own watch would see (and
// Pending: queued). A
// second watch, on the namespace's Leases, timestamps the first moment a
// Lease names each claim as its holder (or, of a semaphore lock, lists a
// permit of it): what a holder watching the Lease would see (a diagnostic,
// DESIGN question 12).
type heldWatch struct {
	held, named, pending *firstSeen
	stop                 func()
}

func watchHeld(ctx context.Context, c client.WithWatch, ns string) (*heldWatch, error) {
	claims, err := c.Watch(ctx, &fkv1.FencedLeaseList{}, client.InNamespace(ns))
	if err != nil {
		return nil, err
	}
	leases, err := c.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(ns))
	if err != nil {
		claims.Stop()
		return nil, err
	}
	h := &heldWatch{held: newFirstSeen(), named: newFirstSeen(), pending: newFirstSeen(), stop: func() { claims.Stop(); leases.Stop() }}
	go func() {
		for ev := range claims.ResultChan() {
			now := time.Now()
			if cl, ok := ev.Object.(*fkv1.FencedLease); ok {
				switch cl.Status.Phase {
				case fkv1.PhaseHeld:
					h.held.mark(cl.Name, now)
				case fkv1.PhasePending:
					h.pending.mark(cl.Name, now)
				}
			}
		}
	}()
	go func() {
		for ev := range leases.ResultChan() {
			now := time.Now()
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				if _, permit := fkv1.IsPermitLease(l); permit {
					// A permit's renewal Lease, created after its lock's
					// Lease lists the permit: the lock's Lease is the clock.
					continue
				}
				led := fkv1.ReadLedger(l, l.Name)
				if led.HolderClaim != "" {
					h.named.mark(led.HolderClaim, now)
				}
				// A semaphore's Lease names no holder: it lists a permit per
				// holder, which is what its holders take their grant from.
				for _, p := range led.Permits {
					h.named.mark(p.Claim, now)
				}
			}
		}
	}()
	return h, nil
}

// expect registers interest in a claim before it can be granted: the
// channel gets the moment it is first seen Held.
func (h *heldWatch) expect(name string) chan time.Time { return h.held.expect(name) }

// expectNamed is expect for the moment a Lease first names the claim.
func (h *heldWatch) expectNamed(name string) chan time.Time { return h.named.expect(name) }

// expectPending is expect for the moment the claim is first seen Pending
// (queued).
func (h *heldWatch) expectPending(name string) chan time.Time { return h.pending.expect(name) }

// firstSeen keeps the first moment each name was seen, and hands it to
// whoever expects that name.
type firstSeen struct {
	mu      sync.Mutex
	seen    map[string]time.Time
	waiters map[string]chan time.Time
}

func newFirstSeen() *firstSeen {
	return &firstSeen{seen: map[string]time.Time{}, waiters: map[string]chan time.Time{}}
}

func (f *firstSeen) mark(name string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.seen[name]; ok {
		return
	}
	f.seen[name] = t
	if ch, ok := f.waiters[name]; ok {
		ch <- t
	}
}

func (f *firstSeen) expect(name string) chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan time.Time, 1)
	if t, ok := f.seen[name]; ok {
		ch <- t
	} else {
		f.waiters[name] = ch
	}
	return ch
}

func wait(ch chan time.Time, d time.Duration) (time.Time, error) {
	select {
	case t := <-ch:
		return t, nil
	case <-time.After(d):
		return time.Time{}, fmt.Errorf("not granted within %v", d)
	}
}

func claim(ns, name, lock string, ttl int32) *fkv1.FencedLease {
	return &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(ttl)}}
}

// watchedNS creates a namespace and starts watching its claims.
func watchedNS(ctx context.Context, c client.WithWatch, prefix string) (string, *heldWatch, error) {
	ns, err := newNS(ctx, c, prefix)
	if err != nil {
		return "", nil, err
	}
	h, err := watchHeld(ctx, c, ns)
	return ns, h, err
}

func newNS(ctx context.Context, c client.Client, prefix string) (string, error) {
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1000000)
	return ns, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
}

// How every latency in the bench is timed: one watch per namespace
// timestamps the first moment each claim is seen Held, which is what a
// holder's own watch would see. Also the claim and namespace helpers the
// measurements share.
package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// heldWatch timestamps, from one watch on a namespace, the first moment each
// claim is seen Held: what a holder's own watch would see.
type heldWatch struct {
	mu      sync.Mutex
	held    map[string]time.Time
	waiters map[string]chan time.Time
	stop    func()
}

func watchHeld(ctx context.Context, c client.WithWatch, ns string) (*heldWatch, error) {
	w, err := c.Watch(ctx, &fkv1.FencedLeaseList{}, client.InNamespace(ns))
	if err != nil {
		return nil, err
	}
	h := &heldWatch{held: map[string]time.Time{}, waiters: map[string]chan time.Time{}, stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			now := time.Now()
			cl, ok := ev.Object.(*fkv1.FencedLease)
			if !ok || cl.Status.Phase != fkv1.PhaseHeld {
				continue
			}
			h.mu.Lock()
			if _, seen := h.held[cl.Name]; !seen {
				h.held[cl.Name] = now
				if ch, ok := h.waiters[cl.Name]; ok {
					ch <- now
				}
			}
			h.mu.Unlock()
		}
	}()
	return h, nil
}

// expect registers interest in a claim before it can be granted.
func (h *heldWatch) expect(name string) chan time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan time.Time, 1)
	if t, ok := h.held[name]; ok {
		ch <- t
	} else {
		h.waiters[name] = ch
	}
	return ch
}

func (h *heldWatch) countHeld() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
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

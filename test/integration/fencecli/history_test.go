package fencecli_test

import (
	"context"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// history is every version of the namespace's claims and Leases that a
// watch delivered, from before the spec's first request: what a claim went
// through, and which claims a Lease ever named.
type history struct {
	mu     sync.Mutex
	claims []fkv1.FencedLease
	leases []coordinationv1.Lease
	// ended: a watch closed before the spec stopped it (versions may be
	// missing: the history proves nothing).
	ended bool
	stop  context.CancelFunc
}

// recordHistory watches the namespace's claims and Leases until the spec
// ends; the spec fails if a watch ended early.
func recordHistory(ns string) *history {
	h := &history{}
	wctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	cw, err := admin.Watch(wctx, &fkv1.FencedLeaseList{}, client.InNamespace(ns))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	lw, err := admin.Watch(wctx, &coordinationv1.LeaseList{}, client.InNamespace(ns))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var wg sync.WaitGroup
	record := func(w watch.Interface, keep func(any)) {
		defer wg.Done()
		for ev := range w.ResultChan() {
			h.mu.Lock()
			if ev.Type == watch.Error {
				h.ended = true
			} else {
				keep(ev.Object)
			}
			h.mu.Unlock()
		}
		if wctx.Err() == nil {
			h.mu.Lock()
			h.ended = true
			h.mu.Unlock()
		}
	}
	wg.Add(2)
	go record(cw, func(o any) {
		if c, ok := o.(*fkv1.FencedLease); ok {
			h.claims = append(h.claims, *c.DeepCopy())
		}
	})
	go record(lw, func(o any) {
		if l, ok := o.(*coordinationv1.Lease); ok {
			h.leases = append(h.leases, *l.DeepCopy())
		}
	})
	go func() {
		<-wctx.Done()
		cw.Stop()
		lw.Stop()
	}()
	DeferCleanup(func() {
		cancel()
		wg.Wait()
	})
	return h
}

// complete fails the spec if a watch ended early.
func (h *history) complete() {
	h.mu.Lock()
	defer h.mu.Unlock()
	ExpectWithOffset(1, h.ended).To(BeFalse(), "a history watch ended early: versions may be missing")
}

// claimsOf are the UIDs of the holder's claims of the lock, in the order
// they first appeared.
func (h *history) claimsOf(lock, holder string) []types.UID {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []types.UID
	seen := map[types.UID]bool{}
	for _, c := range h.claims {
		if c.Spec.LockName == lock && c.Spec.HolderIdentity == holder && !seen[c.UID] {
			seen[c.UID] = true
			out = append(out, c.UID)
		}
	}
	return out
}

// last is the last version of the claim seen.
func (h *history) last(uid types.UID) *fkv1.FencedLease {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.claims) - 1; i >= 0; i-- {
		if h.claims[i].UID == uid {
			return h.claims[i].DeepCopy()
		}
	}
	return nil
}

// everHeld reports whether any version of the claim showed it Held or with
// an epoch.
func (h *history) everHeld(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.claims {
		if c.UID == uid && (c.Status.Phase == fkv1.PhaseHeld || c.Status.Epoch != 0) {
			return true
		}
	}
	return false
}

// everTimedOut reports whether any version of the claim showed it ended
// for its acquire timeout.
func (h *history) everTimedOut(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.claims {
		if c.UID == uid {
			if cond := meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld); cond != nil && cond.Reason == fkv1.ReasonAcquireTimeout {
				return true
			}
		}
	}
	return false
}

// namedWith are the epochs with which Lease versions named the claim (the
// grant is the Lease naming it).
func (h *history) namedWith(uid types.UID) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, l := range h.leases {
		if l.Annotations[fkv1.AnnotationClaimUID] == string(uid) {
			out = append(out, l.Annotations[fkv1.AnnotationEpoch])
		}
	}
	return out
}

// listedTimedOut reports whether a Lease version recorded the claim as
// ended for its acquire timeout (the authority's record of the timeout,
// written before the claim's status).
func (h *history) listedTimedOut(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.leases {
		if fkv1.ReadLedger(&h.leases[i], h.leases[i].Name).TimedOutClaim(uid) {
			return true
		}
	}
	return false
}

// Package history records, for a Ginkgo spec, every version of a
// namespace's claims and Leases that a watch delivers: what a claim went
// through, and which claims a Lease ever named. Its failures are Gomega
// assertions, so it serves specs only.
package history

import (
	"context"
	"sync"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// History is every version of the namespace's claims and Leases that a
// watch delivered, from before the spec's first request.
type History struct {
	mu     sync.Mutex
	claims []fkv1.FencedLease
	// claimDeleted[i] is true when claims[i] came with a DELETED event.
	claimDeleted []bool
	leases       []coordinationv1.Lease
	// ended: a watch closed before the spec stopped it (versions may be
	// missing: the history proves nothing).
	ended bool
}

// Record watches the namespace's claims and Leases with c until the spec
// ends (it registers its own DeferCleanup); Complete fails the spec if a
// watch ended early.
func Record(c client.WithWatch, ns string) *History {
	h := &History{}
	wctx, cancel := context.WithCancel(context.Background())
	cw, err := c.Watch(wctx, &fkv1.FencedLeaseList{}, client.InNamespace(ns))
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	lw, err := c.Watch(wctx, &coordinationv1.LeaseList{}, client.InNamespace(ns))
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	var wg sync.WaitGroup
	record := func(w watch.Interface, keep func(watch.EventType, any)) {
		defer wg.Done()
		for ev := range w.ResultChan() {
			h.mu.Lock()
			if ev.Type == watch.Error {
				h.ended = true
			} else {
				keep(ev.Type, ev.Object)
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
	go record(cw, func(t watch.EventType, o any) {
		if c, ok := o.(*fkv1.FencedLease); ok {
			h.claims = append(h.claims, *c.DeepCopy())
			h.claimDeleted = append(h.claimDeleted, t == watch.Deleted)
		}
	})
	go record(lw, func(_ watch.EventType, o any) {
		if l, ok := o.(*coordinationv1.Lease); ok {
			h.leases = append(h.leases, *l.DeepCopy())
		}
	})
	go func() {
		<-wctx.Done()
		cw.Stop()
		lw.Stop()
	}()
	ginkgo.DeferCleanup(func() {
		cancel()
		wg.Wait()
	})
	return h
}

// ClaimEvent is one claim version the watch delivered, and whether it came
// with the claim's deletion.
type ClaimEvent struct {
	Claim   fkv1.FencedLease
	Deleted bool
}

// ClaimEvents are the claim versions seen so far, in the order seen, with
// their deletions.
func (h *History) ClaimEvents() []ClaimEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]ClaimEvent, len(h.claims))
	for i := range h.claims {
		out[i] = ClaimEvent{Claim: *h.claims[i].DeepCopy(), Deleted: h.claimDeleted[i]}
	}
	return out
}

// Complete fails the spec if a watch ended early.
func (h *History) Complete() {
	h.mu.Lock()
	defer h.mu.Unlock()
	gomega.ExpectWithOffset(1, h.ended).To(gomega.BeFalse(), "a history watch ended early: versions may be missing")
}

// Claims are the claim versions seen so far, in the order seen.
func (h *History) Claims() []fkv1.FencedLease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return deepCopies(h.claims)
}

// Leases are the Lease versions seen so far, in the order seen.
func (h *History) Leases() []coordinationv1.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return deepCopies(h.leases)
}

// deepCopies are deep copies of in's objects.
func deepCopies[T any, PT interface {
	*T
	DeepCopyInto(*T)
}](in []T) []T {
	out := make([]T, len(in))
	for i := range in {
		PT(&in[i]).DeepCopyInto(&out[i])
	}
	return out
}

// ClaimsOf are the UIDs of the holder's claims of the lock, in the order
// they first appeared.
func (h *History) ClaimsOf(lock, holder string) []types.UID {
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

// Last is the last version of the claim seen, or nil.
func (h *History) Last(uid types.UID) *fkv1.FencedLease {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.claims) - 1; i >= 0; i-- {
		if h.claims[i].UID == uid {
			return h.claims[i].DeepCopy()
		}
	}
	return nil
}

// EverHeld reports whether any version of the claim showed it Held or with
// an epoch.
func (h *History) EverHeld(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.claims {
		if c.UID == uid && (c.Status.Phase == fkv1.PhaseHeld || c.Status.Epoch != 0) {
			return true
		}
	}
	return false
}

// EverTimedOut reports whether any version of the claim showed it ended
// for its acquire timeout.
func (h *History) EverTimedOut(uid types.UID) bool {
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

// NamedWith are the epochs with which Lease versions named the claim (the
// grant is the Lease naming it).
func (h *History) NamedWith(uid types.UID) []string {
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

// ListedTimedOut reports whether a Lease version recorded the claim as
// ended for its acquire timeout (the authority's record of the timeout,
// written before the claim's status).
func (h *History) ListedTimedOut(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.leases {
		if fkv1.ReadLedger(&h.leases[i], h.leases[i].Name).TimedOutClaim(uid) {
			return true
		}
	}
	return false
}

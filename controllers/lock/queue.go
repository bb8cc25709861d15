package lock

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// DefaultMaxWaiters is how many claims may wait for one lock (seed §21: do
// not allow unlimited waiters).
const DefaultMaxWaiters = 1000

// queueFull returns the claims a lock turns away: new claims (no phase yet)
// that arrive when max claims already wait. Claims already queued count
// first, then new ones in FIFO order take the free places. A claim already
// queued is never turned away, and neither is a pod's claim (it takes a
// place but the pod bridge would only make it again; a Deployment's
// replicas bound that queue). Only a claim the bridge made counts as a
// pod's (pods.BridgeRef): an ownerReference to a pod, which anyone may
// write, does not jump the limit. max <= 0 means no limit.
func queueFull(claims []*fkv1.FencedLease, l fkv1.Ledger, max int) map[types.UID]bool {
	if max <= 0 || len(claims) <= max {
		return nil // no limit, or fewer claims than places: nothing to sort
	}
	// A claim that records no identity is never granted, so it takes no
	// place: left behind from before the claim-identity policy, it must not
	// fill the queue for good.
	waiting := slices.DeleteFunc(waitingInOrder(claims, l), fkv1.RecordsNoIdentity)
	free := max
	for _, c := range waiting {
		if c.Status.Phase != "" {
			free--
		}
	}
	var full map[types.UID]bool
	for _, c := range waiting {
		switch {
		case c.Status.Phase != "":
		case free > 0 || pods.BridgeRef(c) != nil:
			free--
		default:
			if full == nil {
				full = map[types.UID]bool{}
			}
			full[c.UID] = true
		}
	}
	return full
}

// fifo is the order of a lock's claims (fifoCompare) as its last reconcile
// saw them, kept in the lock's memory, so that a reconcile puts the claims
// it lists in queue order without sorting them all: the claims it knew keep
// their places, and only new ones are sorted and placed. Its work per
// reconcile is one pass over the claims, plus the new claims' sort.
type fifo []types.UID

// order returns claims in queue order, and the fifo that remembers it.
func (q fifo) order(claims []*fkv1.FencedLease) ([]*fkv1.FencedLease, fifo) {
	byUID := make(map[types.UID]*fkv1.FencedLease, len(claims))
	for _, c := range claims {
		byUID[c.UID] = c
	}
	out := make([]*fkv1.FencedLease, 0, len(claims))
	for _, uid := range q {
		if c, ok := byUID[uid]; ok {
			out = append(out, c)
			delete(byUID, uid)
		}
	}
	known := len(out)
	for _, c := range claims {
		if _, isNew := byUID[c.UID]; isNew {
			out = append(out, c)
		}
	}
	slices.SortFunc(out[known:], fifoCompare)
	if known > 0 && known < len(out) && fifoCompare(out[known], out[known-1]) < 0 {
		// A new claim older than one already queued (the cache showed
		// it late): the two sorted runs are merged by a sort.
		slices.SortFunc(out, fifoCompare)
	}
	next := make(fifo, len(out))
	for i, c := range out {
		next[i] = c.UID
	}
	return out, next
}

package lock

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// PriorityHandover is the lock queue's priority for work that ends or
// hands over a hold: a claim's deletion (a release, or a waiter leaving)
// and the authority's own timers (a hold's expiry, an acquire timeout).
// It goes ahead of new claims and status changes (priority 0) and of
// resyncs (controller-runtime's low priority), so a burst of thousands of
// new claims does not delay the next holder of a lock already held.
// controller-runtime's queue keeps an item's higher priority when it is
// added again, so a lock whose timer is pending (one with a holder or a
// bounded waiter) is taken at PriorityHandover for any event until then.
// Ordering only: what a reconcile decides does not depend on it.
const PriorityHandover = 10

// handoverFirst is the claims' event handler: claimToLock, with deletions
// queued at PriorityHandover.
type handoverFirst struct {
	handler.EventHandler
}

func claimEvents() handler.EventHandler {
	return handoverFirst{EventHandler: handler.EnqueueRequestsFromMapFunc(claimToLock)}
}

// Delete queues the claim's lock at PriorityHandover (with a queue that has
// priorities; otherwise as any event).
func (h handoverFirst) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
	if !ok || e.Object == nil {
		h.EventHandler.Delete(ctx, e, q)
		return
	}
	pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(PriorityHandover)}, claimToLock(ctx, e.Object)...)
}

// timer is a reconcile's result when its lock has a timer to keep: it
// comes back at PriorityHandover.
func timer(after time.Duration) reconcile.Result {
	if after <= 0 {
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: after, Priority: ptr.To(PriorityHandover)}
}

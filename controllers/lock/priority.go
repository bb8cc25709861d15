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
// and the authority's own timers once due (a hold's expiry, an acquire
// timeout). It goes ahead of new claims and status changes (priority 0)
// and of resyncs (controller-runtime's low priority), so a burst of
// thousands of new claims does not delay the next holder of a lock already
// held.
//
// controller-runtime's queue keeps an item's higher priority when it is
// added again (and its earlier time): a lock whose timer is queued at
// PriorityHandover is taken at it for any event until then. So a timer is
// queued at PriorityHandover only for its last timerDueWindow, and at 0
// before that (see timer): a held lock's renewals and status changes go in
// line with new claims, and a load of them cannot starve new locks. A
// timer whose first stage waits behind a backlog longer than the window
// is due when its lock is taken, and that reconcile acts on it: late by
// the backlog's wait, never early.
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

// timerDueWindow is how long before its time a timer moves up to
// PriorityHandover.
const timerDueWindow = time.Second

// timer is a reconcile's result when its lock has a timer to keep: due
// within timerDueWindow, it comes back then at PriorityHandover; later, it
// comes back timerDueWindow early at priority 0, and that reconcile (which
// decides nothing new unless something changed) queues the rest.
func timer(after time.Duration) reconcile.Result {
	switch {
	case after <= 0:
		return reconcile.Result{}
	case after <= timerDueWindow:
		return reconcile.Result{RequeueAfter: after, Priority: ptr.To(PriorityHandover)}
	default:
		return retry(after - timerDueWindow)
	}
}

// retry is a reconcile's result when its lock must be looked at again
// after d, at priority 0 whatever priority it was taken at (a lock taken
// from the initial list at controller-runtime's low priority would
// otherwise wait behind every other lock, one taken at PriorityHandover go
// ahead of them). A retry after a race lost keeps the priority it was
// taken at: the other writer's event queues the lock as well.
func retry(d time.Duration) reconcile.Result {
	return reconcile.Result{RequeueAfter: d, Priority: ptr.To(0)}
}

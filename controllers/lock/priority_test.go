package lock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func claimOn(lock, name string) *fkv1.FencedLease {
	c := &fkv1.FencedLease{}
	c.Namespace, c.Name, c.Spec.LockName = "ns", name, lock
	return c
}

// A release behind a backlog of new claims is handed over first: the
// claim's deletion queues its lock ahead of every lock queued by a create.
func TestClaimDeletionQueuedAhead(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	h := claimEvents()
	ctx := context.Background()
	for i := range 500 {
		h.Create(ctx, event.CreateEvent{Object: claimOn(fmt.Sprintf("new-%d", i), "c")}, q)
	}
	h.Delete(ctx, event.DeleteEvent{Object: claimOn("held", "holder")}, q)
	// A lock already queued by a create moves up when one of its claims is
	// deleted.
	h.Delete(ctx, event.DeleteEvent{Object: claimOn("new-250", "c")}, q)

	got := map[string]int{}
	for range 2 {
		req, prio, _ := q.GetWithPriority()
		got[req.Name] = prio
		q.Done(req)
	}
	want := map[string]int{"held": PriorityHandover, "new-250": PriorityHandover}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("first out of the queue: %v, want %v (the deleted claims' locks, at PriorityHandover)", got, want)
	}
	req, prio, _ := q.GetWithPriority()
	if req.NamespacedName != (types.NamespacedName{Namespace: "ns", Name: "new-0"}) || prio != 0 {
		t.Fatalf("then %v at %d, want ns/new-0 at 0 (creates in order)", req, prio)
	}
}

// The authority's timers (expiry, acquire timeout) come back at
// PriorityHandover for their last timerDueWindow only, and timerDueWindow
// early at 0 before that; no timer, no requeue. Other requeues are at 0.
func TestTimerPriority(t *testing.T) {
	for _, tc := range []struct {
		after, want time.Duration
		prio        int
	}{
		{timerDueWindow, timerDueWindow, PriorityHandover},
		{300 * time.Millisecond, 300 * time.Millisecond, PriorityHandover},
		{3 * time.Second, 3*time.Second - timerDueWindow, 0},
		{time.Hour, time.Hour - timerDueWindow, 0},
	} {
		r := timer(tc.after)
		if r.RequeueAfter != tc.want || r.Priority == nil || *r.Priority != tc.prio {
			t.Errorf("timer(%v) = %+v, want RequeueAfter %v at priority %d", tc.after, r, tc.want, tc.prio)
		}
	}
	if r := timer(0); r.RequeueAfter != 0 || r.Priority != nil {
		t.Fatalf("timer(0) = %+v, want no requeue", r)
	}
	if r := retry(time.Second); r.RequeueAfter != time.Second || r.Priority == nil || *r.Priority != 0 {
		t.Fatalf("retry(1s) = %+v, want RequeueAfter 1s at priority 0", r)
	}
}

// A held lock's events before its timer is due (a renewal, a status
// change) go in line with new claims, not ahead of them: however often a
// held lock renews, a new lock queued behind it is taken after its next
// turn. Once due, a timer's lock goes ahead.
func TestHeldLockEventsQueuedInLine(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	h := claimEvents()
	ctx := context.Background()
	requeue := func(lock string, r reconcile.Result) {
		// as controller-runtime queues a reconcile's RequeueAfter
		q.AddWithOpts(priorityqueue.AddOpts{After: r.RequeueAfter, Priority: r.Priority},
			reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: lock}})
	}
	renew := func(lock string) {
		h.Update(ctx, event.UpdateEvent{ObjectOld: claimOn(lock, "holder"), ObjectNew: claimOn(lock, "holder")}, q)
	}
	requeue("held", timer(time.Hour))     // a holder's expiry, far off
	requeue("due", timer(timerDueWindow)) // a holder's expiry, soon
	for i := range 3 {
		h.Create(ctx, event.CreateEvent{Object: claimOn(fmt.Sprintf("new-%d", i), "c")}, q)
	}
	renew("held")
	renew("due")

	var got []string
	for range 6 {
		req, prio, _ := q.GetWithPriority()
		got = append(got, fmt.Sprintf("%s@%d", req.Name, prio))
		q.Done(req)
		if req.Name == "held" {
			// Its reconcile keeps the timer, and the holder renews again
			// while the new claims wait.
			requeue("held", timer(time.Hour))
			renew("held")
		}
	}
	want := []string{"due@10", "held@0", "new-0@0", "new-1@0", "new-2@0", "held@0"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("out of the queue: %v, want %v (a timer due soon first; a renewing held lock in line with the new claims)", got, want)
	}
}

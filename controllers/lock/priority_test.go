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
// PriorityHandover; no timer, no requeue.
func TestTimerPriority(t *testing.T) {
	r := timer(3 * time.Second)
	if r.RequeueAfter != 3*time.Second || r.Priority == nil || *r.Priority != PriorityHandover {
		t.Fatalf("timer(3s) = %+v, want RequeueAfter 3s at PriorityHandover", r)
	}
	if r := timer(0); r.RequeueAfter != 0 || r.Priority != nil {
		t.Fatalf("timer(0) = %+v, want no requeue", r)
	}
}

package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Nothing is granted before the term's floor is read; a read that was in
// flight when a new term started (the Lease informer relisted: perhaps an
// etcd restore) is not that term's floor; the locks that waited are queued
// again once it is read.
func TestTermFloorIsReadAfterTheTermStarts(t *testing.T) {
	f, calls := startManualFloor(t)
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	if _, _, ok := f.get(a); ok {
		t.Fatal("a floor before any read")
	}
	first := <-calls // the read of the first term is in flight
	f.newTerm()      // the informer relisted
	first <- 100
	second := <-calls
	if floor, _, ok := f.get(a); ok {
		t.Fatalf("floor %d from a read that started before the term", floor)
	}
	second <- 200
	if woken := waitFloorReady(t, f); woken != a {
		t.Fatalf("woke %v", woken)
	}
	if floor, term, ok := f.get(a); !ok || floor != 200 || !f.current(term) {
		t.Fatalf("got %d %v, want 200", floor, ok)
	}
	// The floor holds for the term: no read per grant.
	select {
	case <-calls:
		t.Fatal("a second read in the same term")
	case <-time.After(50 * time.Millisecond):
	}
}

// A failed read is retried; the term has no floor (no grant) until one
// succeeds.
func TestTermFloorRetriesAFailedRead(t *testing.T) {
	fail := true
	f := newTermFloor(func(ctx context.Context) (int64, error) {
		if fail {
			fail = false
			return 0, errors.New("apiserver unavailable")
		}
		return 7, nil
	})
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	if _, _, ok := f.get(a); ok {
		t.Fatal("a floor before the term started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = f.Start(ctx) }()
	waitFloorReady(t, f)
	if floor, _, ok := f.get(a); !ok || floor != 7 {
		t.Fatalf("got %d %v; want 7", floor, ok)
	}
}

// Every grant of a term is at least its floor, whatever the counter says:
// a counter restored from a snapshot (set back below epochs issued after
// it) counts on from the floor.
func TestGrantsAreAtLeastTheTermFloor(t *testing.T) {
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	for _, tc := range []struct {
		name  string
		snap  snapshot
		epoch int64
	}{
		{"a counter below the floor", snapshot{ledger: free(41), claims: []*fkv1.FencedLease{w2}, termFloor: 5000, storageRevision: 90}, 5000},
		{"a counter above the floor counts on", snapshot{ledger: free(6000), claims: []*fkv1.FencedLease{w2}, termFloor: 5000, storageRevision: 90}, 6001},
		{"a valid counter ignores the Lease's resourceVersion", snapshot{ledger: free(41), claims: []*fkv1.FencedLease{w2}, termFloor: 30, storageRevision: 9000}, 42},
		{"a new ledger starts at the resourceVersion of the free Lease", snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true, EpochValid: true}, hasLease: true, claims: []*fkv1.FencedLease{w2}, termFloor: 30, storageRevision: 9000}, 9000},
	} {
		a := decide(tc.snap)
		if a.kind != actGrant || a.epoch != tc.epoch {
			t.Errorf("%s: %v at %d, want a grant at %d", tc.name, a.kind, a.epoch, tc.epoch)
		}
	}
}

func waitFloorReady(t *testing.T, f *termFloor) types.NamespacedName {
	t.Helper()
	select {
	case ev := <-f.ready:
		return types.NamespacedName{Namespace: ev.Object.GetNamespace(), Name: ev.Object.GetName()}
	case <-time.After(5 * time.Second):
		t.Fatal("no lock was queued again")
	}
	return types.NamespacedName{}
}

// startManualFloor runs a termFloor whose reads each wait for the test to
// send the revision on the channel the read hands out.
func startManualFloor(t *testing.T) (*termFloor, chan chan int64) {
	calls := make(chan chan int64)
	f := newTermFloor(func(ctx context.Context) (int64, error) {
		answer := make(chan int64)
		select {
		case calls <- answer:
			return <-answer, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = f.Start(ctx) }()
	return f, calls
}

// A reconcile that read its floor in one term sends no Lease write once
// another term has begun (perhaps an etcd restore its cache and floor
// predate): it decides again in the new term.
func TestNoLeaseWriteAfterTheTermChanged(t *testing.T) {
	f, calls := startManualFloor(t)
	(<-calls) <- 100
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	var term uint64
	for deadline := time.Now().Add(5 * time.Second); ; {
		var ok bool
		if _, term, ok = f.get(a); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no floor")
		}
		time.Sleep(time.Millisecond)
	}
	r := NewReconciler(nil, nil, nil, Options{})
	r.floor = f
	f.newTerm()
	for _, kind := range []actionKind{actGrant, actFree, actRepair} {
		w := claim("w2", 2, fkv1.PhasePending, 0)
		// The reconciler has no client: a write would panic.
		res, err := actOn(r, a, gathered{term: term}, action{kind: kind, holder: w, epoch: 101})
		if err != nil || res.RequeueAfter <= 0 {
			t.Fatalf("%v: %v %v", kind, res, err)
		}
	}
	if l, err := r.createLedger(context.Background(), a, term, &lockMemory{}); l != nil || err != nil {
		t.Fatalf("a free Lease created in an old term: %v %v", l, err)
	}
}

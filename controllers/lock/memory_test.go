package lock

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
)

// actOn runs act on lock as Reconcile does: on a copy of the lock's memory,
// written back once.
func actOn(r *Reconciler, lock types.NamespacedName, g gathered, a action) (ctrl.Result, error) {
	loaded := r.memory.load(lock)
	mem := loaded
	defer func() { r.memory.store(lock, loaded, mem) }()
	return r.act(context.Background(), lock, g, a, &mem)
}

// remember changes what r remembers about lock, as one reconcile would.
func remember(r *Reconciler, lock types.NamespacedName, f func(*lockMemory)) {
	loaded := r.memory.load(lock)
	mem := loaded
	f(&mem)
	r.memory.store(lock, loaded, mem)
}

// remembered is a copy of what r remembers about lock, and whether it has
// an entry at all.
func remembered(r *Reconciler, lock types.NamespacedName) (lockMemory, bool) {
	r.memory.mu.Lock()
	_, ok := r.memory.locks[lock]
	r.memory.mu.Unlock()
	return r.memory.load(lock), ok
}

// A reconcile's write-back keeps a Lease expectation a term's CatchUp set
// meanwhile when it is the later one, and never resurrects a view that was
// withdrawn meanwhile.
func TestMemoryWriteBackKeepsConcurrentCatchUp(t *testing.T) {
	m := newMemory()
	lock := types.NamespacedName{Namespace: "ns", Name: "x"}
	loaded := m.load(lock)
	mem := loaded
	mem.wroteLease(leaseVersion{uid: "lease-1", rv: "20"})
	m.expectLease(lock, leaseVersion{uid: "lease-1", rv: "25"}) // CatchUp, during the reconcile
	m.store(lock, loaded, mem)
	if got := m.load(lock).leaseExpect; got.rv != "25" {
		t.Fatalf("the write-back replaced a later expectation: %+v", got)
	}

	loaded = m.load(lock)
	mem = loaded
	mem.leaseExpect = leaseVersion{} // the cache reached it
	m.expectLease(lock, leaseVersion{uid: "lease-1", rv: "30"})
	m.store(lock, loaded, mem)
	if got := m.load(lock).leaseExpect; got.rv != "30" {
		t.Fatalf("dropping a reached expectation dropped a newer one set meanwhile: %+v", got)
	}

	m.publishView(lock, View{HeldEpoch: 41})
	loaded = m.load(lock)
	mem = loaded
	m.publishView(lock, View{})
	m.store(lock, loaded, mem)
	if _, ok := m.view(lock); ok {
		t.Fatal("a reconcile's write-back brought back a withdrawn view")
	}
}

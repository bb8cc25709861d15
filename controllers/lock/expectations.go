package lock

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// writeExpectations remembers, per lock, the resourceVersion of each object
// this process last wrote, so a reconcile that runs before the informer cache
// has caught up with our own write waits for it instead of deciding on the
// older copy. For claims that only saves a request the apiserver would
// refuse (every write is resourceVersion-guarded). For the Lease it is also
// what a new term relies on before it vouches for anything (CatchUp): the
// Lease version this process wrote or read live, which the cache must show
// before the lock is decided on again. So a Lease expectation is kept while
// the cache shows no Lease, or another one (a cache that has not seen the
// Lease's creation yet), until the cache reaches it or a live read shows
// that Lease gone.
type writeExpectations struct {
	mu      sync.Mutex
	written map[types.NamespacedName]map[types.UID]string
	leases  map[types.NamespacedName]leaseVersion
}

// leaseVersion is one version of a lock's Lease.
type leaseVersion struct {
	uid types.UID
	rv  string
}

func newWriteExpectations() *writeExpectations {
	return &writeExpectations{written: map[types.NamespacedName]map[types.UID]string{}, leases: map[types.NamespacedName]leaseVersion{}}
}

// wroteLease expects the cache to show lock's Lease at uid and rv, or
// later: of two expectations the later version is kept (a term's CatchUp
// must not replace the version of a grant that committed after its read).
func (e *writeExpectations) wroteLease(lock types.NamespacedName, uid types.UID, rv string) {
	if uid == "" || rv == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if had, ok := e.leases[lock]; ok {
		if cmp, err := resourceversion.CompareResourceVersion(had.rv, rv); err == nil && cmp > 0 {
			return
		}
	}
	e.leases[lock] = leaseVersion{uid: uid, rv: rv}
}

// leaseBehind reports whether the cached Lease (uid at rv; uid "" for
// none) is older than the one expected, and whether the cache shows
// another Lease or none at all (missing: only a live read can tell
// whether the expected one still exists).
func (e *writeExpectations) leaseBehind(lock types.NamespacedName, uid types.UID, rv string) (behind, missing bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	want, ok := e.leases[lock]
	switch {
	case !ok:
		return false, false
	case uid != want.uid:
		return true, true
	}
	cmp, err := resourceversion.CompareResourceVersion(rv, want.rv)
	if err != nil || cmp >= 0 {
		delete(e.leases, lock)
		return false, false
	}
	return true, false
}

// expectedLease returns the Lease version expected for lock.
func (e *writeExpectations) expectedLease(lock types.NamespacedName) (leaseVersion, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.leases[lock]
	return v, ok
}

// dropLease forgets the Lease expected for lock if it is still want (a live
// read showed that Lease gone).
func (e *writeExpectations) dropLease(lock types.NamespacedName, want leaseVersion) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leases[lock] == want {
		delete(e.leases, lock)
	}
}

func (e *writeExpectations) wrote(lock types.NamespacedName, uid types.UID, rv string) {
	if uid == "" || rv == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.written[lock] == nil {
		e.written[lock] = map[types.UID]string{}
	}
	e.written[lock][uid] = rv
}

// forget drops what is remembered for lock's objects (the lock is idle).
func (e *writeExpectations) forget(lock types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.written, lock)
	delete(e.leases, lock)
}

// retain keeps only the entries of lock's claims that still exist: a claim
// deleted right after our write is never seen again to clear its entry.
// (The Lease's expectation is not touched: see leaseBehind.)
func (e *writeExpectations) retain(lock types.NamespacedName, live map[types.UID]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid := range e.written[lock] {
		if !live[uid] {
			delete(e.written[lock], uid)
		}
	}
	if len(e.written[lock]) == 0 {
		delete(e.written, lock)
	}
}

// stale reports whether the cached copy of one of lock's objects (uid at
// cachedRV) is older than our last write of it.
func (e *writeExpectations) stale(lock types.NamespacedName, uid types.UID, cachedRV string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	want, ok := e.written[lock][uid]
	if !ok {
		return false
	}
	cmp, err := resourceversion.CompareResourceVersion(cachedRV, want)
	if err != nil || cmp >= 0 {
		delete(e.written[lock], uid)
		return false
	}
	return true
}

// size is how many entries are remembered (for tests).
func (e *writeExpectations) size() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.leases)
	for _, m := range e.written {
		n += len(m)
	}
	return n
}

package lock

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// writeExpectations remembers, per lock, the resourceVersion of each object
// this process last wrote, so a reconcile that runs before the informer cache
// has caught up with our own write waits for it instead of deciding on the
// older copy. That decision would be refused anyway (every write is
// resourceVersion-guarded); waiting just saves the rejected request. Safety
// never depends on this.
type writeExpectations struct {
	mu      sync.Mutex
	written map[types.NamespacedName]map[types.UID]string
}

func newWriteExpectations() *writeExpectations {
	return &writeExpectations{written: map[types.NamespacedName]map[types.UID]string{}}
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
}

// retain keeps only the entries of lock's objects that still exist: a claim
// deleted right after our write is never seen again to clear its entry.
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
	n := 0
	for _, m := range e.written {
		n += len(m)
	}
	return n
}

package lock

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// writeExpectations remembers the resourceVersion of each object this process
// last wrote, so a reconcile that runs before the informer cache has caught up
// with our own write waits for it instead of deciding on the older copy. That
// decision would be refused anyway (every write is resourceVersion-guarded);
// waiting just saves the rejected request. Safety never depends on this.
type writeExpectations struct {
	mu      sync.Mutex
	written map[types.UID]expectation
}

type expectation struct {
	rv   string
	lock types.NamespacedName
}

func newWriteExpectations() *writeExpectations {
	return &writeExpectations{written: map[types.UID]expectation{}}
}

func (e *writeExpectations) wrote(lock types.NamespacedName, uid types.UID, rv string) {
	if uid == "" || rv == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.written[uid] = expectation{rv: rv, lock: lock}
}

// forget drops what is remembered for lock's objects: an idle lock has no
// claims left, and a claim deleted right after our write is never seen again
// to clear its entry.
func (e *writeExpectations) forget(lock types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid, x := range e.written {
		if x.lock == lock {
			delete(e.written, uid)
		}
	}
}

// stale reports whether the cached copy (uid at cachedRV) is older than our
// last write of it.
func (e *writeExpectations) stale(uid types.UID, cachedRV string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	want, ok := e.written[uid]
	if !ok {
		return false
	}
	cmp, err := resourceversion.CompareResourceVersion(cachedRV, want.rv)
	if err != nil || cmp >= 0 {
		delete(e.written, uid)
		return false
	}
	return true
}

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
	written map[types.UID]string
}

func newWriteExpectations() *writeExpectations {
	return &writeExpectations{written: map[types.UID]string{}}
}

func (e *writeExpectations) wrote(uid types.UID, rv string) {
	if uid == "" || rv == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.written[uid] = rv
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
	cmp, err := resourceversion.CompareResourceVersion(cachedRV, want)
	if err != nil || cmp >= 0 {
		delete(e.written, uid)
		return false
	}
	return true
}

package lock

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// epochFloors remembers the highest epoch this process has seen per lock:
// one of the floors the next epoch must stay above when the Lease is edited
// or deleted. The remembered floor never goes down.
type epochFloors struct {
	mu     sync.Mutex
	floors map[types.NamespacedName]int64
}

func newEpochFloors() *epochFloors {
	return &epochFloors{floors: map[types.NamespacedName]int64{}}
}

// raise records an epoch seen for the lock and returns the lock's floor.
func (f *epochFloors) raise(lock types.NamespacedName, epochs ...int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	floor := f.floors[lock]
	for _, e := range epochs {
		floor = max(floor, e)
	}
	f.floors[lock] = floor
	return floor
}

// forget drops lock's floor: only once its Lease is gone (see
// Reconciler.forget).
func (f *epochFloors) forget(lock types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.floors, lock)
}

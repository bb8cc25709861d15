package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// renewalTracker remembers, per lock, when this controller last observed the
// holder or the renewTime of the backing Lease change, on its own monotonic
// clock. A lease expires leaseDuration after that observation. Nothing here
// survives a restart, which is the point: after a restart every lease gets a
// fresh full TTL (late takeover, never early).
//
// It also remembers the highest epoch this process has seen per lock, one of
// the floors the next epoch must stay above when the Lease is edited or
// deleted.
type renewalTracker struct {
	clock clock.PassiveClock

	mu    sync.Mutex
	locks map[types.NamespacedName]*lockMemory
}

type lockMemory struct {
	claimUID  types.UID
	renewTime string
	seenAt    time.Time
	maxEpoch  int64
}

func newRenewalTracker(c clock.PassiveClock) *renewalTracker {
	return &renewalTracker{clock: c, locks: map[types.NamespacedName]*lockMemory{}}
}

// observe records the holder and renewTime currently on the Lease and returns
// when this controller first saw that pair.
func (t *renewalTracker) observe(lock types.NamespacedName, claimUID types.UID, renewTime string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.memory(lock)
	if m.seenAt.IsZero() || m.claimUID != claimUID || m.renewTime != renewTime {
		m.claimUID, m.renewTime, m.seenAt = claimUID, renewTime, t.clock.Now()
	}
	return m.seenAt
}

// raiseFloor records an epoch seen for the lock; the remembered floor never
// goes down.
func (t *renewalTracker) raiseFloor(lock types.NamespacedName, epoch int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.memory(lock)
	if epoch > m.maxEpoch {
		m.maxEpoch = epoch
	}
}

func (t *renewalTracker) floor(lock types.NamespacedName) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.memory(lock).maxEpoch
}

func (t *renewalTracker) now() time.Time { return t.clock.Now() }

func (t *renewalTracker) memory(lock types.NamespacedName) *lockMemory {
	m, ok := t.locks[lock]
	if !ok {
		m = &lockMemory{}
		t.locks[lock] = m
	}
	return m
}

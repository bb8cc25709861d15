package lock

import (
	"maps"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// lockMemory is everything this process remembers about one lock between
// its reconciles. A reconcile loads a copy (gather works on it), and writes
// it back once when it ends; controller-runtime runs one reconcile per lock
// at a time, so nothing else changes it meanwhile, except a term's CatchUp
// (which only ever raises leaseExpect, see memory.store) and the view, which
// the webhook reads concurrently and which is therefore published on its
// own (memory.publishView).
type lockMemory struct {
	// renewal is when this process first observed the holder's current
	// renewal signal, on its own monotonic clock (clock.go); renewalSeen is
	// false before the first look.
	renewal     observed
	renewalSeen bool
	// floor is the highest epoch this process has seen for the lock: one of
	// the floors the next epoch must stay above when the Lease is edited or
	// deleted. It never goes down while the lock's Lease exists.
	floor int64
	// leaseExpect is the Lease version this process last wrote or read live,
	// which the cache must show before the lock is decided on again (zero:
	// none). It is kept while the cache shows no Lease, or another one,
	// until the cache reaches it or a live read shows that Lease gone.
	leaseExpect leaseVersion
	// claimWrites is the resourceVersion of each claim status this process
	// wrote, until the cache shows it: deciding on an older copy would only
	// lose a resourceVersion race.
	claimWrites map[types.UID]string
	// uncertain is true while the last Lease write failed without a refusal
	// (a timeout, a lost reply): it may have committed. uncertainReplaced is
	// the resourceVersion that write replaced ("" for a create). Until a
	// live read settles it, the cache may show the Lease from before that
	// write while the apiserver stores the new grant, so nothing is vouched
	// for.
	uncertain         bool
	uncertainReplaced string
	// foreign is true while a same-named Lease fencekeeper does not manage
	// is known to block the lock: it is outside the cache and read live.
	foreign bool
	// waiting and oldestWaiter summarize the lock's queue as its last
	// reconcile left it, heldSince when its current hold began: all the
	// waiter and hold gauges need, so a scrape never lists claims.
	waiting      int
	oldestWaiter time.Time
	heldSince    time.Time
	// queue is the order of the lock's claims at its last reconcile.
	queue fifo
	// firstSeen is when this process first observed each waiting claim that
	// sets acquireTimeoutSeconds (its own clock, never creationTimestamp).
	firstSeen map[types.UID]time.Time
	// permitRenewals is, for a semaphore lock, when this process first
	// observed each live permit's current renewal signal (by epoch), as
	// renewal is for a mutex's holder.
	permitRenewals map[int64]observed
	// view is what the authority vouches for to the webhook (views.go). It is
	// written only through publishView, never by store.
	view View
}

// leaseVersion is one version of a lock's Lease.
type leaseVersion struct {
	uid types.UID
	rv  string
}

// laterLease returns the later of two Lease versions of the same Lease (the
// zero version is earlier than any): of two expectations the later one is
// kept, so a term's CatchUp never replaces the version of a grant that
// committed after its read.
func laterLease(a, b leaseVersion) leaseVersion {
	if a.uid == "" || b.uid == "" || a.uid != b.uid {
		if b.uid != "" {
			return b
		}
		return a
	}
	if cmp, err := resourceversion.CompareResourceVersion(a.rv, b.rv); err == nil && cmp > 0 {
		return a
	}
	return b
}

// idle reports whether m holds nothing worth keeping.
func (m *lockMemory) idle() bool {
	return !m.renewalSeen && m.floor == 0 && m.leaseExpect == (leaseVersion{}) && len(m.claimWrites) == 0 && len(m.firstSeen) == 0 &&
		!m.uncertain && !m.foreign && m.waiting == 0 && m.heldSince.IsZero() && m.view.HeldEpoch == 0 &&
		len(m.permitRenewals) == 0 && len(m.view.Permits) == 0
}

// memory is the authority's per-lock memory: one entry per lock that is not
// idle (and one per lock whose Lease exists, for its floor), under one
// mutex.
type memory struct {
	mu    sync.Mutex
	locks map[types.NamespacedName]*lockMemory
}

func newMemory() *memory {
	m := &memory{locks: map[types.NamespacedName]*lockMemory{}}
	gaugeSources.add(m)
	return m
}

// load returns a copy of what is remembered about lock.
func (m *memory) load(lock types.NamespacedName) lockMemory {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.locks[lock]
	if !ok {
		return lockMemory{}
	}
	out := *cur
	out.claimWrites = maps.Clone(cur.claimWrites)
	out.firstSeen = maps.Clone(cur.firstSeen)
	out.permitRenewals = maps.Clone(cur.permitRenewals)
	return out
}

// store writes back what a reconcile that loaded loaded leaves remembered
// about lock. A Lease expectation another caller (a term's CatchUp) set
// meanwhile is kept when it is the later one; the view is the published
// one. Nothing idle is kept.
func (m *memory) store(lock types.NamespacedName, loaded, next lockMemory) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.locks[lock]
	if ok {
		if cur.leaseExpect != loaded.leaseExpect {
			next.leaseExpect = laterLease(next.leaseExpect, cur.leaseExpect)
		}
		next.view = cur.view
	} else {
		next.view = View{}
	}
	if len(next.claimWrites) == 0 {
		next.claimWrites = nil
	}
	if len(next.firstSeen) == 0 {
		next.firstSeen = nil
	}
	if len(next.permitRenewals) == 0 {
		next.permitRenewals = nil
	}
	if next.idle() {
		delete(m.locks, lock)
		return
	}
	m.locks[lock] = &next
}

// expectLease records a Lease version read live outside a reconcile of lock
// (a term's CatchUp): the later expectation stands.
func (m *memory) expectLease(lock types.NamespacedName, v leaseVersion) {
	if v.uid == "" || v.rv == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.locks[lock]
	if !ok {
		cur = &lockMemory{}
		m.locks[lock] = cur
	}
	cur.leaseExpect = laterLease(cur.leaseExpect, v)
}

// publishView sets what the authority vouches for about lock, at once: the
// webhook reads it concurrently, so a view is withdrawn before a write that
// may change the holder is sent, not when the reconcile ends.
func (m *memory) publishView(lock types.NamespacedName, v View) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.locks[lock]
	switch {
	case ok:
		cur.view = v
		if cur.idle() {
			delete(m.locks, lock)
		}
	case v.HeldEpoch != 0 || len(v.Permits) > 0:
		m.locks[lock] = &lockMemory{view: v}
	}
}

// view returns the published view of lock.
func (m *memory) view(lock types.NamespacedName) (View, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.locks[lock]
	if !ok || (cur.view.HeldEpoch == 0 && len(cur.view.Permits) == 0) {
		return View{}, false
	}
	return cur.view, true
}

// Memory counts the locks for which the authority remembers each kind of
// thing (fencekeeper_authority_memory_locks{memory}).
type Memory struct{ Clock, Floors, Views, Expectations, Uncertain int }

// counts returns what m holds now.
func (m *memory) counts() Memory {
	var c Memory
	m.addCounts(&c)
	return c
}

// addCounts adds what m holds now to c.
func (m *memory) addCounts(c *Memory) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.locks {
		c.Clock += b2i(l.renewalSeen)
		c.Floors += b2i(l.floor != 0)
		c.Views += b2i(l.view.HeldEpoch != 0)
		c.Expectations += b2i(len(l.claimWrites) != 0)
		c.Uncertain += b2i(l.uncertain)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// gaugeSources are the memories the waiter and hold gauges are computed
// from: one per authority in the process (one in production; tests run
// several managers in one process, which share the registry).
var gaugeSources = &memorySet{set: map[*memory]struct{}{}}

type memorySet struct {
	mu  sync.Mutex
	set map[*memory]struct{}
}

func (s *memorySet) add(m *memory) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set[m] = struct{}{}
}

func (s *memorySet) each(f func(*memory)) {
	s.mu.Lock()
	all := make([]*memory, 0, len(s.set))
	for m := range s.set {
		all = append(all, m)
	}
	s.mu.Unlock()
	for _, m := range all {
		f(m)
	}
}

// wroteLease expects the cache to show the lock's Lease at v, or later.
func (m *lockMemory) wroteLease(v leaseVersion) {
	if v.uid == "" || v.rv == "" {
		return
	}
	m.leaseExpect = laterLease(m.leaseExpect, v)
}

// leaseBehind reports whether the cached Lease (cached; uid "" for none) is
// older than the one expected, and whether the cache shows another Lease or
// none at all (missing: only a live read can tell whether the expected one
// still exists). An expectation the cache has reached is dropped.
func (m *lockMemory) leaseBehind(cached leaseVersion) (behind, missing bool) {
	want := m.leaseExpect
	switch {
	case want.uid == "":
		return false, false
	case cached.uid != want.uid:
		return true, true
	}
	cmp, err := resourceversion.CompareResourceVersion(cached.rv, want.rv)
	if err != nil || cmp >= 0 {
		m.leaseExpect = leaseVersion{}
		return false, false
	}
	return true, false
}

// wroteClaim expects the cache to show claim uid at rv, or later.
func (m *lockMemory) wroteClaim(uid types.UID, rv string) {
	if uid == "" || rv == "" {
		return
	}
	if m.claimWrites == nil {
		m.claimWrites = map[types.UID]string{}
	}
	m.claimWrites[uid] = rv
}

// claimBehind reports whether the cached copy of claim uid (at cachedRV) is
// older than this process's last write of it; a write the cache has reached
// is forgotten.
func (m *lockMemory) claimBehind(uid types.UID, cachedRV string) bool {
	want, ok := m.claimWrites[uid]
	if !ok {
		return false
	}
	cmp, err := resourceversion.CompareResourceVersion(cachedRV, want)
	if err != nil || cmp >= 0 {
		delete(m.claimWrites, uid)
		return false
	}
	return true
}

// retainClaims keeps only the writes of claims that still exist: a claim
// deleted right after our write is never seen again to clear its entry.
// (The Lease's expectation is not touched: see leaseBehind.)
func (m *lockMemory) retainClaims(live map[types.UID]bool) {
	for uid := range m.claimWrites {
		if !live[uid] {
			delete(m.claimWrites, uid)
		}
	}
	for uid := range m.firstSeen {
		if !live[uid] {
			delete(m.firstSeen, uid)
		}
	}
}

// observeWaiters records when this process first observed each waiting
// claim that bounds its wait (acquireTimeoutSeconds), and returns the
// record.
func (m *lockMemory) observeWaiters(claims []*fkv1.FencedLease, now time.Time) map[types.UID]time.Time {
	for _, c := range claims {
		if c.Spec.AcquireTimeoutSeconds == nil || c.Status.Epoch != 0 || c.Status.Phase == fkv1.PhaseHeld || c.Status.Phase == fkv1.PhaseExpired {
			continue
		}
		if _, ok := m.firstSeen[c.UID]; !ok {
			if m.firstSeen == nil {
				m.firstSeen = map[types.UID]time.Time{}
			}
			m.firstSeen[c.UID] = now
		}
	}
	return m.firstSeen
}

// raiseFloor records epochs seen for the lock and returns its floor.
func (m *lockMemory) raiseFloor(epochs ...int64) int64 {
	for _, e := range epochs {
		m.floor = max(m.floor, e)
	}
	return m.floor
}

// markUncertain records a Lease write of unknown outcome that replaced the
// Lease at replaced ("" for a create); settle ends the doubt.
func (m *lockMemory) markUncertain(replaced string) {
	m.uncertain, m.uncertainReplaced = true, replaced
}

func (m *lockMemory) settle() { m.uncertain, m.uncertainReplaced = false, "" }

// forget drops the memory of an idle lock (no claims, nobody holds it), so
// the authority's memory follows the live locks, not every lock ever used.
// The epoch floor is kept while the Lease exists (it guards against the
// Lease being edited); once the Lease is gone a new ledger starts at the
// storage revision, above every epoch ever issued, and the floor can go too.
func (m *lockMemory) forget(hasLease bool) {
	floor := m.floor
	*m = lockMemory{}
	if hasLease {
		m.floor = floor
	}
}

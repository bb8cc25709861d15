package lock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// termFloor is the epoch floor of this process's term as the authority
// (docs/design.md §2): the storage revision of the leases resource, read
// live once when a term starts. A term starts when the authority starts
// running (the process starts, or gains leadership: the reader is a
// leader-election runnable) and whenever NewTerm is called (the Lease
// informer relisted: an etcd restored from a snapshot breaks every watch).
// No lock is granted before the floor of the current term is read, and
// every grant of the term is at least that floor, so no epoch issued
// before the term (before a restore that set a Lease's counter back, or
// while this process was stopped and a counter was set back by hand) is
// issued again: each was at most the revision at which it was written.
type termFloor struct {
	read func(context.Context) (int64, error)
	// ready carries the locks to reconcile again once a floor is read.
	ready chan event.GenericEvent
	kick  chan struct{}

	mu sync.Mutex
	// term counts the terms started; floor is the floor read for term
	// floorTerm (valid only when floorTerm == term).
	term, floorTerm uint64
	floor           int64
	// waiting are the locks that asked for the current term's floor before
	// it was read.
	waiting map[types.NamespacedName]struct{}
}

func newTermFloor(read func(context.Context) (int64, error)) *termFloor {
	return &termFloor{read: read, ready: make(chan event.GenericEvent, 1024), kick: make(chan struct{}, 1),
		waiting: map[types.NamespacedName]struct{}{}}
}

// get returns the current term's floor and number, or false when its floor
// has not been read yet (lock is queued again when it has).
func (f *termFloor) get(lock types.NamespacedName) (int64, uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.term != 0 && f.floorTerm == f.term {
		return f.floor, f.term, true
	}
	f.waiting[lock] = struct{}{}
	return 0, 0, false
}

// current reports whether term is still the current one: a Lease write
// decided in an earlier term is not sent.
func (f *termFloor) current(term uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return term == f.term
}

// newTerm starts a term: until its floor is read, nothing is granted.
func (f *termFloor) newTerm() {
	f.mu.Lock()
	f.term++
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Start begins a term and reads its floor, and the floor of every term
// started later (a manager runnable: with leader election it runs while
// this process leads, and its start is the start of a term).
func (f *termFloor) Start(ctx context.Context) error {
	f.newTerm()
	retry := time.NewTimer(0)
	<-retry.C
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.kick:
		case <-retry.C:
		}
		f.mu.Lock()
		term := f.term
		done := f.floorTerm == term
		f.mu.Unlock()
		if done {
			continue
		}
		floor, err := f.read(ctx)
		if err != nil {
			log.FromContext(ctx).Error(err, "reading this term's epoch floor; no lock is granted until it is read")
			retry.Reset(time.Second)
			continue
		}
		f.mu.Lock()
		if f.term != term {
			// A term started while this read was in flight: the read may
			// predate it (a restore), so it is not that term's floor.
			f.mu.Unlock()
			continue
		}
		f.floor, f.floorTerm = floor, term
		wake := make([]types.NamespacedName, 0, len(f.waiting))
		for l := range f.waiting {
			wake = append(wake, l)
		}
		clear(f.waiting)
		f.mu.Unlock()
		for _, l := range wake {
			select {
			case f.ready <- event.GenericEvent{Object: lockObject(l)}:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// storageRevision reads the current storage revision of the leases resource:
// the resourceVersion of a live list, which etcd serves from a quorum read.
func (r *Reconciler) storageRevision(ctx context.Context) (int64, error) {
	var list coordinationv1.LeaseList
	if err := r.apiReader.List(ctx, &list, client.Limit(1)); err != nil {
		return 0, fmt.Errorf("reading the storage revision of leases: %w", err)
	}
	rev, err := strconv.ParseInt(list.ResourceVersion, 10, 64)
	if err != nil || rev < 1 {
		return 0, fmt.Errorf("the leases list resourceVersion %q is not a storage revision", list.ResourceVersion)
	}
	return rev, nil
}

// NewTerm starts a new term of this authority: no lock is granted until the
// term's floor is read (the Lease informer relisted, see manager).
func (r *Reconciler) NewTerm() { r.floor.newTerm() }

// lockObject names a lock for the controller's channel source.
func lockObject(l types.NamespacedName) client.Object {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}
}

package lock

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// revisionReader serves the storage revisions new ledgers start their epochs
// at (docs/design.md §2) without holding a worker: the live read waits for
// the apiserver's watch cache to reach etcd's revision (its progress tick,
// about 100 ms), and a reconcile that blocked on it would hold one of the
// few workers for that long per new lock.
//
// A reconcile asks with get; the first time, the lock is registered and the
// reconcile ends, and when a read has finished the lock is queued again. A
// lock is only ever answered by a read that started after it asked: its
// revision then bounds every write committed before the reconcile saw that
// the lock needs a new ledger, exactly as a read made inside that reconcile
// would. One read serves every lock waiting when it starts.
type revisionReader struct {
	read func(context.Context) (int64, error)
	// ready carries the locks to reconcile again.
	ready chan event.GenericEvent
	kick  chan struct{}

	mu sync.Mutex
	// started counts the reads begun; pending maps a waiting lock to the
	// value of started when it asked (it needs a read numbered above that).
	started uint64
	pending map[types.NamespacedName]uint64
	// latest is the revision of the newest read that succeeded, latestGen its
	// number; lastErr and errGen the same for the newest read that failed.
	latest    int64
	latestGen uint64
	lastErr   error
	errGen    uint64
}

func newRevisionReader(read func(context.Context) (int64, error)) *revisionReader {
	return &revisionReader{read: read, ready: make(chan event.GenericEvent, 1024), kick: make(chan struct{}, 1),
		pending: map[types.NamespacedName]uint64{}}
}

// get returns a storage revision read after lock first asked, or ok false
// when that read has not finished yet (the lock is queued again when it
// has). A failed read is returned once as the error.
func (rr *revisionReader) get(lock types.NamespacedName) (rev int64, ok bool, err error) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if asked, waiting := rr.pending[lock]; waiting {
		switch {
		case rr.latestGen > asked:
			delete(rr.pending, lock)
			return rr.latest, true, nil
		case rr.errGen > asked:
			delete(rr.pending, lock)
			return 0, false, rr.lastErr
		}
	} else {
		rr.pending[lock] = rr.started
	}
	select {
	case rr.kick <- struct{}{}:
	default:
	}
	return 0, false, nil
}

// forget drops a lock that no longer waits (it went idle).
func (rr *revisionReader) forget(lock types.NamespacedName) {
	rr.mu.Lock()
	delete(rr.pending, lock)
	rr.mu.Unlock()
}

// Start runs the reads (a manager runnable, on every replica: the authority
// reconciles on every replica).
func (rr *revisionReader) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rr.kick:
		}
		rr.mu.Lock()
		if len(rr.pending) == 0 {
			rr.mu.Unlock()
			continue
		}
		rr.started++
		gen := rr.started
		rr.mu.Unlock()

		rev, err := rr.read(ctx)

		rr.mu.Lock()
		if err == nil {
			rr.latest, rr.latestGen = rev, gen
		} else {
			rr.lastErr, rr.errGen = err, gen
		}
		var wake []types.NamespacedName
		for l, asked := range rr.pending {
			if asked < gen {
				wake = append(wake, l)
			}
		}
		rr.mu.Unlock()
		for _, l := range wake {
			select {
			case rr.ready <- event.GenericEvent{Object: lockObject(l)}:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// lockObject names a lock for the controller's channel source.
func lockObject(l types.NamespacedName) client.Object {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}
}

package lock

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// Relists tells the authority when the manager's Lease informer lists the
// Leases anew, or its watch ends: an etcd restored from a snapshot breaks
// every watch, and the informer's relist brings back Leases whose counters
// the restore set back. Each starts a new term of the authority
// (termFloor): nothing is granted until that term's floor is read, so no
// grant is decided on a cache from before a restore with a floor from
// before it while the informer waits to relist. (A watch also ends when
// its server-side timeout passes, every few minutes: one list of one Lease
// each time.) Pass NewInformer as the cache's cache.Options.NewInformer
// and the same Relists in Options.
type Relists struct {
	mu     sync.Mutex
	notify []func()
}

// NewRelists returns a Relists nobody listens to yet.
func NewRelists() *Relists { return &Relists{} }

func (r *Relists) subscribe(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notify = append(r.notify, f)
}

func (r *Relists) relisted() {
	r.mu.Lock()
	fs := append([]func(){}, r.notify...)
	r.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// NewInformer is toolscache.NewSharedIndexInformer, with the Lease
// informer's lists (and watches that start with the initial list) reported
// to the authority before they are sent.
func (r *Relists) NewInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	if _, ok := obj.(*coordinationv1.Lease); ok {
		inner := toolscache.ToListerWatcherWithContext(lw)
		lw = &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				r.relisted()
				return inner.ListWithContext(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				if o.SendInitialEvents != nil && *o.SendInitialEvents {
					r.relisted()
				}
				w, err := inner.WatchWithContext(ctx, o)
				if err != nil {
					return w, err
				}
				return r.untilEnd(w), nil
			},
		}
	}
	return toolscache.NewSharedIndexInformer(lw, obj, resync, indexers)
}

// untilEnd is w, reporting when it ends (closed by the server, broken, or
// stopped) as the start of a new term.
func (r *Relists) untilEnd(w watch.Interface) watch.Interface {
	e := &endingWatch{inner: w, out: make(chan watch.Event), done: make(chan struct{})}
	go func() {
		defer r.relisted()
		defer close(e.out)
		for ev := range w.ResultChan() {
			select {
			case e.out <- ev:
			case <-e.done:
				return
			}
		}
	}()
	return e
}

type endingWatch struct {
	inner watch.Interface
	out   chan watch.Event
	done  chan struct{}
	once  sync.Once
}

func (e *endingWatch) Stop() {
	e.once.Do(func() { close(e.done) })
	e.inner.Stop()
}

func (e *endingWatch) ResultChan() <-chan watch.Event { return e.out }

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
// Leases anew: an etcd restored from a snapshot breaks every watch, and the
// informer's relist brings back Leases whose counters the restore set back.
// Each relist starts a new term of the authority (termFloor): nothing is
// granted until that term's floor is read. Pass NewInformer as the cache's
// cache.Options.NewInformer and the same Relists in Options.
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
				return inner.WatchWithContext(ctx, o)
			},
		}
	}
	return toolscache.NewSharedIndexInformer(lw, obj, resync, indexers)
}

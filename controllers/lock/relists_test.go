package lock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// Every list of the Lease informer, the first and each relist after a
// broken watch, starts a new term; other informers' lists do not.
func TestRelistsStartATerm(t *testing.T) {
	var lists atomic.Int32
	watches := make(chan *watch.FakeWatcher, 10)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			lists.Add(1)
			return &coordinationv1.LeaseList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				// A watch that starts with the initial list (client-go's
				// watch-list): this fake does not serve it, and the informer
				// falls back to a list.
				lists.Add(1)
				return nil, errors.New("watch-list not served here")
			}
			w := watch.NewFake()
			watches <- w
			return w, nil
		},
	}
	relists := NewRelists()
	r := NewReconciler(nil, nil, nil, Options{Relists: relists})
	before := r.floor.term

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go relists.NewInformer(lw, &coordinationv1.Lease{}, 0, toolscache.Indexers{}).RunWithContext(ctx)
	w := <-watches
	r.floor.mu.Lock()
	if got := r.floor.term - before; got != uint64(lists.Load()) {
		t.Fatalf("the informer's first %d lists started %d terms", lists.Load(), got)
	}
	r.floor.mu.Unlock()
	// The watch breaks as it does when etcd is restored (410 Gone): the
	// informer lists again.
	w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	select {
	case w = <-watches:
	case <-time.After(10 * time.Second):
		t.Fatal("the informer never watched again")
	}
	if lists.Load() < 3 {
		t.Fatal("the informer did not relist: this test shows nothing")
	}
	termsNow := func() uint64 {
		r.floor.mu.Lock()
		defer r.floor.mu.Unlock()
		return r.floor.term - before
	}
	// Each list, and the broken watch's end, started a term.
	if terms := termsNow(); terms < uint64(lists.Load())+1 {
		t.Fatalf("%d lists and a broken watch started %d terms", lists.Load(), terms)
	}

	// A watch that merely ends (its server-side timeout) starts a term too:
	// the informer watches again from where it was, without a list.
	listed, terms := lists.Load(), termsNow()
	w.Stop()
	select {
	case <-watches:
	case <-time.After(10 * time.Second):
		t.Fatal("the informer never watched again")
	}
	if termsNow() <= terms {
		t.Fatal("a watch that ended started no term")
	}
	if lists.Load() != listed {
		t.Log("the informer listed again after a watch ended")
	}
	terms = termsNow()

	// A pod informer's lists are not the Lease informer's.
	podLists := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				return nil, errors.New("watch-list not served here")
			}
			return watch.NewFake(), nil
		},
	}
	inf := relists.NewInformer(podLists, &corev1.Pod{}, 0, toolscache.Indexers{})
	go inf.RunWithContext(ctx)
	toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	if termsNow() != terms {
		t.Fatal("a pod informer started a term")
	}
}

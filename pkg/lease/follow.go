package lease

import (
	"context"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// seen is one thing a follow reports about the object it follows: a
// version of it, that it does not exist (gone: not found by a read, or
// deleted, with its last version when a watch saw the delete), or an error
// it does not retry (the follow ends with it).
type seen[T client.Object] struct {
	obj  T
	gone bool
	err  error
}

// kind is what a follow watches: a new object and a new list of its kind.
type kind[T client.Object] struct {
	newObj  func() T
	newList func() client.ObjectList
}

var (
	claimKind = kind[*fkv1.FencedLease]{
		newObj:  func() *fkv1.FencedLease { return &fkv1.FencedLease{} },
		newList: func() client.ObjectList { return &fkv1.FencedLeaseList{} },
	}
	leaseKind = kind[*coordinationv1.Lease]{
		newObj:  func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		newList: func() client.ObjectList { return &coordinationv1.LeaseList{} },
	}
)

// reading returns a follow's read setting, set to on.
func reading(on bool) *atomic.Bool {
	b := &atomic.Bool{}
	b.Store(on)
	return b
}

const (
	minFollowBackoff = 50 * time.Millisecond
	maxFollowBackoff = time.Second
)

// follow watches the one object key names (a field selector on its name,
// never the namespace's list) and reports it on the returned channel until
// ctx ends, restarting the watch whenever it ends: from the last version
// seen after a normal end, from scratch after an error (a version too old,
// say).
//
// How it starts from scratch: with read set, by reading the object and
// watching from that version, so an object deleted while no watch ran is
// reported gone, and nothing older than the read is reported; without, by
// a watch from no version, which begins with the object's current state
// if it exists and says nothing if it does not (one request, and all a
// waiter needs of a Lease that may not exist yet). read is looked at each
// time the follow starts from scratch: a waiter's follow handed to a
// holder switches it on.
// fromRV, when set, is a version already seen: the first watch starts
// there, without a read.
//
// Transient errors (retriable) are retried, backing off from 50 ms to 1 s;
// any other (Forbidden, say) is reported and ends the follow. The channel
// is closed when the follow ends.
func follow[T client.Object](ctx context.Context, c client.WithWatch, key client.ObjectKey, k kind[T], read *atomic.Bool, fromRV string) <-chan seen[T] {
	out := make(chan seen[T])
	go func() {
		defer close(out)
		send := func(s seen[T]) bool {
			select {
			case out <- s:
				return true
			case <-ctx.Done():
				return false
			}
		}
		backoff := minFollowBackoff
		// pause backs off before a retry; false: ctx ended, or err is not
		// worth retrying (reported).
		pause := func(err error) bool {
			if err != nil && !retriable(err) && ctx.Err() == nil {
				send(seen[T]{err: err})
				return false
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxFollowBackoff)
			return true
		}
		rv := fromRV
		for ctx.Err() == nil {
			if rv == "" && read.Load() {
				obj := k.newObj()
				err := c.Get(ctx, key, obj)
				switch {
				case apierrors.IsNotFound(err):
					if !send(seen[T]{gone: true}) {
						return
					}
				case err != nil:
					if !pause(err) {
						return
					}
					continue
				default:
					if !send(seen[T]{obj: obj}) {
						return
					}
					rv = obj.GetResourceVersion()
				}
			}
			w, err := c.Watch(ctx, k.newList(), client.InNamespace(key.Namespace), client.MatchingFields{"metadata.name": key.Name},
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
			if err != nil {
				rv = ""
				if !pause(err) {
					return
				}
				continue
			}
			var ok, failed bool
			rv, ok, failed = drain(ctx, w, rv, send)
			switch {
			case !ok:
				return
			case failed:
				rv = ""
				if !pause(nil) {
					return
				}
			default:
				backoff = minFollowBackoff
			}
		}
	}()
	return out
}

// drain reports w's events until it ends. It returns the version to resume
// from, false when ctx ended or nobody listens any more, and failed after
// an error event.
func drain[T client.Object](ctx context.Context, w watch.Interface, rv string, send func(seen[T]) bool) (_ string, ok, failed bool) {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return rv, false, false
		case ev, open := <-w.ResultChan():
			if !open {
				return rv, true, false
			}
			obj, isT := ev.Object.(T)
			if !isT {
				return rv, true, true // an error event
			}
			rv = obj.GetResourceVersion()
			switch ev.Type {
			case watch.Bookmark:
				continue
			case watch.Deleted:
				if !send(seen[T]{obj: obj, gone: true}) {
					return rv, false, false
				}
			default:
				if !send(seen[T]{obj: obj}) {
					return rv, false, false
				}
			}
		}
	}
}

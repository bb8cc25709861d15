package chaos

import (
	"context"
	"regexp"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Recorder watches one namespace's guarded objects, Leases and claims and
// keeps every state the apiserver stored, in delivery order. A watch that
// closes is resumed from the last resourceVersion it delivered, so no state
// is missed; a resume that fails (the version was compacted) is reported.
type Recorder struct {
	mu     sync.Mutex
	events []Event
	errs   []error
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

var dataEpoch = regexp.MustCompile(`epoch=(-?\d+)`)

// Record starts watching ns for lock's history.
func Record(ctx context.Context, c client.WithWatch, ns, lock string) *Recorder {
	ctx, cancel := context.WithCancel(ctx)
	r := &Recorder{cancel: cancel}
	r.watch(ctx, c, ns, &corev1.ConfigMapList{}, func(ev watch.Event) (Event, bool) {
		cm, ok := ev.Object.(*corev1.ConfigMap)
		if !ok || cm.Labels[fkv1.LabelLock] != lock {
			return Event{}, false
		}
		e := Event{Kind: KindWrite, Object: cm.Name, Deleted: ev.Type == watch.Deleted,
			Current: cm.Annotations[fkv1.AnnotationFencePolicy] != fkv1.FencePolicyMonotonic}
		e.Epoch, _ = strconv.ParseInt(cm.Annotations[fkv1.AnnotationFencedEpoch], 10, 64)
		if m := dataEpoch.FindStringSubmatch(cm.Data["report.csv"]); m != nil {
			e.DataEpoch, _ = strconv.ParseInt(m[1], 10, 64)
		}
		return e, true
	})
	r.watch(ctx, c, ns, &coordinationv1.LeaseList{}, func(ev watch.Event) (Event, bool) {
		l, ok := ev.Object.(*coordinationv1.Lease)
		if !ok || l.Name != lock || ev.Type == watch.Deleted {
			return Event{}, false
		}
		led := fkv1.ReadLedger(l, lock)
		return Event{Kind: KindLease, Object: l.Name, Epoch: led.Epoch, Held: led.Held(), Holder: string(led.HolderUID)}, true
	})
	r.watch(ctx, c, ns, &fkv1.FencedLeaseList{}, func(ev watch.Event) (Event, bool) {
		cl, ok := ev.Object.(*fkv1.FencedLease)
		if !ok || cl.Spec.LockName != lock || ev.Type == watch.Deleted || cl.Status.Phase != fkv1.PhaseHeld {
			return Event{}, false
		}
		return Event{Kind: KindClaim, Object: cl.Name, Epoch: cl.Status.Epoch, Holder: string(cl.UID)}, true
	})
	return r
}

func (r *Recorder) watch(ctx context.Context, c client.WithWatch, ns string, list client.ObjectList, conv func(watch.Event) (Event, bool)) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		rv := ""
		for ctx.Err() == nil {
			opts := []client.ListOption{client.InNamespace(ns)}
			if rv != "" {
				opts = append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
			}
			w, err := c.Watch(ctx, list, opts...)
			if err != nil {
				if ctx.Err() == nil {
					r.fail(err)
				}
				return
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					if ctx.Err() != nil {
						return // stopped: the watch ends with our own cancellation
					}
					r.fail(apiError(ev))
					w.Stop()
					return
				}
				obj, ok := ev.Object.(client.Object)
				if !ok {
					continue
				}
				rv = obj.GetResourceVersion()
				e, keep := conv(ev)
				if !keep {
					continue
				}
				e.RV, _ = strconv.ParseInt(rv, 10, 64)
				e.At = time.Now()
				r.mu.Lock()
				r.events = append(r.events, e)
				r.mu.Unlock()
			}
		}
	}()
}

func apiError(ev watch.Event) error {
	if st, ok := ev.Object.(*metav1.Status); ok {
		return &statusError{st.Message}
	}
	return &statusError{"watch error"}
}

type statusError struct{ msg string }

func (e *statusError) Error() string { return "recorder: " + e.msg }

func (r *Recorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// Stop ends the watches and returns the history and any recording errors
// (a history with errors is incomplete and must not be called clean).
func (r *Recorder) Stop() ([]Event, []error) {
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...), r.errs
}

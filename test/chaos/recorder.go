package chaos

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Recorder watches etcd itself, under one namespace's keys of ConfigMaps,
// Leases and FencedLeases, and keeps every state the apiserver stored, with
// its etcd revision (= resourceVersion). Watching etcd, not the apiserver,
// the history survives kube-apiserver restarts (whose new watch cache would
// refuse to resume an older resourceVersion) and etcd restarts (the client
// resumes at the revision it reached), and one revision counter orders all
// three kinds.
type Recorder struct {
	mu     sync.Mutex
	events []Event
	errs   []error
	wg     sync.WaitGroup
	cancel context.CancelFunc
	cli    *clientv3.Client
}

var (
	dataEpoch  = regexp.MustCompile(`epoch=(-?\d+)`)
	dataWriter = regexp.MustCompile(`writer=(\S+)`)
)

// Record starts watching lock's history in ns, from the current revision,
// on the etcd at endpoint.
func Record(ctx context.Context, endpoint string, scheme *runtime.Scheme, ns, lock string) (*Recorder, error) {
	return record(ctx, endpoint, scheme, ns, func(obj runtime.Object, deleted bool) []Event {
		if e, keep := convert(obj, lock, deleted); keep {
			return []Event{e}
		}
		return nil
	})
}

// RecordSemaphore starts watching a semaphore lock's history in ns
// (convertSemaphore: every Lease version with its permits, every claim
// version), as Record.
func RecordSemaphore(ctx context.Context, endpoint string, scheme *runtime.Scheme, ns, lock string) (*Recorder, error) {
	return record(ctx, endpoint, scheme, ns, func(obj runtime.Object, deleted bool) []Event {
		return convertSemaphore(obj, lock, deleted)
	})
}

func record(ctx context.Context, endpoint string, scheme *runtime.Scheme, ns string, conv func(runtime.Object, bool) []Event) (*Recorder, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	head, err := cli.Get(gctx, "/registry/health-probe-none", clientv3.WithCountOnly())
	gcancel()
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	from := head.Header.Revision + 1
	ctx, cancel := context.WithCancel(ctx)
	r := &Recorder{cancel: cancel, cli: cli}
	dec := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	for _, prefix := range []string{
		"/registry/configmaps/" + ns + "/", "/registry/leases/" + ns + "/", "/registry/fencekeeper.io/fencedleases/" + ns + "/",
	} {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			wch := cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())
			for resp := range wch {
				if err := resp.Err(); err != nil {
					if ctx.Err() == nil {
						r.fail(fmt.Errorf("watching %s: %w", prefix, err))
					}
					return
				}
				for _, ev := range resp.Events {
					deleted := ev.Type == clientv3.EventTypeDelete
					value := ev.Kv.Value
					if deleted {
						if ev.PrevKv == nil {
							continue
						}
						value = ev.PrevKv.Value
					}
					obj, _, err := dec.Decode(value, nil, nil)
					if err != nil {
						r.fail(fmt.Errorf("decoding %s: %w", ev.Kv.Key, err))
						continue
					}
					at := time.Now()
					for _, e := range conv(obj, deleted) {
						e.RV, e.At = ev.Kv.ModRevision, at
						r.mu.Lock()
						r.events = append(r.events, e)
						r.mu.Unlock()
					}
				}
			}
		}()
	}
	return r, nil
}

// convert turns one stored state into an Event of the lock's history.
func convert(obj runtime.Object, lock string, deleted bool) (Event, bool) {
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		if o.Labels[fkv1.LabelLock] != lock {
			return Event{}, false
		}
		e := Event{Kind: KindWrite, Object: o.Name, Deleted: deleted,
			Current: o.Annotations[fkv1.AnnotationFencePolicy] != fkv1.FencePolicyMonotonic}
		e.Epoch, _ = strconv.ParseInt(o.Annotations[fkv1.AnnotationFencedEpoch], 10, 64)
		if m := dataEpoch.FindStringSubmatch(o.Data["report.csv"]); m != nil {
			e.DataEpoch, _ = strconv.ParseInt(m[1], 10, 64)
		}
		if m := dataWriter.FindStringSubmatch(o.Data["report.csv"]); m != nil {
			e.Who = m[1]
		}
		return e, true
	case *coordinationv1.Lease:
		if o.Name != lock || deleted {
			return Event{}, false
		}
		led := fkv1.ReadLedger(o, lock)
		return Event{Kind: KindLease, Object: o.Name, Epoch: led.Epoch, Held: led.Held(), Holder: string(led.HolderUID)}, true
	case *fkv1.FencedLease:
		if o.Spec.LockName != lock || deleted {
			return Event{}, false
		}
		_, _, breakRequested := fkv1.BreakRequest(o)
		switch held := meta.FindStatusCondition(o.Status.Conditions, fkv1.ConditionHeld); {
		case o.Status.Phase == fkv1.PhaseHeld && o.Status.Epoch != 0 && breakRequested:
			// An operator's break (its breaker recorded by admission) ends
			// the hold as soon as the authority sees it, before the claim's
			// status says so, which it may never do (the claim deleted
			// first): the break is recorded from the request.
			return Event{Kind: KindBroken, Object: o.Name, Epoch: o.Status.Epoch, Holder: string(o.UID), Who: o.Spec.HolderIdentity}, true
		case o.Status.Phase == fkv1.PhaseHeld:
			return Event{Kind: KindClaim, Object: o.Name, Epoch: o.Status.Epoch, Holder: string(o.UID), Who: o.Spec.HolderIdentity}, true
		case o.Status.Phase == fkv1.PhaseExpired && held != nil && held.Reason == fkv1.ReasonForcedRelease && o.Status.Epoch != 0:
			return Event{Kind: KindBroken, Object: o.Name, Epoch: o.Status.Epoch, Holder: string(o.UID), Who: o.Spec.HolderIdentity}, true
		}
		return Event{}, false
	}
	return Event{}, false
}

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
	_ = r.cli.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...), r.errs
}

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// Objects the workers write: three under policy current (so a stale write
// often finds one the new holder has not written yet, where only rule 4 can
// refuse it), one monotonic.
var (
	ObjectsCurrent  = []string{"report-2026-07", "report-2026-08", "report-2026-09"}
	ObjectMonotonic = "ledger"
)

// Methods are the ways a worker's write reaches the apiserver.
var Methods = []string{"update", "json-patch", "merge-patch", "merge-from-stale", "server-side-apply"}

// Counters are a run's figures (safe for concurrent use).
type Counters struct {
	Grants, Accepted, RefusedStale, RefusedOther, Conflicts, ReplyLost atomic.Int64
	Pauses, OutOfOrder, Forged, ProcessPauses, ProcessRuns             atomic.Int64
	// Breaks are holds that ended by a forced unlock (from the history);
	// BreaksAsked the break requests the plugin accepted.
	Breaks, BreaksAsked atomic.Int64
	ByMethod            [5]atomic.Int64
	// MonotonicTried counts a semaphore worker's writes that asked for
	// policy monotonic (every one must be refused).
	MonotonicTried atomic.Int64
}

// Worker is one holder: it acquires the lock with the library, writes the
// fenced objects with its epoch by every method, and is paused (its requests
// held, its renewals stopped) for up to 3×TTL, after which it goes on
// writing with the epoch it had, as a process that slept through its lease
// would. Some writes it queues and delivers later, out of order.
type Worker struct {
	Name   string
	NS     string
	Lock   string
	TTL    time.Duration
	Client client.Client
	Lease  *lease.Client
	Faults *Faults
	Rng    *rand.Rand
	Count  *Counters
	// Believe records what the holder's library says before each write.
	Believe func(Belief)
	// MaxHolders above 1 makes the worker a holder of one permit of a
	// semaphore lock (lease.Options.MaxHolders). It then writes Objects
	// (policy current, the only one a semaphore's objects may have), its
	// forged epochs too, and now and then asks for policy monotonic, which
	// must be refused.
	MaxHolders int32
	Objects    []string

	stale  map[string]*corev1.ConfigMap // an old copy per object, for merge-from-stale
	queued []func(context.Context)
	seq    int
}

// Run works until ctx ends.
func (w *Worker) Run(ctx context.Context) {
	w.stale = map[string]*corev1.ConfigMap{}
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 3*w.TTL)
		l, err := w.Lease.Acquire(actx, w.Lock, w.Name, lease.Options{TTL: w.TTL, RequestTimeout: w.TTL / 3, MaxHolders: w.MaxHolders})
		cancel()
		if err != nil {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		w.Count.Grants.Add(1)
		n := 2 + w.Rng.IntN(6)
		for k := 0; k < n && ctx.Err() == nil; k++ {
			switch r := w.Rng.Float64(); {
			case r < 0.15:
				w.pause(ctx, time.Duration(w.Rng.Int64N(int64(3*w.TTL))))
			case r < 0.30:
				epoch, obj, method := l.Epoch, w.object(), w.Rng.IntN(len(Methods))
				w.queued = append(w.queued, func(ctx context.Context) { w.write(ctx, epoch, obj, method) })
				continue
			}
			if t := time.Now(); (l.State() == lease.Held || l.State() == lease.Suspect) && l.Remaining() > 0 {
				w.Believe(Belief{Epoch: l.Epoch, Who: w.Name, At: t})
			}
			epoch, obj := l.Epoch, w.object()
			if w.Rng.Float64() < 0.1 {
				// A buggy client guessing the next token: refused unless it
				// was issued, and then only to its holder's identity. Half
				// go to the monotonic object, where only rule 3 refuses them.
				// (On a semaphore the next epoch is often another holder's
				// live permit: only rule 9 refuses it.)
				epoch++
				w.Count.Forged.Add(1)
				if w.Objects == nil && w.Rng.IntN(2) == 0 {
					obj = ObjectMonotonic
				}
			}
			w.write(ctx, epoch, obj, w.Rng.IntN(len(Methods)))
			if len(w.queued) > 1 && w.Rng.Float64() < 0.3 {
				w.deliverQueued(ctx)
			}
			sleep(ctx, time.Duration(w.Rng.IntN(80))*time.Millisecond)
		}
		if w.Rng.Float64() < 0.5 {
			w.deliverQueued(ctx)
		}
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = l.Release(rctx)
		cancel()
	}
	w.deliverQueued(context.Background())
}

func (w *Worker) object() string {
	if w.Objects != nil {
		return w.Objects[w.Rng.IntN(len(w.Objects))]
	}
	if i := w.Rng.IntN(len(ObjectsCurrent) + 1); i < len(ObjectsCurrent) {
		return ObjectsCurrent[i]
	}
	return ObjectMonotonic
}

// pause plays a stopped process: nothing it sends gets out, and it does
// nothing, for d.
func (w *Worker) pause(ctx context.Context, d time.Duration) {
	w.Count.Pauses.Add(1)
	w.Faults.Pause()
	sleep(ctx, d)
	w.Faults.Resume()
}

// deliverQueued sends the queued writes newest first (seed §22 item 8).
func (w *Worker) deliverQueued(ctx context.Context) {
	if len(w.queued) > 1 {
		w.Count.OutOfOrder.Add(1)
	}
	for i := len(w.queued) - 1; i >= 0; i-- {
		w.queued[i](ctx)
	}
	w.queued = nil
}

func (w *Worker) data(epoch int64) map[string]string {
	w.seq++
	return map[string]string{"report.csv": fmt.Sprintf("epoch=%d writer=%s seq=%d", epoch, w.Name, w.seq)}
}

// write sends one write of obj with epoch by Methods[method] and counts
// its outcome.
func (w *Worker) write(ctx context.Context, epoch int64, obj string, method int) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	key := client.ObjectKey{Namespace: w.NS, Name: obj}
	// A semaphore's holder now and then asks for policy monotonic (on a
	// create, an update or a merge patch): refused (InvalidFencePolicy).
	monotonic := w.Objects != nil && w.Rng.IntN(20) == 0
	var cur corev1.ConfigMap
	err := w.Client.Get(ctx, key, &cur)
	switch {
	case apierrors.IsNotFound(err):
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.NS, Name: obj}, Data: w.data(epoch)}
		if obj == ObjectMonotonic || monotonic {
			cm.Annotations = map[string]string{fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic}
			w.countMonotonic(monotonic)
		}
		lease.Stamp(cm, w.Lock, epoch)
		w.outcome(w.Client.Create(ctx, cm))
		return
	case err != nil:
		w.outcome(err)
		return
	}
	if w.stale[obj] == nil || w.Rng.IntN(4) == 0 {
		w.stale[obj] = cur.DeepCopy()
	}
	w.Count.ByMethod[method].Add(1)
	ep := fkv1.FormatEpoch(epoch)
	switch Methods[method] {
	case "update":
		cur.Data = w.data(epoch)
		lease.Stamp(&cur, w.Lock, epoch)
		if monotonic {
			cur.Annotations[fkv1.AnnotationFencePolicy] = fkv1.FencePolicyMonotonic
			w.countMonotonic(true)
		}
		err = w.Client.Update(ctx, &cur)
	case "json-patch":
		b, _ := json.Marshal([]map[string]any{
			{"op": "replace", "path": "/data", "value": w.data(epoch)},
			{"op": "add", "path": "/metadata/annotations/fencekeeper.io~1epoch", "value": ep},
		})
		err = w.Client.Patch(ctx, &cur, client.RawPatch("application/json-patch+json", b))
	case "merge-patch":
		ann := map[string]string{fkv1.AnnotationEpoch: ep}
		if monotonic {
			ann[fkv1.AnnotationFencePolicy] = fkv1.FencePolicyMonotonic
			w.countMonotonic(true)
		}
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}, "data": w.data(epoch)})
		err = w.Client.Patch(ctx, &cur, client.RawPatch("application/merge-patch+json", b))
	case "merge-from-stale":
		base := w.stale[obj].DeepCopy()
		mod := base.DeepCopy()
		mod.Data = w.data(epoch)
		err = (&lease.Lease{Lock: w.Lock, Epoch: epoch}).Patch(ctx, w.Client, mod, client.MergeFrom(base))
	case "server-side-apply":
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": obj, "namespace": w.NS,
				"labels": map[string]any{fkv1.LabelLock: w.Lock}, "annotations": map[string]any{fkv1.AnnotationEpoch: ep}},
			"data": map[string]any{"report.csv": w.data(epoch)["report.csv"]},
		}}
		err = w.Client.Patch(ctx, u, client.Apply, client.FieldOwner(w.Name), client.ForceOwnership) //nolint:staticcheck // the apply patch type is what kubectl apply --server-side sends
	}
	w.outcome(err)
}

func (w *Worker) countMonotonic(tried bool) {
	if tried {
		w.Count.MonotonicTried.Add(1)
	}
}

func (w *Worker) outcome(err error) {
	switch {
	case err == nil:
		w.Count.Accepted.Add(1)
	case lease.IsStaleEpoch(err):
		w.Count.RefusedStale.Add(1)
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		w.Count.Conflicts.Add(1)
	case errors.Is(err, ErrReplyLost):
		w.Count.ReplyLost.Add(1)
	default:
		w.Count.RefusedOther.Add(1)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// The `current` staleness window: after the lock passes from an old holder to
// the next, how long does the fencing check keep accepting the old holder's
// epoch? Per round: the old holder releases (its claim is deleted) while a
// waiter queues; the old holder then writes a fenced object with its epoch
// as fast as it can until a write is refused. Reported: release -> first
// refusal, and first refusal minus the moment the namespace watch saw the
// new holder Held (an upper bound on the grant's commit). A negative window
// means the check refused before the grant was even visible to a watcher.
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

func measureStaleness(ctx context.Context, c client.WithWatch, n int) (afterRelease, window latency, err error) {
	ns, h, err := watchedNS(ctx, c, "staleness")
	if err != nil {
		return latency{}, latency{}, err
	}
	defer h.stop()
	var rel, win []time.Duration
	for i := 0; i < n; i++ {
		lock := "s" + strconv.Itoa(i)
		oldName, newName := lock+"-old", lock+"-new"
		chOld := h.expect(oldName)
		if err := c.Create(ctx, claim(ns, oldName, lock, 3600)); err != nil {
			return latency{}, latency{}, err
		}
		if _, err := wait(chOld, 30*time.Second); err != nil {
			return latency{}, latency{}, err
		}
		var old fkv1.FencedLease
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: oldName}, &old); err != nil {
			return latency{}, latency{}, err
		}
		epoch := strconv.FormatInt(old.Status.Epoch, 10)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock,
			Labels: map[string]string{fkv1.LabelLock: lock}, Annotations: map[string]string{fkv1.AnnotationEpoch: epoch}}}
		if err := c.Create(ctx, cm); err != nil {
			return latency{}, latency{}, err
		}
		chNew := h.expect(newName)
		if err := c.Create(ctx, claim(ns, newName, lock, 3600)); err != nil {
			return latency{}, latency{}, err
		}
		start := time.Now()
		if err := c.Delete(ctx, &old, client.Preconditions{UID: &old.UID}); err != nil {
			return latency{}, latency{}, err
		}
		var refused time.Time
		for k := 0; ; k++ {
			p := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}},"data":{"n":"%d"}}`, fkv1.AnnotationEpoch, epoch, k)
			err := c.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock}},
				client.RawPatch(types.MergePatchType, []byte(p)))
			if err != nil {
				if !lease.IsStaleEpoch(err) {
					return latency{}, latency{}, fmt.Errorf("round %d: the old holder's write failed for another reason: %w", i, err)
				}
				refused = time.Now()
				break
			}
			if time.Since(start) > 30*time.Second {
				return latency{}, latency{}, fmt.Errorf("round %d: the old epoch was still accepted 30s after the release", i)
			}
		}
		held, err := wait(chNew, 30*time.Second)
		if err != nil {
			return latency{}, latency{}, err
		}
		rel = append(rel, refused.Sub(start))
		win = append(win, refused.Sub(held))
	}
	return summarize(rel), summarize(win), nil
}

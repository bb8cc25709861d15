// Admission cost: the same ConfigMap update with and without the fencing
// label (so with and without the webhook hop), interleaved, n each. The
// handler's own share comes from the manager's histogram
// (cluster.handlerMeanMS).
package main

import (
	"context"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// guardedVsUnguarded: the same ConfigMap update with and without the fencing
// label, interleaved.
func guardedVsUnguarded(ctx context.Context, c client.WithWatch, n int) (latency, latency, error) {
	ns, h, err := watchedNS(ctx, c, "admission")
	if err != nil {
		return latency{}, latency{}, err
	}
	defer h.stop()
	ch := h.expect("writer")
	if err := c.Create(ctx, claim(ns, "writer", "report", 3600)); err != nil {
		return latency{}, latency{}, err
	}
	if _, err := wait(ch, 30*time.Second); err != nil {
		return latency{}, latency{}, err
	}
	var writer fkv1.FencedLease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "writer"}, &writer); err != nil {
		return latency{}, latency{}, err
	}
	epoch := strconv.FormatInt(writer.Status.Epoch, 10)
	guarded := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded",
		Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: map[string]string{fkv1.AnnotationEpoch: epoch}}}
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain",
		Annotations: map[string]string{fkv1.AnnotationEpoch: epoch}}}
	for _, cm := range []*corev1.ConfigMap{guarded, plain} {
		if err := c.Create(ctx, cm); err != nil {
			return latency{}, latency{}, err
		}
	}
	var dg, du []time.Duration
	for i := 0; i < n; i++ {
		for _, cm := range []*corev1.ConfigMap{guarded, plain} {
			cm.Data = map[string]string{"v": strconv.Itoa(i)}
			// Every content write presents its epoch (admission consumes it).
			cm.Annotations[fkv1.AnnotationEpoch] = epoch
			start := time.Now()
			if err := c.Update(ctx, cm); err != nil {
				return latency{}, latency{}, err
			}
			if cm == guarded {
				dg = append(dg, time.Since(start))
			} else {
				du = append(du, time.Since(start))
			}
		}
	}
	return summarize(dg), summarize(du), nil
}

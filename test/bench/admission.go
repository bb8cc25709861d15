// Admission cost: the same ConfigMap update with and without the fencing
// label (so with and without the webhook hop), interleaved, n each. The
// handler's own share comes from the manager's histogram, the whole call as
// the apiserver times it from its own (cluster.admissionMeansMS).
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
	a, err := setupAdmission(ctx, c, nil)
	if err != nil {
		return latency{}, latency{}, err
	}
	defer a.stop()
	return a.measure(ctx, c, n)
}

// admissionBed is a holder's epoch and two ConfigMaps it writes, one fenced.
type admissionBed struct {
	epoch          string
	guarded, plain *corev1.ConfigMap
	stop           func()
}

// setupAdmission acquires lock "report" in a new namespace and creates the
// two ConfigMaps; beforeCreate (if set) runs first (CEL mode waits there
// until the apiserver enforces the lock's bindings).
func setupAdmission(ctx context.Context, c client.WithWatch, beforeCreate func(ns, epoch string) error) (*admissionBed, error) {
	ns, h, err := watchedNS(ctx, c, "admission")
	if err != nil {
		return nil, err
	}
	ch := h.expect("writer")
	if err := c.Create(ctx, claim(ns, "writer", "report", 3600)); err != nil {
		h.stop()
		return nil, err
	}
	if _, err := wait(ch, 30*time.Second); err != nil {
		h.stop()
		return nil, err
	}
	var writer fkv1.FencedLease
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "writer"}, &writer); err != nil {
		h.stop()
		return nil, err
	}
	a := &admissionBed{epoch: strconv.FormatInt(writer.Status.Epoch, 10), stop: h.stop}
	if beforeCreate != nil {
		if err := beforeCreate(ns, a.epoch); err != nil {
			h.stop()
			return nil, err
		}
	}
	a.guarded = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded",
		Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: map[string]string{fkv1.AnnotationEpoch: a.epoch}}}
	a.plain = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain",
		Annotations: map[string]string{fkv1.AnnotationEpoch: a.epoch}}}
	for _, cm := range []*corev1.ConfigMap{a.guarded, a.plain} {
		if err := c.Create(ctx, cm); err != nil {
			h.stop()
			return nil, err
		}
	}
	return a, nil
}

// measure times n updates of each ConfigMap, interleaved.
func (a *admissionBed) measure(ctx context.Context, c client.Client, n int) (latency, latency, error) {
	var dg, du []time.Duration
	for i := 0; i < n; i++ {
		for _, cm := range []*corev1.ConfigMap{a.guarded, a.plain} {
			cm.Data = map[string]string{"v": strconv.Itoa(i)}
			// Every content write presents its epoch (admission consumes it).
			cm.Annotations[fkv1.AnnotationEpoch] = a.epoch
			start := time.Now()
			if err := c.Update(ctx, cm); err != nil {
				return latency{}, latency{}, err
			}
			if cm == a.guarded {
				dg = append(dg, time.Since(start))
			} else {
				du = append(du, time.Since(start))
			}
		}
	}
	return summarize(dg), summarize(du), nil
}

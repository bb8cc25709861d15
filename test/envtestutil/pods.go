package envtestutil

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// LeasePod creates a pod asking for lock (its lease-duration annotation set
// to ttl when not empty) and plays the kubelet: Running, with its containers
// ready or not. No kubelet runs under envtest.
func LeasePod(ctx context.Context, c client.Client, ns, name, lock, ttl string, ready bool, tweak ...func(*corev1.Pod)) (*corev1.Pod, error) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "app", Image: "example.com/report-worker:1"}},
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: fkv1.PodConditionLeaseHeld}},
		},
	}
	if lock != "" {
		p.Annotations[fkv1.AnnotationLease] = lock
	}
	if ttl != "" {
		p.Annotations[fkv1.AnnotationLeaseDuration] = ttl
	}
	for _, t := range tweak {
		t(p)
	}
	if err := c.Create(ctx, p); err != nil {
		return nil, err
	}
	return p, SetPodReady(ctx, c, p, ready)
}

// SetPodReady sets the pod's phase to Running and its ContainersReady
// condition to ready, the way the kubelet would.
func SetPodReady(ctx context.Context, c client.Client, p *corev1.Pod, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur corev1.Pod
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), &cur); err != nil {
			return err
		}
		cur.Status.Phase = corev1.PodRunning
		set := false
		for i := range cur.Status.Conditions {
			if c := &cur.Status.Conditions[i]; c.Type == corev1.ContainersReady {
				if c.Status != status {
					// The kubelet records each transition's time.
					c.LastTransitionTime = metav1.Now()
				}
				c.Status, set = status, true
			}
		}
		if !set {
			cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.ContainersReady, Status: status, LastTransitionTime: metav1.Now()})
		}
		return c.Status().Update(ctx, &cur)
	})
}

// PodLease reads what the pod bridge published on a pod: its lease-state
// and epoch annotations and its LeaseHeld condition (nil when absent or
// when the pod cannot be read).
func PodLease(ctx context.Context, c client.Client, ns, name string) (state, epoch string, cond *corev1.PodCondition) {
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		return "", "", nil
	}
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == fkv1.PodConditionLeaseHeld {
			cond = &p.Status.Conditions[i]
		}
	}
	return p.Annotations[fkv1.AnnotationLeaseState], p.Annotations[fkv1.AnnotationEpoch], cond
}

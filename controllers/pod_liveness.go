package controllers

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// podOwnerRef returns the controller reference to the pod a claim was made
// for (nil if none).
func podOwnerRef(c *fkv1.FencedLease) *metav1.OwnerReference {
	for i, o := range c.OwnerReferences {
		if o.Kind == "Pod" && o.APIVersion == "v1" && o.Controller != nil && *o.Controller {
			return &c.OwnerReferences[i]
		}
	}
	return nil
}

// podOwner returns the name of the pod a claim was made for ("" if none).
func podOwner(c *fkv1.FencedLease) string {
	if ref := podOwnerRef(c); ref != nil {
		return ref.Name
	}
	return ""
}

// podLiveness is what the lock controller needs to know about a pod that
// holds a lease: the pod's own state stands in for renewals.
type podLiveness int

const (
	podLive    podLiveness = iota // Running with all containers ready
	podNotLive                    // exists, but not (yet or any more) ready: the TTL runs
	podGone                       // deleted, being deleted or terminal: release at once
)

func livenessOf(pod *corev1.Pod, ownerUID string) podLiveness {
	if pod == nil || string(pod.UID) != ownerUID || pod.DeletionTimestamp != nil ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return podGone
	}
	if pod.Status.Phase != corev1.PodRunning {
		return podNotLive
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.ContainersReady {
			if c.Status == corev1.ConditionTrue {
				return podLive
			}
			return podNotLive
		}
	}
	return podNotLive
}

// stripPod keeps only what the pod controllers decide on, so the pod cache
// costs a few hundred bytes per pod instead of the whole object.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			DeletionTimestamp: pod.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	for k, v := range pod.Annotations {
		if len(k) > len(fkv1.Prefix) && k[:len(fkv1.Prefix)] == fkv1.Prefix {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	for _, c := range pod.Status.Conditions {
		switch c.Type {
		case corev1.ContainersReady, fkv1.PodConditionLeaseHeld:
			out.Status.Conditions = append(out.Status.Conditions, c)
		}
	}
	return out, nil
}

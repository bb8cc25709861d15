package podlease

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// podLeaseView is what a pod shows about its lease.
type podLeaseView struct {
	state   string // "" leaves the annotation alone
	epoch   string // "" leaves the annotation alone
	cond    corev1.ConditionStatus
	reason  string
	message string
}

// podView derives the pod's lease annotations and condition from its claim.
// After a loss the epoch annotation keeps the last epoch held: writes stamped
// with it are refused by the fence, and lease-state says Lost.
func podView(pod *corev1.Pod, claim *fkv1.FencedLease, asked bool) podLeaseView {
	hadHeld := pod.Annotations[fkv1.AnnotationLeaseState] == fkv1.LeaseStateHeld
	switch {
	case claim != nil && claim.Status.Phase == fkv1.PhaseHeld:
		msg := fmt.Sprintf("Holds lock %s with epoch %d", claim.Spec.LockName, claim.Status.Epoch)
		if n := claim.MaxHolders(); n > 1 {
			msg = fmt.Sprintf("Holds a permit of lock %s (up to %d holders) with epoch %d", claim.Spec.LockName, n, claim.Status.Epoch)
		}
		return podLeaseView{state: fkv1.LeaseStateHeld, epoch: strconv.FormatInt(claim.Status.Epoch, 10),
			cond: corev1.ConditionTrue, reason: fkv1.ReasonGranted, message: msg}
	case claim != nil && claim.Status.Phase == fkv1.PhaseExpired:
		return podLeaseView{state: fkv1.LeaseStateLost, cond: corev1.ConditionFalse, reason: fkv1.ReasonExpired,
			message: fmt.Sprintf("Lost lock %s (epoch %d): the pod was not ready for its lease duration", claim.Spec.LockName, claim.Status.Epoch)}
	case claim != nil && hadHeld:
		return podLeaseView{state: fkv1.LeaseStateLost, cond: corev1.ConditionFalse, reason: fkv1.ReasonQueued,
			message: fmt.Sprintf("No longer holds a lock: the pod's claim on lock %s is not the one it held; waiting in its queue", claim.Spec.LockName)}
	case claim != nil && capacityMismatch(claim) != "":
		return podLeaseView{state: fkv1.LeaseStatePending, cond: corev1.ConditionFalse, reason: fkv1.ReasonCapacityMismatch,
			message: fmt.Sprintf("Waiting for lock %s, which records another capacity than the pod's %s=%d: %s",
				claim.Spec.LockName, fkv1.AnnotationLeaseMaxHolders, claim.MaxHolders(), capacityMismatch(claim))}
	case claim != nil:
		return podLeaseView{state: fkv1.LeaseStatePending, cond: corev1.ConditionFalse, reason: fkv1.ReasonQueued,
			message: fmt.Sprintf("Waiting in the queue of lock %s", claim.Spec.LockName)}
	case hadHeld:
		return podLeaseView{state: fkv1.LeaseStateLost, cond: corev1.ConditionFalse, reason: fkv1.ReasonReleased,
			message: "Released: the pod stopped asking for the lock, or is terminating"}
	case asked:
		return podLeaseView{cond: corev1.ConditionFalse, reason: fkv1.ReasonPodNotLive,
			message: "The pod is terminating or finished; it does not contend"}
	}
	return podLeaseView{}
}

// capacityMismatch is the authority's message on a claim waiting because
// the lock records another capacity (reason CapacityMismatch), or "".
func capacityMismatch(claim *fkv1.FencedLease) string {
	h := meta.FindStatusCondition(claim.Status.Conditions, fkv1.ConditionHeld)
	if h == nil || h.Reason != fkv1.ReasonCapacityMismatch {
		return ""
	}
	if h.Message == "" {
		return fkv1.ReasonCapacityMismatch
	}
	return h.Message
}

// syncPod writes the view onto the pod: a metadata patch for the
// annotations and a strategic-merge status patch for the one condition, each
// only when something changed.
func (r *Reconciler) syncPod(ctx context.Context, pod *corev1.Pod, claim *fkv1.FencedLease, asked bool) error {
	v := podView(pod, claim, asked)
	if v.reason == "" {
		return nil
	}
	patch := map[string]string{}
	if v.state != "" && pod.Annotations[fkv1.AnnotationLeaseState] != v.state {
		patch[fkv1.AnnotationLeaseState] = v.state
	}
	if v.epoch != "" && pod.Annotations[fkv1.AnnotationEpoch] != v.epoch {
		patch[fkv1.AnnotationEpoch] = v.epoch
	}
	if len(patch) > 0 {
		if err := r.patchAnnotations(ctx, pod, patch); err != nil {
			return err
		}
		if v.state == fkv1.LeaseStateHeld || v.state == fkv1.LeaseStateLost {
			var related runtime.Object // a typed nil would not be nil here
			if claim != nil {
				related = claim
			}
			r.recorder.Eventf(pod, related, corev1.EventTypeNormal, "Lease"+v.state, "Lease", "%s", v.message)
		}
	}
	_, err := r.patchCondition(ctx, pod, v.cond, v.reason, v.message)
	return err
}

// patchAnnotations merges the lease annotations in patch into the pod, as
// it was when decided on (its resourceVersion, updated by the reply).
func (r *Reconciler) patchAnnotations(ctx context.Context, pod *corev1.Pod, patch map[string]string) error {
	if err := r.certain(); err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": pod.ResourceVersion, "annotations": patch}})
	if err := r.client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("annotating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// patchCondition sets the fencekeeper.io/lease-held condition; a strategic
// merge patch keyed by type touches no other condition.
func (r *Reconciler) patchCondition(ctx context.Context, pod *corev1.Pod, status corev1.ConditionStatus, reason, msg string) (bool, error) {
	for _, c := range pod.Status.Conditions {
		if c.Type == fkv1.PodConditionLeaseHeld && c.Status == status && c.Reason == reason && c.Message == msg {
			return false, nil
		}
	}
	cond := corev1.PodCondition{Type: fkv1.PodConditionLeaseHeld, Status: status, Reason: reason, Message: msg,
		LastTransitionTime: metav1.Now()}
	for _, c := range pod.Status.Conditions {
		if c.Type == fkv1.PodConditionLeaseHeld && c.Status == status {
			cond.LastTransitionTime = c.LastTransitionTime
		}
	}
	// Conditions merge by type under a strategic merge patch: no other
	// condition is touched (the cached pod is stripped and could not say).
	// The resourceVersion makes it a write to the pod as decided on.
	if err := r.certain(); err != nil {
		return false, err
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": pod.ResourceVersion},
		"status": map[string]any{"conditions": []corev1.PodCondition{cond}}})
	if err := r.client.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, body)); err != nil {
		return false, fmt.Errorf("setting condition %s on pod %s/%s: %w", fkv1.PodConditionLeaseHeld, pod.Namespace, pod.Name, err)
	}
	return true, nil
}

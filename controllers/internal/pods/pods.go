// Package pods holds what the lock authority and the pod bridge both know
// about pods that hold leases: which pod a claim was made for, how live that
// pod is, and the stripped form the pod cache keeps.
package pods

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// OwnerRef returns the claim's controller reference to a pod (nil if it has
// none). Anyone may write one: it says whom the claim names as its owner,
// not that the pod bridge made it for that pod (BridgeRef says that). It
// points into the claim's own slice, which the lock controller shares with
// the informer cache: read it only.
func OwnerRef(c *fkv1.FencedLease) *metav1.OwnerReference {
	for i, o := range c.OwnerReferences {
		if o.Kind == "Pod" && o.APIVersion == "v1" && o.Controller != nil && *o.Controller {
			return &c.OwnerReferences[i]
		}
	}
	return nil
}

// OwnerName returns the name of the pod the claim's controller reference
// names ("" if none).
func OwnerName(c *fkv1.FencedLease) string {
	if ref := OwnerRef(c); ref != nil {
		return ref.Name
	}
	return ""
}

// BridgeRef returns the controller reference to the pod the pod bridge made
// claim c for, or nil when the bridge did not make c. Only such a claim is
// pod-held: alive while its pod is ready, with no renewals. Any other claim
// renews or expires like every claim, whatever its ownerReferences say.
//
// An ownerReference proves nothing: whoever may create a claim may point
// one at any pod, and a long-lived ready pod would then keep alive a claim
// that nobody renews. What a user cannot forge is who created the claim.
// The claim-identity admission policy (config/policy/claim-identity.yaml)
// records it on CREATE, replacing whatever the client sent, and refuses any
// later change: the requesting user in fencekeeper.io/created-by, except
// for a claim the manager's own identity creates with a controller
// reference to a pod, which it records as bound to no user (created-by
// present and empty) but to that pod (created-by-pod-uid = its UID). The
// manager creates claims only in the pod bridge, so that record is the
// bridge's mark, and a user's claim carries the user's name instead. The
// pod UID must be the one the controller reference names: ownerReferences
// may be edited after CREATE, and a bridge claim moved to another pod must
// not borrow that pod's liveness.
//
// The bridge writes the same record itself, so its claims carry it where
// the policy is not in effect; there, as for rule 9, nothing a claim records
// about its creator can be trusted. A claim made by an older manager, which
// recorded nothing, is not pod-held either: the bridge replaces it.
func BridgeRef(c *fkv1.FencedLease) *metav1.OwnerReference {
	ref := OwnerRef(c)
	if ref == nil || ref.UID == "" {
		return nil
	}
	createdBy, recorded := c.Annotations[fkv1.AnnotationCreatedBy]
	if !recorded || createdBy != "" || c.Annotations[fkv1.AnnotationCreatedByPodUID] != string(ref.UID) {
		return nil
	}
	return ref
}

// Liveness is what the lock authority needs to know about a pod that holds a
// lease: the pod's own state stands in for renewals.
type Liveness int

const (
	// NotAPod: the claim was not made for a pod; its holder renews the Lease.
	NotAPod Liveness = iota
	// Live: Running with all containers ready.
	Live
	// NotLive: exists, but not (yet or any more) ready: the TTL runs.
	NotLive
	// Gone: deleted, being deleted, terminal, or another pod of that name.
	Gone
)

// LivenessOf classifies pod, the pod a claim names by ownerUID.
func LivenessOf(pod *corev1.Pod, ownerUID string) Liveness {
	if pod == nil || string(pod.UID) != ownerUID || pod.DeletionTimestamp != nil ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return Gone
	}
	if pod.Status.Phase != corev1.PodRunning {
		return NotLive
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.ContainersReady {
			if c.Status == corev1.ConditionTrue {
				return Live
			}
			return NotLive
		}
	}
	return NotLive
}

// NotReadySince is when pod's containers last stopped being ready, as the
// kubelet records it on the ContainersReady condition (whole seconds), for
// a Running pod whose containers are not ready on a node not known to be
// not Ready (node may be nil: not known); "" in every other state.
//
// A holder pod's renewal signal includes it: two looks of the authority
// that both saw such a pod, with different times, mean its containers were
// ready in between, on a node that was Ready both times: a renewal, so its
// TTL runs from the later look. In the other states a change proves no
// such thing (containers flipping on a node that is not Ready never made
// the pod live), so it counts for nothing there.
func NotReadySince(pod *corev1.Pod, node *corev1.Node) string {
	if pod.Status.Phase != corev1.PodRunning || node != nil && !NodeReady(node) {
		return ""
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.ContainersReady && c.Status != corev1.ConditionTrue {
			return c.LastTransitionTime.UTC().Format(time.RFC3339)
		}
	}
	return ""
}

// OnNode takes the pod's node into account: a pod whose node is known and not
// Ready is not live, whatever its own conditions still say. When a node is
// lost the node lifecycle controller sets the node Ready=Unknown and only the
// pods' Ready condition to False (ContainersReady stays True) and evicts them
// only after their tolerations (300 s by default), so without this the lease
// of a pod on a dead node would outlive its TTL by minutes. An unknown node
// (not cached, or deleted) changes nothing: the pod garbage collector deletes
// the pods of deleted nodes.
func (l Liveness) OnNode(node *corev1.Node) Liveness {
	if l != Live || node == nil || NodeReady(node) {
		return l
	}
	return NotLive
}

// NodeReady reports whether node's Ready condition is True.
func NodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// StripNode keeps only a node's name and Ready condition: the node cache
// costs a few hundred bytes per node.
func StripNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{
		TypeMeta:   node.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion},
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Status.Conditions = append(out.Status.Conditions, corev1.NodeCondition{Type: c.Type, Status: c.Status})
		}
	}
	return out, nil
}

// IndexNodeName indexes lease-asking pods by the node they run on, so a node
// that stops being Ready wakes the locks its pods hold.
const IndexNodeName = "spec.nodeName"

// Strip keeps only what the pod controllers decide on, so the pod cache
// costs a few hundred bytes per pod instead of the whole object. It is the
// pod informer's cache transform.
func Strip(obj any) (any, error) {
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
		Spec:   corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, fkv1.Prefix) && len(k) > len(fkv1.Prefix) {
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

// AsksForLease selects pods that carry (or, on update, carried) the lease
// annotation.
var AsksForLease = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return HasLeaseAnnotation(e.Object) },
	DeleteFunc: func(e event.DeleteEvent) bool { return HasLeaseAnnotation(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return HasLeaseAnnotation(e.ObjectOld) || HasLeaseAnnotation(e.ObjectNew)
	},
	GenericFunc: func(e event.GenericEvent) bool { return HasLeaseAnnotation(e.Object) },
}

// HasLeaseAnnotation reports whether o asks for a lock.
func HasLeaseAnnotation(o client.Object) bool { return o.GetAnnotations()[fkv1.AnnotationLease] != "" }

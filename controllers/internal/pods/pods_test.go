package pods

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func pod(phase corev1.PodPhase, ready *corev1.ConditionStatus, tweak ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "worker-0", UID: "pod-uid"}, Status: corev1.PodStatus{Phase: phase}}
	if ready != nil {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.ContainersReady, Status: *ready}}
	}
	for _, t := range tweak {
		t(p)
	}
	return p
}

func TestLivenessOf(t *testing.T) {
	yes, no := ptr.To(corev1.ConditionTrue), ptr.To(corev1.ConditionFalse)
	cases := []struct {
		name string
		pod  *corev1.Pod
		uid  string
		want Liveness
	}{
		{"running and ready", pod(corev1.PodRunning, yes), "pod-uid", Live},
		{"running, containers not ready", pod(corev1.PodRunning, no), "pod-uid", NotLive},
		{"running, no ContainersReady condition yet", pod(corev1.PodRunning, nil), "pod-uid", NotLive},
		{"pending (pulling its image)", pod(corev1.PodPending, nil), "pod-uid", NotLive},
		{"succeeded", pod(corev1.PodSucceeded, yes), "pod-uid", Gone},
		{"failed", pod(corev1.PodFailed, nil), "pod-uid", Gone},
		{"being deleted", pod(corev1.PodRunning, yes, func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }), "pod-uid", Gone},
		{"another pod of the same name", pod(corev1.PodRunning, yes), "older-uid", Gone},
		{"no pod", nil, "pod-uid", Gone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := LivenessOf(tc.pod, tc.uid); got != tc.want {
				t.Errorf("LivenessOf = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOwnerRef(t *testing.T) {
	g := NewWithT(t)
	c := &fkv1.FencedLease{}
	g.Expect(OwnerRef(c)).To(BeNil())
	g.Expect(OwnerName(c)).To(BeEmpty())
	c.OwnerReferences = []metav1.OwnerReference{
		{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", Controller: ptr.To(true)},
		{APIVersion: "v1", Kind: "Pod", Name: "not-controller"},
		{APIVersion: "v1", Kind: "Pod", Name: "worker-0", UID: "pod-uid", Controller: ptr.To(true)},
	}
	g.Expect(OwnerName(c)).To(Equal("worker-0"))
	g.Expect(OwnerRef(c).UID).To(BeEquivalentTo("pod-uid"))
}

// Only the pod bridge's own claims are pod-held: an ownerReference anyone
// may write is no proof, what admission recorded about the creator is.
func TestBridgeRef(t *testing.T) {
	owned := func(uid string, ann map[string]string) *fkv1.FencedLease {
		return &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Annotations: ann, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "Pod", Name: "worker-0", UID: types.UID(uid), Controller: ptr.To(true)}}}}
	}
	bridge := map[string]string{fkv1.AnnotationCreatedBy: "", fkv1.AnnotationCreatedByPodUID: "pod-uid"}
	cases := []struct {
		name  string
		claim *fkv1.FencedLease
		want  bool
	}{
		{"made by the bridge (the manager's identity) for that pod", owned("pod-uid", bridge), true},
		{"made by a user, controller reference to a pod", owned("pod-uid", map[string]string{fkv1.AnnotationCreatedBy: "mallory", fkv1.AnnotationCreatedByPodUID: ""}), false},
		{"made by the pod's own ServiceAccount, owned by its pod", owned("pod-uid", map[string]string{
			fkv1.AnnotationCreatedBy: "system:serviceaccount:reports:worker", fkv1.AnnotationCreatedByPodUID: "pod-uid"}), false},
		{"records no creator (an older manager's, or no policy)", owned("pod-uid", nil), false},
		{"created-by missing, pod binding only", owned("pod-uid", map[string]string{fkv1.AnnotationCreatedByPodUID: "pod-uid"}), false},
		{"made by the bridge for one pod, reference moved to another", owned("other-pod", bridge), false},
		{"bridge record, no owner", &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Annotations: bridge}}, false},
		{"bridge record, owner reference not a controller", func() *fkv1.FencedLease {
			c := owned("pod-uid", bridge)
			c.OwnerReferences[0].Controller = nil
			return c
		}(), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := BridgeRef(tc.claim) != nil; got != tc.want {
				t.Errorf("BridgeRef != nil = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStripKeepsWhatDecisionsNeed(t *testing.T) {
	g := NewWithT(t)
	p := pod(corev1.PodRunning, ptr.To(corev1.ConditionTrue), func(p *corev1.Pod) {
		p.Namespace, p.ResourceVersion = "reports", "9"
		p.Annotations = map[string]string{fkv1.AnnotationLease: "report-2026-07", "other": "dropped", fkv1.Prefix: "dropped"}
		p.Spec.Containers = []corev1.Container{{Name: "c", Image: "dropped"}}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	})
	out, err := Strip(p)
	g.Expect(err).NotTo(HaveOccurred())
	s := out.(*corev1.Pod)
	g.Expect(s.Annotations).To(Equal(map[string]string{fkv1.AnnotationLease: "report-2026-07"}))
	g.Expect(s.Spec.Containers).To(BeEmpty())
	g.Expect(s.Status.Conditions).To(HaveLen(1))
	g.Expect(LivenessOf(s, "pod-uid")).To(Equal(Live), "the stripped pod decides the same")
	g.Expect(s.ResourceVersion).To(Equal("9"))
}

func TestOnNode(t *testing.T) {
	node := func(s corev1.ConditionStatus) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		if s != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: s}}
		}
		return n
	}
	cases := []struct {
		name string
		in   Liveness
		node *corev1.Node
		want Liveness
	}{
		{"live pod on a ready node", Live, node(corev1.ConditionTrue), Live},
		{"live pod on a node gone silent (Unknown)", Live, node(corev1.ConditionUnknown), NotLive},
		{"live pod on a NotReady node", Live, node(corev1.ConditionFalse), NotLive},
		{"live pod on a node without a Ready condition yet", Live, node(""), NotLive},
		{"live pod, node not known (deleted: pod GC removes the pod)", Live, nil, Live},
		{"gone pod stays gone", Gone, node(corev1.ConditionFalse), Gone},
		{"not a pod", NotAPod, node(corev1.ConditionFalse), NotAPod},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.OnNode(tc.node); got != tc.want {
				t.Errorf("OnNode = %v, want %v", got, tc.want)
			}
		})
	}
	g := NewWithT(t)
	out, err := StripNode(node(corev1.ConditionUnknown))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out.(*corev1.Node).Status.Conditions).To(Equal([]corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}))
	g.Expect(NodeReady(out.(*corev1.Node))).To(BeFalse())
}

func TestNotReadySince(t *testing.T) {
	g := NewWithT(t)
	at := metav1.NewTime(time.Date(2026, 7, 1, 9, 0, 10, 0, time.UTC))
	notReady := func(tweak ...func(*corev1.Pod)) *corev1.Pod {
		return pod(corev1.PodRunning, ptr.To(corev1.ConditionFalse), append([]func(*corev1.Pod){func(p *corev1.Pod) {
			p.Status.Conditions[0].LastTransitionTime = at
		}}, tweak...)...)
	}
	node := func(s corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s}}}}
	}
	const since = "2026-07-01T09:00:10Z"
	g.Expect(NotReadySince(notReady(), nil)).To(Equal(since), "node not known")
	g.Expect(NotReadySince(notReady(), node(corev1.ConditionTrue))).To(Equal(since))
	stripped, err := Strip(notReady())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(NotReadySince(stripped.(*corev1.Pod), nil)).To(Equal(since), "the pod cache keeps the transition time")

	// No time where a change would not mean the pod was live in between.
	g.Expect(NotReadySince(notReady(), node(corev1.ConditionFalse))).To(BeEmpty(), "node not Ready")
	g.Expect(NotReadySince(notReady(), node(corev1.ConditionUnknown))).To(BeEmpty(), "node gone silent")
	g.Expect(NotReadySince(pod(corev1.PodRunning, ptr.To(corev1.ConditionTrue)), nil)).To(BeEmpty(), "containers ready")
	g.Expect(NotReadySince(pod(corev1.PodPending, ptr.To(corev1.ConditionFalse)), nil)).To(BeEmpty(), "not running")
	g.Expect(NotReadySince(pod(corev1.PodRunning, nil), nil)).To(BeEmpty(), "no condition yet")
}

package podlease

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func leasePod(ann map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "worker-0", Namespace: "reports", UID: "pod-uid", Annotations: ann}}
}

func podClaim(phase fkv1.FencedLeasePhase, epoch int64) *fkv1.FencedLease {
	return &fkv1.FencedLease{Spec: fkv1.FencedLeaseSpec{LockName: "report-2026-07"}, Status: fkv1.FencedLeaseStatus{Phase: phase, Epoch: epoch}}
}

// permitClaim is a pod's claim for a permit of a 3-holder lock, its Held
// condition with reason (none when "").
func permitClaim(phase fkv1.FencedLeasePhase, epoch int64, reason string) *fkv1.FencedLease {
	c := podClaim(phase, epoch)
	c.Spec.MaxHolders = ptr.To[int32](3)
	if reason != "" {
		c.Status.Conditions = []metav1.Condition{{Type: fkv1.ConditionHeld, Status: metav1.ConditionFalse, Reason: reason, Message: "the lock's capacity is 1"}}
	}
	return c
}

func TestPodViewMessages(t *testing.T) {
	g := NewWithT(t)
	g.Expect(podView(leasePod(nil), permitClaim(fkv1.PhaseHeld, 43, ""), true).message).To(Equal("Holds a permit of lock report-2026-07 (up to 3 holders) with epoch 43"))
	g.Expect(podView(leasePod(nil), podClaim(fkv1.PhaseHeld, 42), true).message).To(Equal("Holds lock report-2026-07 with epoch 42"))
	g.Expect(podView(leasePod(nil), permitClaim(fkv1.PhasePending, 0, fkv1.ReasonCapacityMismatch), true).message).To(And(
		ContainSubstring(fkv1.AnnotationLeaseMaxHolders+"=3"), ContainSubstring("the lock's capacity is 1")))
}

func TestPodView(t *testing.T) {
	wasHeld := map[string]string{fkv1.AnnotationLeaseState: fkv1.LeaseStateHeld}
	cases := []struct {
		name   string
		pod    *corev1.Pod
		claim  *fkv1.FencedLease
		asked  bool
		state  string
		epoch  string
		cond   corev1.ConditionStatus
		reason string
	}{
		{"held: epoch and Held shown", leasePod(nil), podClaim(fkv1.PhaseHeld, 42), true, fkv1.LeaseStateHeld, "42", corev1.ConditionTrue, fkv1.ReasonGranted},
		{"queued: Pending", leasePod(nil), podClaim(fkv1.PhasePending, 0), true, fkv1.LeaseStatePending, "", corev1.ConditionFalse, fkv1.ReasonQueued},
		{"queued after holding: Lost, never Pending", leasePod(wasHeld), podClaim(fkv1.PhasePending, 0), true, fkv1.LeaseStateLost, "", corev1.ConditionFalse, fkv1.ReasonQueued},
		{"expired: Lost, epoch left as it was", leasePod(wasHeld), podClaim(fkv1.PhaseExpired, 42), true, fkv1.LeaseStateLost, "", corev1.ConditionFalse, fkv1.ReasonExpired},
		{"claim gone after holding: Lost", leasePod(wasHeld), nil, false, fkv1.LeaseStateLost, "", corev1.ConditionFalse, fkv1.ReasonReleased},
		{"asked while terminating: condition only", leasePod(nil), nil, true, "", "", corev1.ConditionFalse, fkv1.ReasonPodNotLive},
		{"never asked: nothing to show", leasePod(nil), nil, false, "", "", "", ""},
		{"a permit held: epoch and Held shown", leasePod(nil), permitClaim(fkv1.PhaseHeld, 43, ""), true, fkv1.LeaseStateHeld, "43", corev1.ConditionTrue, fkv1.ReasonGranted},
		{"waiting for a permit", leasePod(nil), permitClaim(fkv1.PhasePending, 0, fkv1.ReasonQueued), true, fkv1.LeaseStatePending, "", corev1.ConditionFalse, fkv1.ReasonQueued},
		{"another capacity: says so", leasePod(nil), permitClaim(fkv1.PhasePending, 0, fkv1.ReasonCapacityMismatch), true, fkv1.LeaseStatePending, "", corev1.ConditionFalse, fkv1.ReasonCapacityMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			v := podView(tc.pod, tc.claim, tc.asked)
			g.Expect(v.state).To(Equal(tc.state))
			g.Expect(v.epoch).To(Equal(tc.epoch))
			g.Expect(v.cond).To(Equal(tc.cond))
			g.Expect(v.reason).To(Equal(tc.reason))
		})
	}
}

func TestLeaseRequest(t *testing.T) {
	cases := []struct {
		name    string
		ann     map[string]string
		lock    string
		ttl     int32
		invalid string // substring of the problem ("" = valid)
		max     int32  // the capacity asked for (0: 1, a mutex)
	}{
		{"no request", nil, "", 0, "", 0},
		{"default TTL", map[string]string{fkv1.AnnotationLease: "report-2026-07"}, "report-2026-07", fkv1.DefaultLeaseDurationSeconds, "", 0},
		{"explicit TTL", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseDuration: "30"}, "r", 30, "", 0},
		{"TTL bounds", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseDuration: "86400"}, "r", 86400, "", 0},
		{"TTL zero", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseDuration: "0"}, "r", 0, "1..86400", 0},
		{"TTL too long", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseDuration: "86401"}, "r", 0, "1..86400", 0},
		{"TTL not a number", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseDuration: "30s"}, "r", 0, "whole number", 0},
		{"bad lock name", map[string]string{fkv1.AnnotationLease: "Report_2026"}, "Report_2026", 0, "not a valid lock name", 0},
		{"lock name too long", map[string]string{fkv1.AnnotationLease: strings.Repeat("a", 64)}, strings.Repeat("a", 64), 0, "at most 63", 0},
		// fencekeeper.io/lease-max-holders
		{"semaphore", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: "3"}, "r", fkv1.DefaultLeaseDurationSeconds, "", 3},
		{"max holders bounds", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: "100", fkv1.AnnotationLeaseDuration: "30"}, "r", 30, "", 100},
		{"max holders 1: a mutex", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: "1"}, "r", fkv1.DefaultLeaseDurationSeconds, "", 1},
		{"max holders zero", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: "0"}, "r", 0, "must be a whole number in 1..100", 0},
		{"max holders too many", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: "101"}, "r", 0, "lease-max-holders=\"101\"", 0},
		{"max holders not a number", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: "three"}, "r", 0, "1..100 (1: a mutex, more: a semaphore)", 0},
		{"max holders empty", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: ""}, "r", 0, "lease-max-holders=\"\"", 0},
		{"every problem named", map[string]string{fkv1.AnnotationLease: "r", fkv1.AnnotationLeaseMaxHolders: "-1", fkv1.AnnotationLeaseDuration: "0"}, "r", 0, "1..86400; annotation fencekeeper.io/lease-max-holders", 0},
		{"max holders without a lock: no request", map[string]string{fkv1.AnnotationLeaseMaxHolders: "x"}, "", 0, "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			req, invalid := leaseRequest(leasePod(tc.ann))
			g.Expect(req.lock).To(Equal(tc.lock))
			if tc.invalid == "" {
				g.Expect(invalid).To(BeEmpty())
				g.Expect(req.ttl).To(Equal(tc.ttl))
				g.Expect(req.maxHolders).To(Equal(max(tc.max, 1)))
			} else {
				g.Expect(invalid).To(ContainSubstring(tc.invalid))
			}
		})
	}
}

func TestPodClaimName(t *testing.T) {
	g := NewWithT(t)
	p := leasePod(nil)
	p.Name = strings.Repeat("w", 253)
	name := PodClaimName(p, "report-2026-07")
	g.Expect(validation.IsDNS1123Subdomain(name)).To(BeEmpty())
	g.Expect(PodClaimName(p, "report-2026-07")).To(Equal(name), "deterministic")
	g.Expect(PodClaimName(p, "report-2026-08")).NotTo(Equal(name), "one claim per lock")
	q := p.DeepCopy()
	q.UID = "another-pod"
	g.Expect(PodClaimName(q, "report-2026-07")).NotTo(Equal(name), "a re-created pod gets a new claim")
	g.Expect(podClaimName(p, "report-2026-07", 1)).To(Equal(name), "a mutex's claim keeps its name")
	sem := podClaimName(p, "report-2026-07", 3)
	g.Expect(sem).NotTo(Equal(name), "another capacity, another claim")
	g.Expect(podClaimName(p, "report-2026-07", 4)).NotTo(Equal(sem))
	g.Expect(validation.IsDNS1123Subdomain(sem)).To(BeEmpty())
}

func TestMadeForRefusesAClaimSquattingOnThePodsName(t *testing.T) {
	g := NewWithT(t)
	pod := leasePod(nil)
	own := func(ann map[string]string) *fkv1.FencedLease {
		c := podClaim(fkv1.PhasePending, 0)
		c.Annotations = ann
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
		return c
	}
	g.Expect(madeFor(own(map[string]string{fkv1.AnnotationCreatedBy: "", fkv1.AnnotationCreatedByPodUID: string(pod.UID)}), pod)).To(BeTrue(), "the bridge's claim")
	g.Expect(madeFor(own(nil), pod)).To(BeFalse(), "a claim that records no binding (its epoch would be refused every write)")
	g.Expect(madeFor(own(map[string]string{fkv1.AnnotationCreatedByPodUID: string(pod.UID)}), pod)).To(BeFalse(), "no created-by at all")
	g.Expect(madeFor(own(map[string]string{fkv1.AnnotationCreatedBy: "mallory", fkv1.AnnotationCreatedByPodUID: ""}), pod)).To(BeFalse(), "a user's claim with a forged owner")
	g.Expect(madeFor(own(map[string]string{fkv1.AnnotationCreatedBy: "", fkv1.AnnotationCreatedByPodUID: "another-pod"}), pod)).To(BeFalse())
	g.Expect(madeFor(podClaim(fkv1.PhasePending, 0), pod)).To(BeFalse(), "not owned by the pod")
}

// The bridge looks after its own claims and an older manager's (which
// record no creator), never a user's claim that names the pod as its
// controller: that one is the user's to renew or release.
func TestBridgesPodLeavesAUsersClaimAlone(t *testing.T) {
	g := NewWithT(t)
	pod := leasePod(nil)
	own := func(ann map[string]string) *fkv1.FencedLease {
		c := podClaim(fkv1.PhasePending, 0)
		c.Annotations = ann
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
		return c
	}
	g.Expect(bridgesPod(own(map[string]string{fkv1.AnnotationCreatedBy: "", fkv1.AnnotationCreatedByPodUID: string(pod.UID)}))).To(BeTrue(), "the bridge's claim")
	g.Expect(bridgesPod(own(nil))).To(BeTrue(), "an older manager's claim, which the bridge replaces")
	g.Expect(bridgesPod(own(map[string]string{fkv1.AnnotationCreatedBy: "mallory", fkv1.AnnotationCreatedByPodUID: ""}))).To(BeFalse(), "a user's claim")
	g.Expect(bridgesPod(podClaim(fkv1.PhasePending, 0))).To(BeFalse(), "not owned by a pod")
}

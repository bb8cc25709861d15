package cluster_test

import (
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// claimHistory watches every claim of a namespace and records, after each
// event, which claims show Held: the safety property is that no two ever do
// at once, and that each grant's epoch is above every earlier one.
type claimHistory struct {
	mu         sync.Mutex
	held       map[string]int64 // claim name -> epoch, while Held
	doubleHeld []string
	epochs     []int64 // epochs in the order claims first showed them Held
	seen       map[int64]string
	reused     []string
	stop       func()
}

func watchClaims(ns string) *claimHistory {
	w, err := k8s.Watch(ctx, &fkv1.FencedLeaseList{}, client.InNamespace(ns))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	h := &claimHistory{held: map[string]int64{}, seen: map[int64]string{}, stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*fkv1.FencedLease)
			if !ok {
				continue
			}
			h.mu.Lock()
			delete(h.held, c.Name)
			if ev.Type != watch.Deleted && c.Status.Phase == fkv1.PhaseHeld {
				h.held[c.Name] = c.Status.Epoch
				if len(h.held) > 1 {
					h.doubleHeld = append(h.doubleHeld, fmt.Sprint(h.held))
				}
				if who, ok := h.seen[c.Status.Epoch]; !ok {
					h.seen[c.Status.Epoch] = string(c.UID)
					h.epochs = append(h.epochs, c.Status.Epoch)
				} else if who != string(c.UID) {
					h.reused = append(h.reused, fmt.Sprintf("epoch %d held by claims %s and %s", c.Status.Epoch, who, c.UID))
				}
			}
			h.mu.Unlock()
		}
	}()
	return h
}

// check stops the watch and asserts the history was safe; it returns how
// many distinct epochs were granted.
func (h *claimHistory) check() int {
	h.stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	ExpectWithOffset(1, h.doubleHeld).To(BeEmpty(), "two claims showed Held at once")
	ExpectWithOffset(1, h.reused).To(BeEmpty())
	for i := 1; i < len(h.epochs); i++ {
		ExpectWithOffset(1, h.epochs[i]).To(BeNumerically(">", h.epochs[i-1]), "epochs went down: %v", h.epochs)
	}
	return len(h.epochs)
}

func podsOf(ns, app string) []corev1.Pod {
	var list corev1.PodList
	ExpectWithOffset(1, k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{"app": app})).To(Succeed())
	return list.Items
}

// holderPod is the pod whose lease-state is Held ("" when none, or more).
func heldPods(ns, app string) []string {
	var out []string
	for _, p := range podsOf(ns, app) {
		if p.Annotations[fkv1.AnnotationLeaseState] == fkv1.LeaseStateHeld {
			out = append(out, p.Name)
		}
	}
	return out
}

// readyPods are the pods whose Ready condition is True (not deleting).
func readyPods(ns, app string) []string {
	var out []string
	for _, p := range podsOf(ns, app) {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				out = append(out, p.Name)
			}
		}
	}
	return out
}

// theReadyHolder is the pod that holds the lock and is the only Ready one
// ("" while that is not so).
func theReadyHolder(ns, app string) string {
	held, ready := heldPods(ns, app), readyPods(ns, app)
	if len(held) != 1 || len(ready) != 1 || held[0] != ready[0] {
		return ""
	}
	return held[0]
}

func runningReady(ns, app string) int {
	n := 0
	for _, p := range podsOf(ns, app) {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

var _ = Describe("Pod leases with real Deployments and nodes (kwok)", Ordered, func() {
	BeforeAll(func() {
		for _, n := range []string{"kwok-a", "kwok-b", "kwok-c"} {
			_, err := envtestutil.AddNode(ctx, k8s, n)
			Expect(err).NotTo(HaveOccurred())
		}
	})

	It("a 3-replica Deployment: one pod holds at a time, through a rollout, with epochs that only go up", func() {
		ns := newNamespace()
		hist := watchClaims(ns)
		d := leaseDeployment(ns, "reporter", "report", "", 3, "10")
		Eventually(func() int { return runningReady(ns, "reporter") }, 60*time.Second, 250*time.Millisecond).Should(Equal(3))
		Eventually(func() []string { return heldPods(ns, "reporter") }, 30*time.Second).Should(HaveLen(1))

		By("rolling out a new template: old pods go, new pods come, the lock passes on")
		before := heldPods(ns, "reporter")[0]
		Expect(k8s.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: d.Name}}, client.RawPatch(
			"application/merge-patch+json", []byte(`{"spec":{"template":{"metadata":{"annotations":{"rollout":"2"}}}}}`)))).To(Succeed())
		Eventually(func() bool {
			var got appsv1.Deployment
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(d), &got)).To(Succeed())
			return got.Status.ObservedGeneration == got.Generation && got.Status.UpdatedReplicas == 3 &&
				got.Status.Replicas == 3 && got.Status.ReadyReplicas == 3
		}, 90*time.Second, 250*time.Millisecond).Should(BeTrue(), "the rollout did not finish")
		Eventually(func() []string { return heldPods(ns, "reporter") }, 30*time.Second).Should(
			And(HaveLen(1), Not(ContainElement(before))))
		Expect(hist.check()).To(BeNumerically(">=", 2), "the lock never passed on")
	})

	It("with the lease-held readiness gate, only the holder's pod is Ready, and Ready passes on with the lock", func() {
		ns := newNamespace()
		d := leaseDeployment(ns, "gated", "gated", "", 3, "10", withLeaseGate)
		Eventually(func() int {
			n := 0
			for _, p := range podsOf(ns, "gated") {
				if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
					n++
				}
			}
			return n
		}, 60*time.Second, 250*time.Millisecond).Should(Equal(3), "the scheduler did not place the pods, or kwok did not run them")
		Eventually(func() string { return theReadyHolder(ns, "gated") }, 30*time.Second, 250*time.Millisecond).ShouldNot(BeEmpty())
		holder := theReadyHolder(ns, "gated")
		Consistently(func() []string { return readyPods(ns, "gated") }, 3*time.Second).Should(Equal([]string{holder}),
			"a pod whose readiness gate is not True became Ready")
		Eventually(func() int32 {
			var got appsv1.Deployment
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(d), &got)).To(Succeed())
			return got.Status.ReadyReplicas
		}, 30*time.Second, 250*time.Millisecond).Should(Equal(int32(1)))

		By("the holder's pod goes: the lock passes on, and Ready with it")
		Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder}})).To(Succeed())
		Eventually(func() string { return theReadyHolder(ns, "gated") }, 30*time.Second, 250*time.Millisecond).Should(
			And(Not(BeEmpty()), Not(Equal(holder))))
	})

	It("a lost node: its pod's lease expires after the TTL, long before eviction, and the waiter takes over", func() {
		ns := newNamespace()
		hist := watchClaims(ns)
		leaseDeployment(ns, "first", "job", "kwok-b", 1, "4")
		Eventually(func() []string { return heldPods(ns, "first") }, 60*time.Second).Should(HaveLen(1))
		leaseDeployment(ns, "second", "job", "kwok-c", 1, "4")
		Eventually(func() int { return runningReady(ns, "second") }, 60*time.Second, 250*time.Millisecond).Should(Equal(1))
		Consistently(func() []string { return heldPods(ns, "second") }, 6*time.Second).Should(BeEmpty(),
			"the waiter was granted while the holder's node was fine")

		By("node kwok-b goes silent")
		lost := podsOf(ns, "first")[0]
		Expect(envtestutil.SilenceNode(ctx, k8s, "kwok-b")).To(Succeed())
		Eventually(func() []string { return heldPods(ns, "second") }, 60*time.Second, 250*time.Millisecond).Should(HaveLen(1))

		By("the old holder's pod is still there, not yet evicted: only its node's state ended its lease")
		var still corev1.Pod
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(&lost), &still)).To(Succeed())
		Expect(still.DeletionTimestamp).To(BeNil(), "the pod was evicted already: the test cannot tell node loss from eviction")
		Expect(hist.check()).To(Equal(2))
	})
})

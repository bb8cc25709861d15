package authority_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var _ = Describe("A hand-made claim with a controller reference to a ready pod", func() {
	// Rev. 3 §2: a claim is pod-held only when the pod bridge made it for
	// that pod. The authority tells that from what admission recorded about
	// who created the claim, which the creator cannot choose; an
	// ownerReference anyone may write.
	It("borrows no liveness from the pod: it expires after its TTL with the pod still ready, while the bridge's own claim for that pod is kept", func() {
		ns := newNamespace()
		m := startManager(time.Second)
		DeferCleanup(m.Stop)

		By("a ready pod holds lock bridged through the pod bridge (TTL 2 s)")
		p := leasePod(ns, "long-lived", "bridged", "2", true)
		Eventually(stateOf(ns, p.Name), 10*time.Second).Should(Equal("Held/1"))

		By("another user makes a claim on lock borrowed (TTL 2 s) that names the pod as its controller, and tries to pass it off as the bridge's")
		u, err := testEnv.AddUser(envtest.User{Name: "mallory", Groups: []string{"system:masters"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		mallory, err := client.New(u.Config(), client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		borrowed := &fkv1.FencedLease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "borrowed",
				Labels:      map[string]string{fkv1.LabelPodUID: string(p.UID)},
				Annotations: map[string]string{fkv1.AnnotationCreatedBy: "", fkv1.AnnotationCreatedByPodUID: string(p.UID)},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID,
					Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false)}}},
			Spec: fkv1.FencedLeaseSpec{LockName: "borrowed", HolderIdentity: "mallory", LeaseDurationSeconds: ptr.To(int32(2))},
		}
		Expect(mallory.Create(ctx, borrowed)).To(Succeed())
		Expect(borrowed.Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedBy, "mallory"), "admission records who created the claim")
		Expect(borrowed.Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedByPodUID, ""))

		By("it is granted like any claim, and, never renewed, expires a TTL later")
		heldAt := time.Now()
		eventuallyPhase(ns, borrowed.Name, fkv1.PhaseHeld)
		Eventually(func() fkv1.FencedLeasePhase { return getClaim(ns, borrowed.Name).Status.Phase }, 10*time.Second, 50*time.Millisecond).
			Should(Equal(fkv1.PhaseExpired), "a hand-made claim outlived its TTL on a ready pod's liveness")
		Expect(time.Since(heldAt)).To(BeNumerically(">=", 1500*time.Millisecond), "expired before its TTL")

		By("the pod is still ready, and the bridge's claim for it still holds, past the same TTL")
		var cur corev1.Pod
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), &cur)).To(Succeed())
		Expect(cur.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.ContainersReady), HaveField("Status", corev1.ConditionTrue))))
		Expect(stateOf(ns, p.Name)()).To(Equal("Held/1"))
		Consistently(stateOf(ns, p.Name), 3*time.Second).Should(Equal("Held/1"))
		Expect(getClaim(ns, borrowed.Name).UID).To(Equal(borrowed.UID), "the pod bridge leaves a user's claim alone")
	})
})

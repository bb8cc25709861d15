package admission_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/podlease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// Rule 9: an epoch is an identifier, not a bearer token.
var _ = Describe("Identity binding", func() {
	var (
		ns   string
		lock = "report-2026-07"
	)
	BeforeEach(func() {
		ns = newNamespace()
		mgr := startManager()
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
	})

	merge := func(c client.Client, name string, epoch int64, data string, opts ...client.PatchOption) error {
		p := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"data":{"report.csv":%q}}`, fkv1.AnnotationEpoch, epoch, data)
		return c.Patch(ctx, cmRef(ns, name), client.RawPatch(types.MergePatchType, []byte(p)), opts...)
	}

	It("records who created a claim, whatever the client claims, and keeps it", func() {
		c := newClaimObj(ns, "w2", lock, "W2", 300)
		c.Annotations = map[string]string{fkv1.AnnotationCreatedBy: "someone-else"}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Expect(c.Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedBy, "admin"))
		c.Annotations[fkv1.AnnotationCreatedBy] = "mallory"
		err := k8s.Update(ctx, c)
		Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("cannot be changed"))
	})

	It("labels a claim with its lock, whatever the client sent, and keeps the label", func() {
		c := newClaimObj(ns, "w3", lock, "W3", 300)
		c.Labels = map[string]string{fkv1.LabelLock: "another-lock"}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Expect(c.Labels).To(HaveKeyWithValue(fkv1.LabelLock, lock))
		var listed fkv1.FencedLeaseList
		Expect(k8s.List(ctx, &listed, client.InNamespace(ns), client.MatchingLabels{fkv1.LabelLock: lock})).To(Succeed())
		Expect(listed.Items).To(HaveLen(1))

		delete(c.Labels, fkv1.LabelLock)
		err := k8s.Update(ctx, c)
		Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("fencekeeper.io/lock label of a claim"))

		By("a lock name the schema refuses is reported as exactly that")
		bad := newClaimObj(ns, "w4", "Not_A_Lock", "W4", 300)
		err = k8s.Create(ctx, bad)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.lockName"))
		Expect(err.Error()).NotTo(ContainSubstring("metadata.labels"))
	})

	It("refuses the holder's epoch from another identity, naming the lock and the holder's identity; the opt-out accepts it", func() {
		w2 := acquire(ns, "w2", lock, "W2", 300)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w2.Status.Epoch, "v12 by W2", nil))).To(Succeed())
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "shared", lock, w2.Status.Epoch, "v1 by W2",
			map[string]string{fkv1.AnnotationFenceIdentity: fkv1.FenceIdentityAny}))).To(Succeed())
		mallory := userClient("mallory")

		err := merge(mallory, lock, w2.Status.Epoch, "forged by mallory")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("epoch %d of lock %s/%s is held by user %q, but this write comes from user %q",
			w2.Status.Epoch, ns, lock, "admin", "mallory")))
		Expect(configMapData(ns, lock)).To(Equal("v12 by W2"))
		By("nor can another identity create an object under the holder's epoch")
		err = mallory.Create(ctx, fencedConfigMap(ns, "new", lock, w2.Status.Epoch, "by mallory",
			map[string]string{fkv1.AnnotationFenceIdentity: fkv1.FenceIdentityAny}))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)

		By("the holder itself writes; an object that opts out accepts the epoch from anyone")
		Expect(merge(k8s, lock, w2.Status.Epoch, "v13 by W2")).To(Succeed())
		Expect(merge(mallory, "shared", w2.Status.Epoch, "v2 by a helper")).To(Succeed())
		By("a write cannot opt itself out")
		p := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d",%q:%q}},"data":{"report.csv":"sneaky"}}`,
			fkv1.AnnotationEpoch, w2.Status.Epoch, fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)
		err = mallory.Patch(ctx, cmRef(ns, lock), client.RawPatch(types.MergePatchType, []byte(p)))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
	})

	It("checks an older epoch against the claim that held it, and refuses when that is ambiguous", func() {
		w1 := acquire(ns, "w1", lock, "W1", 1) // expires: its claim stays, Expired, with its epoch
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v1 by W1",
			map[string]string{fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic}))).To(Succeed())
		w2 := acquire(ns, "w2", lock, "W2", 300)
		Expect(w2.Status.Epoch).To(BeNumerically(">", w1.Status.Epoch))
		waitPhase(w1, fkv1.PhaseExpired)

		By("under monotonic, the old epoch is checked against its claim: its creator passes, another user does not")
		Expect(merge(k8s, lock, w1.Status.Epoch, "v2 by W1")).To(Succeed())
		err := merge(userClient("mallory"), lock, w1.Status.Epoch, "v2 by mallory")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)

		By("a second claim's status is written by hand to show the same epoch: the holder is no longer known")
		decoy := newClaimObj(ns, "decoy", lock, "M", 300)
		Expect(userClient("mallory").Create(ctx, decoy)).To(Succeed())
		Eventually(func() fkv1.FencedLeasePhase {
			_ = k8s.Get(ctx, client.ObjectKeyFromObject(decoy), decoy)
			return decoy.Status.Phase
		}, 10*time.Second).Should(Equal(fkv1.PhasePending))
		p := fmt.Sprintf(`{"status":{"epoch":%d}}`, w1.Status.Epoch)
		Expect(k8s.Status().Patch(ctx, decoy, client.RawPatch(types.MergePatchType, []byte(p)))).To(Succeed())
		// Wait with dry runs until the webhook's cache shows the decoy (a real
		// write before that would rightly pass and change the object).
		Eventually(func() error { return merge(k8s, lock, w1.Status.Epoch, "v3 by W1", client.DryRunAll) }, 5*time.Second).
			Should(MatchError(ContainSubstring("cannot be checked")))
		Expect(merge(k8s, lock, w1.Status.Epoch, "v3 by W1")).To(MatchError(ContainSubstring("cannot be checked")))
		Expect(configMapData(ns, lock)).To(Equal("v2 by W1"))
	})

	It("binds a pod's claim to the pod: only a token bound to that pod presents its epoch", func() {
		workerAccount(ns)
		pod := func(name string, lease bool) *corev1.Pod {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: corev1.PodSpec{ServiceAccountName: "worker", Containers: []corev1.Container{{Name: "app", Image: "example.com/app"}}}}
			if lease {
				p.Annotations = map[string]string{fkv1.AnnotationLease: lock}
			}
			Expect(k8s.Create(ctx, p)).To(Succeed())
			// Play the kubelet: Running with its containers ready (a pod is
			// granted only once they are).
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
			Expect(k8s.Status().Update(ctx, p)).To(Succeed())
			return p
		}
		holder, other := pod("worker-0", true), pod("worker-1", false)

		By("the pod bridge's claim is bound to the pod")
		var claims fkv1.FencedLeaseList
		Eventually(func() int64 {
			Expect(k8s.List(ctx, &claims, client.InNamespace(ns))).To(Succeed())
			if len(claims.Items) != 1 {
				return 0
			}
			return claims.Items[0].Status.Epoch
		}, 30*time.Second).ShouldNot(BeZero())
		claim := claims.Items[0]
		Expect(claim.Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedByPodUID, string(holder.UID)))
		epoch := claim.Status.Epoch
		err := k8s.Create(ctx, fencedConfigMap(ns, lock, lock, epoch, "v0 by admin", nil))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(asPod(holder).Create(ctx, fencedConfigMap(ns, lock, lock, epoch, "v0 by worker-0", nil))).To(Succeed())
		Expect(merge(asPod(holder), lock, epoch, "v1 by worker-0")).To(Succeed())
		err = merge(asPod(other), lock, epoch, "v1 by worker-1")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("a token bound to pod " + string(holder.UID)))
		err = merge(k8s, lock, epoch, "v1 by admin")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(configMapData(ns, lock)).To(Equal("v1 by worker-0"))
	})
})

var _ = Describe("Identity binding of pod claims", func() {
	It("does not let a user squat on a pod's claim name: the bridge replaces it with the pod's own claim", func() {
		ns := newNamespace()
		mgr := startManager()
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "victim"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.com/app"}}}}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		Expect(k8s.Status().Update(ctx, p)).To(Succeed())

		By("mallory creates a claim under the name the bridge will use, with a forged pod owner")
		name := podlease.PodClaimName(p, "lk")
		squat := newClaimObj(ns, name, "lk", "victim", 300)
		squat.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}
		Expect(userClient("mallory").Create(ctx, squat)).To(Succeed())
		Expect(squat.Annotations).To(HaveKeyWithValue(fkv1.AnnotationCreatedBy, "mallory"))

		By("the pod asks for the lock: its claim is the bridge's, bound to the pod")
		Expect(k8s.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"fencekeeper.io/lease":"lk"}}}`)))).To(Succeed())
		Eventually(func() map[string]string {
			var c fkv1.FencedLease
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &c); err != nil || c.Status.Phase != fkv1.PhaseHeld {
				return nil
			}
			return c.Annotations
		}, 30*time.Second).Should(And(HaveKeyWithValue(fkv1.AnnotationCreatedBy, ""), HaveKeyWithValue(fkv1.AnnotationCreatedByPodUID, string(p.UID))))
		var l coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lk"}, &l)).To(Succeed())
		Expect(l.Annotations).NotTo(HaveKeyWithValue(fkv1.AnnotationHolderUser, "mallory"))
		Expect(l.Annotations).To(HaveKeyWithValue(fkv1.AnnotationHolderPodUID, string(p.UID)))
	})
})

var userClients = map[string]client.Client{}

// userClient is a client for a cluster-admin user other than the holder.
func userClient(name string) client.Client {
	if c, ok := userClients[name]; ok {
		return c
	}
	u, err := testEnv.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(u.Config(), client.Options{Scheme: envtestutil.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	userClients[name] = c
	return c
}

package cluster_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var _ = Describe("Namespace deletion and garbage collection by kube-controller-manager", func() {
	It("deletes a namespace holding a managed Lease, claims and fenced objects; re-created, its lock never reuses an epoch", func() {
		ns := newNamespace()
		w1 := waitPhase(claim(ns, "w1", "report", 60), fkv1.PhaseHeld)
		w2 := waitPhase(claim(ns, "w2", "report", 60), fkv1.PhasePending)
		first := epochOf(w1)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "report-2026-07", "report", first))).To(Succeed())

		By("the fence is armed: an ordinary delete of the fenced object is refused")
		err := k8s.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report-2026-07"}})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		var lease coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &lease)).To(Succeed())
		Expect(apierrors.IsForbidden(k8s.Delete(ctx, &lease))).To(BeTrue(), "the lease guard lets an admin delete a managed Lease")

		By("kubectl delete namespace: the namespace controller removes everything and the namespace goes")
		Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}))
		}, 120*time.Second, 250*time.Millisecond).Should(BeTrue(), "namespace %s stuck in Terminating", ns)
		_ = w2

		By("re-created with the same name, the lock starts above every epoch it ever issued")
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		again := waitPhase(claim(ns, "w1", "report", 60), fkv1.PhaseHeld)
		Expect(epochOf(again)).To(BeNumerically(">", first))

		By("a paused writer of the old namespace's epoch cannot re-create its object")
		err = k8s.Create(ctx, fencedConfigMap(ns, "report-2026-07", "report", first))
		Expect(apierrors.IsConflict(err) || apierrors.IsForbidden(err)).To(BeTrue(), "stale re-create: %v", err)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "report-2026-07", "report", epochOf(again)))).To(Succeed())
	})

	It("lets the garbage collector delete fenced dependents (background and foreground), and nobody else", func() {
		ns := newNamespace()
		w1 := waitPhase(claim(ns, "w1", "report", 60), fkv1.PhaseHeld)
		for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationForeground} {
			owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner-" + strings.ToLower(string(policy))}}
			Expect(k8s.Create(ctx, owner)).To(Succeed())
			dep := fencedConfigMap(ns, "dependent-"+strings.ToLower(string(policy)), "report", epochOf(w1))
			dep.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}}
			Expect(k8s.Create(ctx, dep)).To(Succeed())
			Expect(dep.Annotations[fkv1.AnnotationFencedEpoch]).NotTo(BeEmpty(), "the dependent is not fenced")
			Expect(apierrors.IsForbidden(k8s.Delete(ctx, dep))).To(BeTrue(), "an unmarked delete of a fenced object went through")

			By("deleting the owner with propagation " + string(policy))
			Expect(k8s.Delete(ctx, owner, client.PropagationPolicy(policy))).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(dep), &corev1.ConfigMap{}))
			}, 60*time.Second, 250*time.Millisecond).Should(BeTrue(), "the garbage collector did not delete the fenced dependent")
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(owner), &corev1.ConfigMap{}))
			}, 60*time.Second, 250*time.Millisecond).Should(BeTrue())
		}
	})
})

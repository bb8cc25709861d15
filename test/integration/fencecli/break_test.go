package fencecli_test

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// userKubeconfig adds a user (no groups) with rules in ns and returns its
// kubeconfig path and a client.
func userKubeconfig(ns, name string, rules []rbacv1.PolicyRule) (string, client.WithWatch) {
	u, err := env.Env.AddUser(envtest.User{Name: name}, nil)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}
	ExpectWithOffset(1, admin.Create(ctx, role)).To(Succeed())
	ExpectWithOffset(1, admin.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: name}}})).To(Succeed())
	kc, err := u.KubeConfig()
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	path := filepath.Join(GinkgoT().TempDir(), name+".kubeconfig")
	ExpectWithOffset(1, os.WriteFile(path, kc, 0o600)).To(Succeed())
	c, err := client.NewWithWatch(u.Config(), client.Options{Scheme: lease.Scheme()})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return path, c
}

func forcedReleases() float64 {
	families, err := metrics.Registry.Gather()
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() == "fencekeeper_forced_releases_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

var _ = Describe("kubectl fence break", func() {
	It("is refused to a holder who may patch claims but lacks the verb break; a breaker ends the hold at once, on the record, and the old holder's write is refused", func() {
		ns, err := envtestutil.NewNamespace(ctx, admin, "break")
		Expect(err).NotTo(HaveOccurred())
		holderRules := []rbacv1.PolicyRule{
			{APIGroups: []string{fkv1.GroupVersion.Group}, Resources: []string{"fencedleases"}, Verbs: []string{"create", "get", "list", "watch", "delete", "patch", "update"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "watch", "update"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "patch"}},
		}
		holderKC, holderClient := userKubeconfig(ns, "holder-w1", holderRules)
		breakerKC, _ := userKubeconfig(ns, "oncall-alice", []rbacv1.PolicyRule{
			{APIGroups: []string{fkv1.GroupVersion.Group}, Resources: []string{"fencedleases"}, Verbs: []string{"get", "list", "watch", "patch", "break"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get"}},
		})

		By("W1 holds the lock (and renews it), W2 waits")
		w1, err := lease.NewClientFrom(holderClient, ns).Acquire(ctx, "report-2026-07", "W1", lease.Options{TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = w1.Release(ctx) })
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report-2026-07"}, Data: map[string]string{"report.csv": "v11 by W1"}}
		Expect(w1.Create(ctx, holderClient, cm)).To(Succeed())
		w2 := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w2"},
			Spec: fkv1.FencedLeaseSpec{LockName: "report-2026-07", HolderIdentity: "W2", LeaseDurationSeconds: ptr.To(int32(300))}}
		Expect(admin.Create(ctx, w2)).To(Succeed())
		before := forcedReleases()

		By("the holder, who may patch its claim, cannot break the lock")
		code, _, stderr := fenceAs(holderKC, ns, "break", "report-2026-07", "--reason", "I want it back")
		Expect(code).To(Equal(1), stderr)
		Expect(stderr).To(ContainSubstring(`needs the verb "break" on fencedleases.fencekeeper.io, which user holder-w1 lacks`))
		By("nor forge a break by writing the annotations itself")
		var mine fkv1.FencedLease
		Expect(holderClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: w1.ClaimName}, &mine)).To(Succeed())
		mine.Annotations[fkv1.AnnotationBrokenBy] = "oncall-alice"
		mine.Annotations[fkv1.AnnotationBreakReason] = "forged"
		err = holderClient.Update(ctx, &mine)
		Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		By("nor with the text a policy might take for 'absent'")
		Expect(holderClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: w1.ClaimName}, &mine)).To(Succeed())
		mine.Annotations[fkv1.AnnotationBrokenBy] = "<none>"
		mine.Annotations[fkv1.AnnotationBreakReason] = "<none>"
		err = holderClient.Update(ctx, &mine)
		Expect(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		By("nor create a claim that is already broken")
		forged := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "forged",
			Annotations: map[string]string{fkv1.AnnotationBrokenBy: "<none>", fkv1.AnnotationBreakReason: "<none>"}},
			Spec: fkv1.FencedLeaseSpec{LockName: "report-2026-07", HolderIdentity: "W9"}}
		err = holderClient.Create(ctx, forged)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Consistently(w1.State, 2*time.Second, 100*time.Millisecond).Should(Equal(lease.Held))
		Expect(forcedReleases()).To(Equal(before))

		By("the on-call breaker breaks it with a reason")
		code, stdout, stderr := fenceAs(breakerKC, ns, "break", "report-2026-07", "--reason", "W1 hung for an hour; INC-4711")
		Expect(code).To(Equal(0), stderr)
		Expect(stdout).To(ContainSubstring("broke lock " + ns + "/report-2026-07"))
		Expect(stdout).To(ContainSubstring("ForcedRelease"))

		var ended fkv1.FencedLease
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: w1.ClaimName}, &ended)).To(Succeed())
		Expect(ended.Status.Phase).To(Equal(fkv1.PhaseExpired))
		held := meta.FindStatusCondition(ended.Status.Conditions, fkv1.ConditionHeld)
		Expect(held.Reason).To(Equal(fkv1.ReasonForcedRelease))
		Expect(held.Message).To(ContainSubstring(`forcibly released by user "oncall-alice": reason "W1 hung for an hour; INC-4711"`))
		Expect(ended.Annotations).To(HaveKeyWithValue(fkv1.AnnotationBrokenBy, "oncall-alice"))
		Eventually(func() int64 {
			var cur fkv1.FencedLease
			Expect(admin.Get(ctx, client.ObjectKeyFromObject(w2), &cur)).To(Succeed())
			if cur.Status.Phase != fkv1.PhaseHeld {
				return 0
			}
			return cur.Status.Epoch
		}, 10*time.Second).Should(Equal(w1.Epoch + 1))
		Eventually(forcedReleases, 5*time.Second).Should(Equal(before + 1))
		Eventually(w1.State, 10*time.Second).Should(Equal(lease.Lost))

		By("a Warning Event on the claim names the breaker and the reason")
		Eventually(func() []string {
			var evs eventsv1.EventList
			Expect(admin.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var out []string
			for _, e := range evs.Items {
				if e.Regarding.Name == w1.ClaimName && e.Reason == fkv1.ReasonForcedRelease {
					out = append(out, e.Type+" "+e.Note)
				}
			}
			return out
		}, 10*time.Second).Should(ContainElement(And(HavePrefix(corev1.EventTypeWarning),
			ContainSubstring(`forcibly released by user "oncall-alice"`), ContainSubstring(`reason "W1 hung for an hour; INC-4711"`))))

		By("who broke it cannot be rewritten afterwards")
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: w1.ClaimName}, &ended)).To(Succeed())
		ended.Annotations[fkv1.AnnotationBrokenBy] = "someone-else"
		err = admin.Update(ctx, &ended)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)

		By("W1's late write with its epoch is refused by the fence")
		var cur corev1.ConfigMap
		Expect(holderClient.Get(ctx, client.ObjectKeyFromObject(cm), &cur)).To(Succeed())
		cur.Data["report.csv"] = "late v11 by W1"
		err = w1.Update(ctx, holderClient, &cur)
		Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "%v", err)
		Expect(holderClient.Get(ctx, client.ObjectKeyFromObject(cm), &cur)).To(Succeed())
		Expect(cur.Data["report.csv"]).To(Equal("v11 by W1"))

		By("breaking a free lock says so")
		Expect(admin.Delete(ctx, w2)).To(Succeed())
		Eventually(func() string {
			_, _, stderr := fenceAs(breakerKC, ns, "break", "report-2026-07", "--reason", "again")
			return strings.TrimSpace(stderr)
		}, 10*time.Second).Should(ContainSubstring("is free"))
	})
})

package webhook_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook/leaseguard"
)

var _ = Describe("Managed-Lease guard (ValidatingAdmissionPolicy) and its Go twin", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		m := startManager()
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })
	})

	type mutation struct {
		name   string
		delete bool
		mutate func(l *coordinationv1.Lease)
	}
	later := func(l *coordinationv1.Lease, d time.Duration) *metav1.MicroTime {
		t := metav1.NewMicroTime(l.Spec.RenewTime.Add(d))
		return &t
	}
	cases := []mutation{
		{name: "a renewal advancing renewTime", mutate: func(l *coordinationv1.Lease) { l.Spec.RenewTime = later(l, time.Second) }},
		{name: "renewTime moved backward", mutate: func(l *coordinationv1.Lease) { l.Spec.RenewTime = later(l, -time.Hour) }},
		{name: "epoch lowered", mutate: func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationEpoch] = "0" }},
		{name: "epoch raised", mutate: func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationEpoch] = "99" }},
		{name: "holder changed", mutate: func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("mallory") }},
		{name: "holder claim-uid changed", mutate: func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationClaimUID] = "someone-else" }},
		{name: "finalizer removed", mutate: func(l *coordinationv1.Lease) { l.Finalizers = nil }},
		{name: "managed-by label removed", mutate: func(l *coordinationv1.Lease) { delete(l.Labels, fkv1.LabelManagedBy) }},
		{name: "TTL changed with a renewal", mutate: func(l *coordinationv1.Lease) {
			l.Spec.LeaseDurationSeconds = ptr.To(int32(86400))
			l.Spec.RenewTime = later(l, time.Second)
		}},
		{name: "unrelated annotation with a renewal", mutate: func(l *coordinationv1.Lease) {
			l.Annotations["note"] = "x"
			l.Spec.RenewTime = later(l, time.Second)
		}},
		{name: "delete", delete: true},
	}

	run := func(c client.Client, tc mutation) (*coordinationv1.Lease, *coordinationv1.Lease, error) {
		var old coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "guarded"}, &old)).To(Succeed())
		if tc.delete {
			return &old, nil, c.Delete(ctx, old.DeepCopy(), client.DryRunAll)
		}
		updated := old.DeepCopy()
		tc.mutate(updated)
		return &old, updated, c.Update(ctx, updated, client.DryRunAll)
	}

	It("agrees with leaseguard.Check on every case, for a user who is not the manager and for the manager", func() {
		acquire(ns, "holder", "guarded", "W1", 3600)
		for _, tc := range cases {
			old, updated, apiErr := run(k8s, tc)
			op := leaseguard.Update
			if tc.delete {
				op, updated = leaseguard.Delete, nil
			}
			goErr := leaseguard.Check(leaseguard.Request{Op: op, Old: old, New: updated})
			if goErr == nil {
				Expect(apiErr).NotTo(HaveOccurred(), "%s: the policy denied what Check allows", tc.name)
			} else {
				Expect(apiErr).To(HaveOccurred(), "%s: the policy allowed what Check denies (%v)", tc.name, goErr)
				Expect(apiErr.Error()).To(ContainSubstring(goErr.Error()), tc.name)
				Expect(apiErr.Error()).To(ContainSubstring("fencekeeper-managed-lease-guard"), tc.name)
			}

			_, _, managerErr := run(asManager, tc)
			Expect(managerErr).NotTo(HaveOccurred(), "%s: the manager (%s) was denied", tc.name, envtestutil.ManagerUser)
			Expect(leaseguard.Check(leaseguard.Request{Op: op, IsManager: true, Old: old, New: updated})).To(Succeed(), tc.name)
		}
		By("the denials are real, not only dry runs: a real tamper is refused and the Lease is unchanged")
		var l coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "guarded"}, &l)).To(Succeed())
		before := l.DeepCopy()
		l.Annotations[fkv1.AnnotationEpoch] = "9223372036854775807"
		Expect(k8s.Update(ctx, &l)).NotTo(Succeed())
		Expect(k8s.Delete(ctx, before.DeepCopy())).NotTo(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "guarded"}, &l)).To(Succeed())
		Expect(l.ResourceVersion).To(Equal(before.ResourceVersion))
		Expect(l.Annotations).To(Equal(before.Annotations))
		Expect(l.Finalizers).To(ContainElement(fkv1.LeaseFinalizer))
	})

	It("refuses anyone but the manager creating a managed Lease or adding the label, and agrees with Check", func() {
		forged := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unused-lock",
			Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: "unused-lock"},
			Annotations: map[string]string{fkv1.AnnotationEpoch: "9223372036854775807", fkv1.AnnotationClaimUID: "mine"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("mallory")}}
		err := k8s.Create(ctx, forged.DeepCopy())
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(leaseguard.Check(leaseguard.Request{Op: leaseguard.Create, New: forged}).Error()))
		Expect(asManager.Create(ctx, forged.DeepCopy(), client.DryRunAll)).To(Succeed())

		plain := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "another-lock"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a")}}
		Expect(k8s.Create(ctx, plain)).To(Succeed())
		old := plain.DeepCopy()
		plain.Labels = map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue}
		Expect(leaseguard.Check(leaseguard.Request{Op: leaseguard.Update, Old: old, New: plain})).NotTo(Succeed())
		Expect(k8s.Update(ctx, plain)).NotTo(Succeed())
	})

	It("lets a terminating namespace's managed Lease be deleted (namespace deletion finishes)", func() {
		acquire(ns, "holder", "doomed", "W1", 3600)
		var l coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "doomed"}, &l)).To(Succeed())
		Expect(k8s.Delete(ctx, l.DeepCopy(), client.DryRunAll)).NotTo(Succeed(), "not while the namespace lives")
		// envtest runs no namespace controller: mark the namespace for
		// deletion and send the delete the namespace controller would.
		Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Expect(leaseguard.Check(leaseguard.Request{Op: leaseguard.Delete, Old: &l, NamespaceTerminating: true})).To(Succeed())
		Eventually(func() error { return k8s.Delete(ctx, l.DeepCopy()) }, 10*time.Second).Should(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "doomed"}, &l)).To(Succeed())
		Expect(l.DeletionTimestamp).NotTo(BeNil(), "deleted; the finalizer waits for the manager")
	})

	It("leaves Leases fencekeeper does not manage alone", func() {
		plain := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a")}}
		Expect(k8s.Create(ctx, plain)).To(Succeed())
		old := plain.DeepCopy()
		plain.Spec.HolderIdentity = ptr.To("b")
		Expect(leaseguard.Check(leaseguard.Request{Op: leaseguard.Update, Old: old, New: plain})).To(Succeed())
		Expect(k8s.Update(ctx, plain)).To(Succeed())
		Expect(k8s.Delete(ctx, plain)).To(Succeed())
	})

	It("keeps a real holder's renewals working while it stops tampering", func() {
		held := acquire(ns, "holder", "renewed", "W1", 3600)
		var l coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "renewed"}, &l)).To(Succeed())
		Expect(l.Annotations[fkv1.AnnotationClaimUID]).To(Equal(string(held.UID)))
		now := metav1.NewMicroTime(time.Now().Add(time.Second))
		l.Spec.RenewTime = &now
		Expect(k8s.Update(ctx, &l)).To(Succeed())
		l.Annotations[fkv1.AnnotationEpoch] = "0"
		Expect(k8s.Update(ctx, &l)).NotTo(Succeed())
	})
})

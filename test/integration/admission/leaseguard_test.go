package admission_test

import (
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
		// holderDenied: the holder's own identity must be refused too
		// (not only another user).
		holderDenied bool
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
		{name: "renewTime set to the end of time", mutate: func(l *coordinationv1.Lease) {
			t := metav1.NewMicroTime(time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC))
			l.Spec.RenewTime = &t
		}},
		{name: "an owner that does not exist added with a renewal", mutate: func(l *coordinationv1.Lease) {
			l.OwnerReferences = append(l.OwnerReferences, ghostOwner())
			l.Spec.RenewTime = later(l, time.Second)
		}},
		{name: "delete", delete: true},
		// The Lease's list of timed-out claims decides who may be
		// granted: a holder that listed a waiter would end its wait, one
		// that emptied the list would make a timed-out claim grantable.
		{name: "a waiter listed as timed out, with a renewal", holderDenied: true, mutate: func(l *coordinationv1.Lease) {
			l.Annotations[fkv1.AnnotationTimedOutClaims] = "w2/0f0e0d0c-0000-4000-8000-000000000002"
			l.Spec.RenewTime = later(l, time.Second)
		}},
		{name: "an empty timed-out list added, with a renewal", holderDenied: true, mutate: func(l *coordinationv1.Lease) {
			l.Annotations[fkv1.AnnotationTimedOutClaims] = ""
			l.Spec.RenewTime = later(l, time.Second)
		}},
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

	It("agrees with leaseguard.Check on every case, for the holder's identity, another user and the manager", func() {
		acquire(ns, "holder", "guarded", "W1", 3600)
		var granted coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "guarded"}, &granted)).To(Succeed())
		holderUser := granted.Annotations[fkv1.AnnotationHolderUser]
		Expect(holderUser).NotTo(BeEmpty(), "the claim was created by a user, so its Lease records one")
		for _, tc := range cases {
			for _, who := range []struct {
				user string
				c    client.Client
			}{{holderUser, k8s}, {"mallory", userClient("mallory")}} {
				old, updated, apiErr := run(who.c, tc)
				op := leaseguard.Update
				if tc.delete {
					op, updated = leaseguard.Delete, nil
				}
				goErr := leaseguard.Check(leaseguard.Request{Op: op, User: who.user, Old: old, New: updated})
				if goErr == nil {
					Expect(apiErr).NotTo(HaveOccurred(), "%s by %s: the policy denied what Check allows", tc.name, who.user)
				} else {
					Expect(apiErr).To(HaveOccurred(), "%s by %s: the policy allowed what Check denies (%v)", tc.name, who.user, goErr)
					Expect(apiErr.Error()).To(ContainSubstring(goErr.Error()), "%s by %s", tc.name, who.user)
					Expect(apiErr.Error()).To(ContainSubstring("fencekeeper-managed-lease-guard"), tc.name)
				}
				if who.user == "mallory" {
					Expect(goErr).To(HaveOccurred(), "%s: another user may change nothing", tc.name)
				}
				if tc.holderDenied {
					Expect(apiErr).To(HaveOccurred(), "%s by %s: allowed", tc.name, who.user)
				}
			}

			old, updated, managerErr := run(asManager, tc)
			Expect(managerErr).NotTo(HaveOccurred(), "%s: the manager (%s) was denied", tc.name, envtestutil.ManagerUser)
			op := leaseguard.Update
			if tc.delete {
				op, updated = leaseguard.Delete, nil
			}
			Expect(leaseguard.Check(leaseguard.Request{Op: op, IsManager: true, User: envtestutil.ManagerUser, Old: old, New: updated})).To(Succeed(), tc.name)
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

// ghostOwner is an owner reference to an object that does not exist: the
// garbage collector would retry, forever, a delete of the Lease the guard
// refuses.
func ghostOwner() metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "ghost", UID: "00000000-0000-0000-0000-00000000dead"}
}

var _ = Describe("Managed-Lease guard: ownerReferences and who renews", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	getLease := func(name string) *coordinationv1.Lease {
		var l coordinationv1.Lease
		ExpectWithOffset(1, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l)).To(Succeed())
		return &l
	}
	// update is a read-modify-write of the Lease by c.
	update := func(c client.Client, name string, mutate func(*coordinationv1.Lease)) error {
		l := getLease(name)
		mutate(l)
		return c.Update(ctx, l)
	}
	renewTo := func(t time.Time) func(*coordinationv1.Lease) {
		return func(l *coordinationv1.Lease) { rt := metav1.NewMicroTime(t); l.Spec.RenewTime = &rt }
	}
	renew := func(l *coordinationv1.Lease) { renewTo(l.Spec.RenewTime.Add(time.Second))(l) }
	endOfTime := time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	refused := func(err error, why string) {
		ExpectWithOffset(1, err).To(HaveOccurred())
		ExpectWithOffset(1, apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		ExpectWithOffset(1, err.Error()).To(ContainSubstring("fencekeeper-managed-lease-guard"))
		ExpectWithOffset(1, err.Error()).To(ContainSubstring(why))
	}
	mergePatch := func(c client.Client, name, patch string) error {
		return c.Patch(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
			client.RawPatch(types.MergePatchType, []byte(patch)))
	}
	const ownersRule = "only the fencekeeper manager may add, remove or change the ownerReferences of a managed Lease"

	It("lets nobody but the manager add, change or remove an ownerReference of a managed Lease", func() {
		m := startManager()
		acquire(ns, "holder", "owned", "W1", 3600)
		// The authority is stopped: the Lease changes only as this test says.
		Expect(m.Stop()).To(Succeed())
		mallory := userClient("mallory")
		owner := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "real-owner"}}
		Expect(k8s.Create(ctx, owner)).To(Succeed())
		realOwner := metav1.OwnerReference{APIVersion: "v1", Kind: "ServiceAccount", Name: owner.Name, UID: owner.UID}
		before := getLease("owned")

		By("the holder's own identity and another user cannot add an owner, with or without a renewal, nor by a merge patch")
		refused(update(k8s, "owned", func(l *coordinationv1.Lease) {
			l.OwnerReferences = []metav1.OwnerReference{ghostOwner()}
			renew(l)
		}), ownersRule)
		refused(update(k8s, "owned", func(l *coordinationv1.Lease) {
			o := realOwner
			o.BlockOwnerDeletion = ptr.To(true)
			l.OwnerReferences = []metav1.OwnerReference{o}
			renew(l)
		}), ownersRule)
		refused(update(mallory, "owned", func(l *coordinationv1.Lease) { l.OwnerReferences = []metav1.OwnerReference{ghostOwner()} }), ownersRule)
		refused(mergePatch(mallory, "owned", `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"ghost","uid":"`+
			string(ghostOwner().UID)+`"}]}}`), ownersRule)
		Expect(getLease("owned").ResourceVersion).To(Equal(before.ResourceVersion), "nothing was written")

		By("the manager can add one")
		Expect(update(asManager, "owned", func(l *coordinationv1.Lease) { l.OwnerReferences = []metav1.OwnerReference{realOwner} })).To(Succeed())
		owned := getLease("owned")
		Expect(owned.OwnerReferences).To(Equal([]metav1.OwnerReference{realOwner}))

		By("nobody else can change its uid, make it block its owner's deletion, or remove it")
		refused(update(k8s, "owned", func(l *coordinationv1.Lease) {
			l.OwnerReferences[0].UID = ghostOwner().UID
			renew(l)
		}), ownersRule)
		refused(update(k8s, "owned", func(l *coordinationv1.Lease) {
			l.OwnerReferences[0].BlockOwnerDeletion = ptr.To(true)
			renew(l)
		}), ownersRule)
		refused(update(k8s, "owned", func(l *coordinationv1.Lease) {
			l.OwnerReferences = nil
			renew(l)
		}), ownersRule)
		refused(update(mallory, "owned", func(l *coordinationv1.Lease) { l.OwnerReferences[0].UID = ghostOwner().UID }), ownersRule)
		refused(update(mallory, "owned", func(l *coordinationv1.Lease) { l.OwnerReferences = nil }), ownersRule)
		refused(mergePatch(mallory, "owned", `{"metadata":{"ownerReferences":null}}`), ownersRule)
		Expect(getLease("owned").ResourceVersion).To(Equal(owned.ResourceVersion), "nothing was written")

		By("the manager can change and remove it")
		Expect(update(asManager, "owned", func(l *coordinationv1.Lease) { l.OwnerReferences[0].BlockOwnerDeletion = ptr.To(true) })).To(Succeed())
		Expect(update(asManager, "owned", func(l *coordinationv1.Lease) { l.OwnerReferences = nil })).To(Succeed())
		Expect(getLease("owned").OwnerReferences).To(BeEmpty())
		By("and the holder still renews")
		Expect(update(k8s, "owned", renew)).To(Succeed())
	})

	It("accepts a renewal only from the holder's bound user or the manager", func() {
		m := startManager()
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })
		acquire(ns, "holder", "renewed", "W1", 3600)
		granted := getLease("renewed")
		holderUser := granted.Annotations[fkv1.AnnotationHolderUser]
		Expect(holderUser).NotTo(BeEmpty())
		mallory := userClient("mallory")
		notHolder := `only the holder's bound identity may renew managed Lease renewed (user "` + holderUser +
			`"), but this request comes from user "mallory"`

		By("another user who may update Leases cannot set renewTime: not to the end of time, not by a second, not by a merge patch")
		refused(update(mallory, "renewed", renewTo(endOfTime)), notHolder)
		refused(update(mallory, "renewed", renew), notHolder)
		refused(mergePatch(mallory, "renewed", `{"spec":{"renewTime":"9999-12-31T23:59:59.000000Z"}}`), notHolder)
		Expect(getLease("renewed").ResourceVersion).To(Equal(granted.ResourceVersion), "nothing was written")

		By("the holder's bound user renews; so does the manager")
		Expect(update(k8s, "renewed", renew)).To(Succeed())
		Expect(update(asManager, "renewed", renew)).To(Succeed())
		Expect(getLease("renewed").Spec.RenewTime.Time).To(BeTemporally(">", granted.Spec.RenewTime.Time))
	})

	It("accepts a permit's renewal only from its holder's bound user or the manager, and lets nobody else end or edit it", func() {
		m := startManager()
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })
		c := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "loader"},
			Spec: fkv1.FencedLeaseSpec{LockName: "loaders", HolderIdentity: "L1", LeaseDurationSeconds: ptr.To(int32(3600)), MaxHolders: ptr.To(int32(3))}}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		epoch := waitPhase(c, fkv1.PhaseHeld).Status.Epoch
		name := fkv1.PermitLeaseName("loaders", epoch)
		var granted *coordinationv1.Lease
		Eventually(func() error {
			var l coordinationv1.Lease
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l)
			granted = &l
			return err
		}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
		holderUser := granted.Annotations[fkv1.AnnotationHolderUser]
		Expect(holderUser).NotTo(BeEmpty())
		mallory := userClient("mallory")
		notHolder := `only the holder's bound identity may renew managed Lease ` + name + ` (user "` + holderUser +
			`"), but this request comes from user "mallory"`

		By("another user cannot renew the permit, delete its Lease, or edit the lock's permit entries")
		refused(update(mallory, name, renewTo(endOfTime)), notHolder)
		refused(mergePatch(mallory, name, `{"spec":{"renewTime":"9999-12-31T23:59:59.000000Z"}}`), notHolder)
		Expect(mallory.Delete(ctx, granted.DeepCopy())).NotTo(Succeed())
		refused(mergePatch(mallory, "loaders", `{"metadata":{"annotations":{"fencekeeper.io/permit-1":"{\"claim\":\"x\",\"uid\":\"y\"}"}}}`),
			"only the fencekeeper manager may change the annotations")
		refused(mergePatch(k8s, "loaders", `{"metadata":{"annotations":{"fencekeeper.io/max-holders":"50"}}}`),
			"only the fencekeeper manager may change the annotations")
		Expect(getLease(name).ResourceVersion).To(Equal(granted.ResourceVersion), "nothing was written")

		By("the holder's bound user renews its permit")
		Expect(update(k8s, name, renew)).To(Succeed())
		Expect(getLease(name).Spec.RenewTime.Time).To(BeTemporally(">", granted.Spec.RenewTime.Time))
	})

	It("binds renewals of a hold made with a pod's token to that pod", func() {
		m := startManager()
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })
		workerAccount(ns)
		pod := func(name string) *corev1.Pod {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: corev1.PodSpec{ServiceAccountName: "worker", Containers: []corev1.Container{{Name: "app", Image: "example.com/app"}}}}
			Expect(k8s.Create(ctx, p)).To(Succeed())
			return p
		}
		holder, other := pod("worker-0"), pod("worker-1")
		claim := newClaimObj(ns, "w1", "pod-bound", "W1", 3600)
		Expect(asPod(holder).Create(ctx, claim)).To(Succeed())
		waitPhase(claim, fkv1.PhaseHeld)
		granted := getLease("pod-bound")
		Expect(granted.Annotations).To(HaveKeyWithValue(fkv1.AnnotationHolderPodUID, string(holder.UID)))
		sa := granted.Annotations[fkv1.AnnotationHolderUser]
		Expect(sa).To(Equal("system:serviceaccount:" + ns + ":worker"))

		By("the same ServiceAccount with a token bound to another pod cannot renew, nor can an admin")
		refused(update(asPod(other), "pod-bound", renew), `(user "`+sa+`" with a token bound to pod `+string(holder.UID)+
			`), but this request comes from user "`+sa+`" with a token bound to pod `+string(other.UID))
		refused(update(k8s, "pod-bound", renew), "only the holder's bound identity may renew managed Lease pod-bound")
		Expect(getLease("pod-bound").ResourceVersion).To(Equal(granted.ResourceVersion), "nothing was written")
		By("the holder's pod renews")
		Expect(update(asPod(holder), "pod-bound", renew)).To(Succeed())
	})

	const noUser = "only the fencekeeper manager may renew managed Lease "

	It("lets nobody but the manager renew a hold whose Lease records no holder user (granted before identity binding)", func() {
		m := startManager()
		acquire(ns, "holder", "old-grant", "W1", 3600)
		Expect(m.Stop()).To(Succeed())
		By("the Lease as a manager older than identity binding wrote it: no holder user")
		Expect(update(asManager, "old-grant", func(l *coordinationv1.Lease) {
			delete(l.Annotations, fkv1.AnnotationHolderUser)
			delete(l.Annotations, fkv1.AnnotationHolderPodUID)
		})).To(Succeed())
		before := getLease("old-grant")

		By("the user who created the holder's claim cannot renew it, nor can anyone else")
		refused(update(k8s, "old-grant", renew), noUser+"old-grant: it records no holder user")
		refused(update(userClient("mallory"), "old-grant", renewTo(endOfTime)), noUser+"old-grant: it records no holder user")
		Expect(getLease("old-grant").ResourceVersion).To(Equal(before.ResourceVersion), "nothing was written")
		By("the manager can")
		Expect(update(asManager, "old-grant", renew)).To(Succeed())
	})

	It("lets nobody but the manager renew a pod-held Lease (it records a pod, no holder user)", func() {
		m := startManager()
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })
		workerAccount(ns)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker-0", Annotations: map[string]string{fkv1.AnnotationLease: "pod-held"}},
			Spec: corev1.PodSpec{ServiceAccountName: "worker", Containers: []corev1.Container{{Name: "app", Image: "example.com/app"}}}}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		// Play the kubelet: Running with its containers ready.
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		Expect(k8s.Status().Update(ctx, p)).To(Succeed())
		var granted coordinationv1.Lease
		Eventually(func() map[string]string {
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pod-held"}, &granted); err != nil {
				return nil
			}
			return granted.Annotations
		}, 30*time.Second).Should(HaveKeyWithValue(fkv1.AnnotationHolderPodUID, string(p.UID)))
		Expect(granted.Annotations).NotTo(HaveKey(fkv1.AnnotationHolderUser))

		By("the pod's own token cannot renew it")
		refused(update(asPod(p), "pod-held", renew), noUser+"pod-held: it records no holder user")
		By("the manager can")
		Expect(update(asManager, "pod-held", renew)).To(Succeed())
	})
})

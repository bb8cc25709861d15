package celmode_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// CEL mode does not admit writes to objects of semaphore locks (docs/design.md
// §9, docs/fencing.md): the fencing policy refuses every content write and
// delete of an object whose lock's Lease records fencekeeper.io/max-holders,
// before any other rule could accept it. The Leases are written by hand as
// the manager (this bed runs no lock authority): first a mutex held by the
// manager's identity, under which the objects are written, then the same
// lock as a semaphore of 3 with live permits 4 and 5, as the authority
// records one.
var _ = Describe("CEL mode and semaphore locks", func() {
	It("refuses every content write and delete of an object whose lock is a semaphore", func() {
		b := startBed(0)
		ctx := context.Background()
		ns := b.namespace()
		const lock = "warehouse"
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock,
				Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock},
				Annotations: map[string]string{fkv1.AnnotationEpoch: "3", fkv1.AnnotationClaim: "w", fkv1.AnnotationClaimUID: "uid-w",
					fkv1.AnnotationHolderUser: envtestutil.ManagerUser}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("w"), LeaseDurationSeconds: ptr.To(int32(3600))},
		}
		Expect(b.manager.Create(ctx, lease)).To(Succeed())

		By("under the mutex, the holder writes the objects: one plain, one marked for deletion, one monotonic that accepts any identity")
		objects := map[string]map[string]string{
			"report": {},
			"marked": {fkv1.AnnotationDeleteEpoch: "3"},
			"mono":   {fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic, fkv1.AnnotationFenceIdentity: fkv1.FenceIdentityAny},
		}
		for name, extra := range objects {
			ann := map[string]string{fkv1.AnnotationEpoch: "3"}
			for k, v := range extra {
				ann[k] = v
			}
			var last error
			// The bindings of a new lock come once proven in force.
			if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
				last = b.manager.Create(ctx, configMap(ns, name, lock, ann))
				return last == nil, nil
			}); err != nil {
				Fail(fmt.Sprintf("the holder of epoch 3 could not create %s: %v", name, last))
			}
		}

		By("the lock becomes a semaphore of 3 with live permits 4 and 5 (no holder annotations)")
		Expect(b.manager.Get(ctx, client.ObjectKeyFromObject(lease), lease)).To(Succeed())
		for _, k := range []string{fkv1.AnnotationClaim, fkv1.AnnotationClaimUID, fkv1.AnnotationHolderUser} {
			delete(lease.Annotations, k)
		}
		lease.Spec.HolderIdentity = nil
		lease.Annotations[fkv1.AnnotationEpoch] = "5"
		lease.Annotations[fkv1.AnnotationMaxHolders] = "3"
		for _, e := range []string{"4", "5"} {
			lease.Annotations[fkv1.AnnotationPermitPrefix+e] = fmt.Sprintf(`{"claim":"p%s","uid":"uid-p%s","holder":"p%s","user":%q,"ttl":3600}`, e, e, e, envtestutil.ManagerUser)
		}
		Expect(b.manager.Update(ctx, lease)).To(Succeed())
		ledger := fkv1.ReadLedger(lease, lock)
		Expect(ledger.IsSemaphore()).To(BeTrue())
		Expect(ledger.Permits).To(HaveLen(2))

		update := func(name string, epoch string, mutate func(*corev1.ConfigMap)) error {
			var cm corev1.ConfigMap
			if err := b.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm); err != nil {
				return err
			}
			if epoch != "" {
				cm.Annotations[fkv1.AnnotationEpoch] = epoch
			}
			if mutate != nil {
				mutate(&cm)
			}
			return b.manager.Update(ctx, &cm)
		}
		newData := func(cm *corev1.ConfigMap) { cm.Data = map[string]string{"report": "v2"} }
		// The apiserver's parameter cache trails the Lease update: wait
		// until it shows counter 5 (epoch 5 is no longer from the future).
		var last error
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			last = b.manager.Create(ctx, configMap(ns, "new", lock, map[string]string{fkv1.AnnotationEpoch: "5"}), client.DryRunAll)
			return reasonOf(last) != fkv1.AdmissionFutureEpoch, nil
		}); err != nil {
			Fail(fmt.Sprintf("the apiserver never saw the semaphore's counter: %v", last))
		}

		for what, write := range map[string]func() error{
			"a create presenting a live permit's epoch": func() error {
				return b.manager.Create(ctx, configMap(ns, "new", lock, map[string]string{fkv1.AnnotationEpoch: "5"}))
			},
			"an update presenting a live permit's epoch":    func() error { return update("report", "5", newData) },
			"an update presenting an epoch no permit holds": func() error { return update("report", "3", newData) },
			// Without the refusal, monotonic with fence-identity any accepts
			// any epoch up to the counter: rules 1-3 alone.
			"an update under monotonic presenting an old epoch":          func() error { return update("mono", "3", newData) },
			"an update under monotonic presenting a live permit's epoch": func() error { return update("mono", "4", newData) },
			"a delete marked by the holder of the mutex": func() error {
				return b.manager.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "marked"}})
			},
		} {
			err := write()
			Expect(reasonOf(err)).To(Equal(fkv1.AdmissionSemaphoreNotSupported), "%s: %v", what, err)
			var se apierrors.APIStatus
			Expect(errors.As(err, &se)).To(BeTrue())
			Expect(se.Status().Code).To(Equal(int32(http.StatusForbidden)), "%s", what)
			Expect(strings.Contains(se.Status().Message, "CEL mode does not admit writes to objects of semaphore locks") &&
				strings.Contains(se.Status().Message, "use webhook mode")).To(BeTrue(), "%s: message %q", what, se.Status().Message)
		}
		var mono corev1.ConfigMap
		Expect(b.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mono"}, &mono)).To(Succeed())
		Expect(mono.Data["report"]).To(Equal("v"), "a write under monotonic was stored")
		Expect(mono.Annotations[fkv1.AnnotationFencedEpoch]).To(Equal("3"))

		By("metadata-only maintenance still passes")
		Expect(update("report", "", func(cm *corev1.ConfigMap) { cm.Labels["team"] = "x" })).To(Succeed())
	})
})

// A lock may be named like a semaphore permit's renewal Lease
// (<lock>-permit-<epoch>, fkv1.PermitLeaseName): lock x-permit-7's per-lock
// bindings then take, in a namespace where lock x is a semaphore with live
// permit 7, that permit's Lease as their parameter. It carries the
// epoch, claim and holder annotations of a held ledger, but it is no
// ledger of lock x-permit-7: its permit-epoch label marks it, and its lock
// label names x. The fencing policy must not accept epoch 7 from the
// permit's holder there. Lock x-permit-7 is also granted for real in
// another namespace, which is what brings its bindings (the mutating one
// only comes where a Lease of that name is labelled with that lock), and
// its holder's writes there are accepted all along.
var _ = Describe("CEL mode and a lock named like a semaphore permit's Lease", func() {
	It("does not take a permit's renewal Lease as the ledger of the lock it is named like", func() {
		b := startBed(0)
		ctx := context.Background()
		const (
			semaphore = "x"
			lock      = "x-permit-7"
		)
		Expect(fkv1.PermitLeaseName(semaphore, 7)).To(Equal(lock))
		granted, permitNS := b.namespace(), b.namespace()

		By("before lock " + lock + " has bindings, a ConfigMap of that lock is created where lock " + semaphore + " will hold permit 7")
		Expect(b.admin.Create(ctx, configMap(permitNS, "target", lock, nil))).To(Succeed())

		By("permit 7 of semaphore " + semaphore + ": its renewal Lease " + lock + ", as the authority writes it, held by the manager's identity")
		permit := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: permitNS, Name: lock,
				Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: semaphore, fkv1.LabelPermitEpoch: "7"},
				Annotations: map[string]string{fkv1.AnnotationEpoch: "7", fkv1.AnnotationClaim: "p7", fkv1.AnnotationClaimUID: "uid-p7",
					fkv1.AnnotationHolderUser: envtestutil.ManagerUser}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("p7"), LeaseDurationSeconds: ptr.To(int32(3600)),
				AcquireTime: ptr.To(metav1.NowMicro()), RenewTime: ptr.To(metav1.NowMicro())},
		}
		Expect(b.manager.Create(ctx, permit)).To(Succeed())
		of, isPermit := fkv1.IsPermitLease(permit)
		Expect(isPermit).To(BeTrue())
		Expect(of).To(Equal(semaphore))

		By("lock " + lock + " is granted for real in another namespace: held by the manager's identity at epoch 2")
		Expect(b.manager.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: granted, Name: lock,
				Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock},
				Annotations: map[string]string{fkv1.AnnotationEpoch: "2", fkv1.AnnotationClaim: "r", fkv1.AnnotationClaimUID: "uid-r",
					fkv1.AnnotationHolderUser: envtestutil.ManagerUser}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("r"), LeaseDurationSeconds: ptr.To(int32(3600))},
		})).To(Succeed())

		By("the bindings of lock " + lock + " exist, take the Lease named " + lock + " as their parameter, and the mutating one records its proof")
		key := client.ObjectKey{Name: celmode.BindingName(lock)}
		var v admissionregistrationv1.ValidatingAdmissionPolicyBinding
		var m admissionregistrationv1.MutatingAdmissionPolicyBinding
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			return b.admin.Get(ctx, key, &m) == nil, nil
		}); err != nil {
			Fail(fmt.Sprintf("lock %s was never bound", lock))
		}
		Expect(b.admin.Get(ctx, key, &v)).To(Succeed())
		Expect(v.Spec.ParamRef).NotTo(BeNil())
		Expect(v.Spec.ParamRef.Name).To(Equal(lock))
		Expect(m.Spec.ParamRef).NotTo(BeNil())
		Expect(m.Spec.ParamRef.Name).To(Equal(lock))
		Expect(m.Annotations[celmode.ProvenAnnotation]).To(Equal(string(v.UID)))

		By("both bindings are in force where the permit's Lease is the parameter: a malformed watermark is removed by the mutating one, then refused by the fencing one")
		var last fkv1.AdmissionReason
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			last = b.probe(ctx, permitNS, lock, map[string]string{fkv1.AnnotationFencedEpoch: "0"})
			return last == fkv1.AdmissionMissingEpoch, nil
		}); err != nil {
			Fail(fmt.Sprintf("lock %s: the bindings are not in force in %s: a probe got %q", lock, permitNS, last))
		}

		legit := func(i int) {
			GinkgoHelper()
			name := fmt.Sprintf("legit-%d", i)
			var err error
			// The first write waits for the apiserver to load the mutating
			// binding's parameter here (until then the token is unconsumed).
			if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				err = b.manager.Create(ctx, configMap(granted, name, lock, map[string]string{fkv1.AnnotationEpoch: "2"}))
				return err == nil, nil
			}); err != nil {
				Fail(fmt.Sprintf("the holder of lock %s/%s could not create %s at epoch 2: %v", granted, lock, name, err))
			}
			var cm corev1.ConfigMap
			Expect(b.manager.Get(ctx, client.ObjectKey{Namespace: granted, Name: name}, &cm)).To(Succeed())
			Expect(cm.Annotations[fkv1.AnnotationFencedEpoch]).To(Equal("2"))
			cm.Annotations[fkv1.AnnotationEpoch] = "2"
			cm.Data = map[string]string{"report": "v2"}
			Expect(b.manager.Update(ctx, &cm)).To(Succeed(), "the holder of lock %s/%s updating %s at epoch 2", granted, lock, name)
		}
		legit(0)

		By("the permit's holder presents epoch 7 for lock " + lock + " where the parameter is the permit's Lease: refused, as no epoch of that lock was issued there")
		refusedByLedger := func(what string, err error) {
			GinkgoHelper()
			Expect(err).To(HaveOccurred(), "%s was accepted: the permit's Lease was read as the ledger of lock %s", what, lock)
			Expect(reasonOf(err)).To(Equal(fkv1.AdmissionFutureEpoch), "%s: %v", what, err)
			var se apierrors.APIStatus
			Expect(errors.As(err, &se)).To(BeTrue())
			Expect(se.Status().Code).To(Equal(int32(http.StatusForbidden)), "%s", what)
			msg := se.Status().Message
			// The fencing binding's refusal (the token was consumed, so the
			// mutating binding ran), for want of a ledger: not the base
			// policy's unconsumed token.
			want := fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: fencekeeper.io/FutureEpoch: epoch 7 for lock %s/%s was never issued: no epoch was ever issued for it",
				celmode.PolicyName, celmode.BindingName(lock), permitNS, lock)
			Expect(msg).To(ContainSubstring(want), "%s", what)
			Expect(msg).NotTo(ContainSubstring("the lock has no Lease in this namespace"), "%s", what)
		}
		refusedByLedger("a create presenting the permit's epoch",
			b.manager.Create(ctx, configMap(permitNS, "forged", lock, map[string]string{fkv1.AnnotationEpoch: "7"})))
		legit(1)
		var target corev1.ConfigMap
		Expect(b.admin.Get(ctx, client.ObjectKey{Namespace: permitNS, Name: "target"}, &target)).To(Succeed())
		if target.Annotations == nil {
			target.Annotations = map[string]string{}
		}
		target.Annotations[fkv1.AnnotationEpoch] = "7"
		target.Data = map[string]string{"report": "v2"}
		refusedByLedger("an update presenting the permit's epoch", b.manager.Update(ctx, &target))
		legit(2)

		Expect(b.admin.Get(ctx, client.ObjectKey{Namespace: permitNS, Name: "target"}, &target)).To(Succeed())
		Expect(target.Data["report"]).To(Equal("v"))
		Expect(target.Annotations).NotTo(HaveKey(fkv1.AnnotationFencedEpoch))
		err := b.admin.Get(ctx, client.ObjectKey{Namespace: permitNS, Name: "forged"}, &corev1.ConfigMap{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "forged: %v", err)
	})
})

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
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
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

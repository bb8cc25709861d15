package admission_test

import (
	"errors"
	"strconv"
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
)

// Semaphore locks at the protected object (docs/design.md §3, §9): the
// holders of one semaphore's permits write concurrently, and a write is
// accepted only while a live permit holds its epoch. A holder paused past
// its TTL wakes after its permit was given away, and every way it tries to
// write is refused; the object's watched history shows no version with its
// epoch after the Lease version that ended its permit.
var _ = Describe("Fencing a semaphore lock", func() {
	var (
		ns  string
		mgr *envtestutil.Manager
	)
	BeforeEach(func() {
		ns = newNamespace()
		mgr = startManager()
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
	})

	acquirePermit := func(name, lock string, n, ttl int32) *fkv1.FencedLease {
		c := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(ttl), MaxHolders: ptr.To(n)}}
		ExpectWithOffset(1, k8s.Create(ctx, c)).To(Succeed())
		return c
	}

	It("refuses a paused permit holder's every write once its permit is given away, while live permits write concurrently", func() {
		lock := "loaders"
		objects := watchConfigMaps(ns)
		DeferCleanup(objects.stop)
		leases := watchLeases(ns)
		DeferCleanup(leases.stop)

		a := waitPhase(acquirePermit("a", lock, 2, 2), fkv1.PhaseHeld) // never renews: it pauses
		b := waitPhase(acquirePermit("b", lock, 2, 300), fkv1.PhaseHeld)
		eA, eB := a.Status.Epoch, b.Status.Epoch
		Expect(eB).To(Equal(eA + 1))

		By("both permit holders write one object, in either order: no watermark order between them")
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "batch", lock, eB, "rows by B", nil))).To(Succeed())
		Expect(publish(ns, "batch", eA, "rows by A")).To(Succeed())
		var staleCopy corev1.ConfigMap // A's copy, read while its permit is live
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "batch"}, &staleCopy)).To(Succeed())
		Expect(publish(ns, "batch", eB, "more rows by B")).To(Succeed())

		By("another identity presenting a live permit's epoch is refused")
		err := publishAs(userClient("mallory"), ns, "batch", eB, "rows by mallory")
		Expect(err).To(HaveOccurred())
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(configMapData(ns, "batch")).To(Equal("more rows by B"))

		By("A pauses; its permit expires and C gets the freed permit with the next epoch")
		c := acquirePermit("c", lock, 2, 300)
		waitPhase(a, fkv1.PhaseExpired)
		eC := waitPhase(c, fkv1.PhaseHeld).Status.Epoch
		Expect(eC).To(Equal(eB + 1))
		Expect(publish(ns, "batch", eC, "rows by C")).To(Succeed())

		By("A wakes and writes with its old epoch, every way a write reaches the apiserver: all refused 403")
		refusedStale := func(err error) {
			GinkgoHelper()
			Expect(err).To(HaveOccurred())
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("stale epoch " + strconv.FormatInt(eA, 10)))
		}
		refusedStale(publish(ns, "batch", eA, "late rows by A"))
		target := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch"}}
		refusedStale(k8s.Patch(ctx, target, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"fencekeeper.io/epoch":"`+strconv.FormatInt(eA, 10)+`"}},"data":{"report.csv":"merge by A"}}`))))
		refusedStale(k8s.Patch(ctx, target, client.RawPatch(types.JSONPatchType,
			[]byte(`[{"op":"add","path":"/metadata/annotations/fencekeeper.io~1epoch","value":"`+strconv.FormatInt(eA, 10)+`"},{"op":"replace","path":"/data/report.csv","value":"json patch by A"}]`))))
		refusedStale(k8s.Patch(ctx, target, client.RawPatch(types.StrategicMergePatchType,
			[]byte(`{"metadata":{"annotations":{"fencekeeper.io/epoch":"`+strconv.FormatInt(eA, 10)+`"}},"data":{"report.csv":"strategic by A"}}`))))
		applied := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch", Labels: map[string]string{fkv1.LabelLock: lock},
				Annotations: map[string]string{fkv1.AnnotationEpoch: strconv.FormatInt(eA, 10)}},
			Data: map[string]string{"report.csv": "applied by A"}}
		refusedStale(k8s.Patch(ctx, applied, client.Apply, client.FieldOwner("worker-a"), client.ForceOwnership)) //nolint:staticcheck // server-side apply is a write path under test
		refusedStale(k8s.Create(ctx, fencedConfigMap(ns, "new-batch", lock, eA, "new object by A", nil)))
		fromStale := staleCopy.DeepCopy()
		fromStale.Annotations[fkv1.AnnotationEpoch] = strconv.FormatInt(eA, 10)
		fromStale.Data = map[string]string{"report.csv": "merge-from by A"}
		refusedStale(k8s.Patch(ctx, fromStale, client.MergeFrom(&staleCopy)))
		Expect(configMapData(ns, "batch")).To(Equal("rows by C"))

		By("a deletion mark with A's epoch is refused")
		err = k8s.Patch(ctx, target, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"fencekeeper.io/epoch":"`+strconv.FormatInt(eA, 10)+`","fencekeeper.io/delete-epoch":"`+strconv.FormatInt(eA, 10)+`"}}}`)))
		refusedStale(err)

		By("policy monotonic is refused on a semaphore's object, even with a live permit")
		for _, e := range []int64{eA, eB} {
			err := k8s.Patch(ctx, target, client.RawPatch(types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"fencekeeper.io/epoch":"`+strconv.FormatInt(e, 10)+`","fencekeeper.io/fence-policy":"monotonic"}},"data":{"report.csv":"monotonic"}}`)))
			Expect(err).To(HaveOccurred())
			var status apierrors.APIStatus
			Expect(errors.As(err, &status)).To(BeTrue())
			Expect(status.Status().Code).To(Equal(int32(422)), "%v", err)
			Expect(status.Status().Details).NotTo(BeNil())
			Expect(status.Status().Details.Causes).NotTo(BeEmpty())
			Expect(status.Status().Details.Causes[0].Type).To(BeEquivalentTo(fkv1.AdmissionInvalidPolicy.CauseType()))
		}
		Expect(configMapData(ns, "batch")).To(Equal("rows by C"))

		By("the object's history: no version accepted A's epoch after the Lease version that ended A's permit")
		var ended string
		Eventually(func() string {
			ended = permitEnded(leases, lock, eA)
			return ended
		}, 5*time.Second, 50*time.Millisecond).ShouldNot(BeEmpty())
		Eventually(objects.count, 5*time.Second).Should(BeNumerically(">=", 4))
		endRV, _ := strconv.ParseInt(ended, 10, 64)
		sawA := false
		for _, cm := range objects.versions("batch") {
			rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
			if cm.Annotations[fkv1.AnnotationFencedEpoch] == strconv.FormatInt(eA, 10) {
				sawA = true
				Expect(rv).To(BeNumerically("<", endRV), "version %d accepted epoch %d after its permit ended at %d", rv, eA, endRV)
			}
		}
		Expect(sawA).To(BeTrue(), "A's write while it held its permit is in the history: the check above had something to check")
	})
})

// leaseHistory records every version of a namespace's Leases.
type leaseHistory = history[coordinationv1.Lease]

func watchLeases(ns string) *leaseHistory {
	return watchAll[coordinationv1.Lease](ns, &coordinationv1.LeaseList{})
}

// permitEnded is the resourceVersion of the first version of lock's Lease
// that no longer lists the permit of epoch, after one that did ("" if none).
func permitEnded(h *leaseHistory, lock string, epoch int64) string {
	listed := false
	for _, l := range h.snapshot() {
		if l.Name != lock {
			continue
		}
		_, has := fkv1.ReadLedger(&l, lock).PermitOf(epoch)
		if has {
			listed = true
		} else if listed {
			return l.ResourceVersion
		}
	}
	return ""
}

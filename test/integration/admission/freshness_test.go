package admission_test

import (
	"context"
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook"
)

// The handler trusts its Lease cache only when the authority vouches for it.
// Here the cache is pinned to the Lease as it was before W2's grant (a cache
// that fell behind: a paused or partitioned replica), the live Lease is the
// real one, and the stale holder W1 presents its epoch.
var _ = Describe("Freshness of the current-epoch check", func() {
	var (
		ns, lock = "", "report-2026-07"
		w1, w2   *fkv1.FencedLease
		stale    coordinationv1.Lease
		req      admission.Request
	)
	BeforeEach(func() {
		ns = newNamespace()
		mgr := startManager()
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		w1 = acquire(ns, "w1", lock, "W1", 300)
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: lock}, &stale)).To(Succeed())
		release(w1)
		w2 = acquire(ns, "w2", lock, "W2", 300)

		old := fencedConfigMap(ns, lock, lock, 1, "v11 by W1", nil)
		delete(old.Annotations, fkv1.AnnotationEpoch)
		old.Annotations[fkv1.AnnotationFencedEpoch] = epochString(w1.Status.Epoch)
		obj := old.DeepCopy()
		obj.Annotations[fkv1.AnnotationEpoch] = epochString(w1.Status.Epoch)
		obj.Data["report.csv"] = "v11' by W1"
		req = admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "freshness", Operation: admissionv1.Update, Namespace: ns, Name: lock,
			UserInfo: authenticationv1.UserInfo{Username: "admin"},
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Object:   runtime.RawExtension{Raw: mustJSON(obj)}, OldObject: runtime.RawExtension{Raw: mustJSON(old)},
		}}
	})

	handle := func(a webhook.Authority) admission.Response {
		h := &webhook.FencingHandler{Cache: pinned{&stale}, APIReader: k8s, Authority: a}
		return h.Handle(ctx, req)
	}
	expectRefused := func(resp admission.Response) {
		ExpectWithOffset(1, resp.Allowed).To(BeFalse(), "a stale cache admitted W1: %+v", resp.Result)
		ExpectWithOffset(1, resp.Result.Details.Causes[0].Type).To(BeEquivalentTo(fkv1.AdmissionNotCurrentEpoch.CauseType()))
	}

	It("reads live when no authority runs in the process (a follower replica)", func() {
		expectRefused(handle(nil))
	})
	It("reads live when the holder's lease has lapsed on the authority's clock (a paused manager)", func() {
		expectRefused(handle(authority{held: w1.Status.Epoch, floor: w1.Status.Epoch, fresh: false}))
	})
	It("reads live when the authority has moved on to another holder", func() {
		expectRefused(handle(authority{held: w2.Status.Epoch, floor: w2.Status.Epoch, fresh: true}))
	})
	It("reads live when the authority issued an epoch the cache has not seen", func() {
		expectRefused(handle(authority{held: w1.Status.Epoch, floor: w2.Status.Epoch, fresh: true}))
	})
	It("uses the cache when the authority vouches for it (the documented window, pinned)", func() {
		// The authority still believes W1 holds, with time left: the cached
		// view is as fresh as the authority's, and the write is decided on it.
		resp := handle(authority{held: w1.Status.Epoch, floor: w1.Status.Epoch, fresh: true})
		Expect(resp.Allowed).To(BeTrue())
	})
})

type authority struct {
	held, floor int64
	fresh       bool
}

func (a authority) FreshView(types.NamespacedName) (int64, int64, bool) {
	return a.held, a.floor, a.fresh
}

// FreshPermits: these specs' locks are mutexes; no semaphore is vouched for.
func (a authority) FreshPermits(types.NamespacedName) ([]int64, int64, bool) {
	return nil, a.floor, false
}

// pinned is a Lease cache stuck at one version.
type pinned struct{ lease *coordinationv1.Lease }

func (p pinned) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	p.lease.DeepCopyInto(obj.(*coordinationv1.Lease))
	return nil
}

func (p pinned) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

func mustJSON(cm *corev1.ConfigMap) []byte {
	cm.APIVersion, cm.Kind = "v1", "ConfigMap"
	b, err := json.Marshal(cm)
	Expect(err).NotTo(HaveOccurred())
	return b
}

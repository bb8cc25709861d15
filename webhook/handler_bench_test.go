package webhook

import (
	"context"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// oneLease is a client.Reader that holds one Lease (the informer cache as
// the hot path sees it).
type oneLease struct{ l *coordinationv1.Lease }

func (o oneLease) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	o.l.DeepCopyInto(obj.(*coordinationv1.Lease))
	return nil
}

func (o oneLease) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

type vouching struct{ epoch int64 }

func (v vouching) FreshView(types.NamespacedName) (int64, int64, bool) { return v.epoch, v.epoch, true }

func (v vouching) FreshPermits(types.NamespacedName) ([]int64, int64, bool) {
	return nil, v.epoch, false
}

// BenchmarkGuardedUpdate is the handler's own cost for the bench's guarded
// ConfigMap update on the cached path (a vouched holder's accepted write).
func BenchmarkGuardedUpdate(b *testing.B) {
	const epoch = 4242
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "report"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("writer"), LeaseDurationSeconds: ptr.To(int32(3600))}}
	fkv1.Ledger{Exists: true, Epoch: epoch, EpochValid: true, HolderClaim: "writer", HolderUID: "uid-1", HolderUser: "admin"}.ApplyTo(lease, "report")
	h := &FencingHandler{Cache: oneLease{lease}, APIReader: oneLease{lease}, Authority: vouching{epoch}}
	cm := func(v string, ann map[string]string) runtime.RawExtension {
		raw, _ := json.Marshal(&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guarded", UID: "cm-uid", ResourceVersion: "1234",
				Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: ann},
			Data: map[string]string{"v": v}})
		return runtime.RawExtension{Raw: raw}
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Namespace: "ns", Name: "guarded", Operation: admissionv1.Update, UserInfo: authenticationv1.UserInfo{Username: "admin"},
		Object:    cm("2", map[string]string{fkv1.AnnotationEpoch: "4242", fkv1.AnnotationFencedEpoch: "4242"}),
		OldObject: cm("1", map[string]string{fkv1.AnnotationFencedEpoch: "4242"}),
	}}
	ctx := context.Background()
	if resp := h.Handle(ctx, req); !resp.Allowed || len(resp.Patches) == 0 {
		b.Fatalf("the holder's write was not admitted with its token consumed: %+v", resp)
	}
	b.ReportAllocs()
	for b.Loop() {
		h.Handle(ctx, req)
	}
}

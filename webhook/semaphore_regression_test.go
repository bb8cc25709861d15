package webhook

// Semaphore regressions at admission: interleavings that once got a stale
// write through, each a test that failed before its fix.

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

// leaseAndClaims is the informer cache as the handler reads it: one Lease,
// and the lock's claims (for the identity of an older mutex epoch).
type leaseAndClaims struct {
	lease  *coordinationv1.Lease
	claims []fkv1.FencedLease
}

func (c leaseAndClaims) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	c.lease.DeepCopyInto(obj.(*coordinationv1.Lease))
	return nil
}

func (c leaseAndClaims) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	if l, ok := list.(*fkv1.FencedLeaseList); ok {
		l.Items = append(l.Items, c.claims...)
	}
	return nil
}

// realAuthority answers as controllers/lock.Reconciler does for a lock
// that is now a semaphore: memory.view drops every view whose HeldEpoch is
// 0, so FreshView is (0, 0, false) and FreshPermits is never fresh.
type realAuthority struct{}

func (realAuthority) FreshView(types.NamespacedName) (int64, int64, bool) { return 0, 0, false }
func (realAuthority) FreshPermits(types.NamespacedName) ([]int64, int64, bool) {
	return nil, 0, false
}

func cmUpdate(lock, user, presented string, oldAnn map[string]string) admission.Request {
	cm := func(v string, ann map[string]string) runtime.RawExtension {
		raw, _ := json.Marshal(&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guarded", UID: "cm-uid", ResourceVersion: "1234",
				Labels: map[string]string{fkv1.LabelLock: lock}, Annotations: ann},
			Data: map[string]string{"v": v}})
		return runtime.RawExtension{Raw: raw}
	}
	newAnn := map[string]string{fkv1.AnnotationEpoch: presented}
	for k, v := range oldAnn {
		newAnn[k] = v
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Namespace: "ns", Name: "guarded", Operation: admissionv1.Update, UserInfo: authenticationv1.UserInfo{Username: user},
		Object:    cm("stale write", newAnn),
		OldObject: cm("1", oldAnn),
	}}
}

// Lock "report" was a mutex: holder henry (epoch 10) wrote the
// object, which carries fence-policy monotonic from the mutex era, and then
// paused past its TTL. The authority ended henry's hold (free mutex ledger,
// counter 10) and, on its next decision, granted a semaphore of 3 permits
// 11, 12, 13. This replica's Lease cache still shows the free mutex ledger.
// handler.vouched trusts a cached free mutex without vouching ("it admits
// nothing under policy current"), but under the object's stored monotonic
// policy rules 1-3 accept epoch 10 (>= watermark 10, <= cached counter 10),
// and the identity check finds henry's Expired claim with status epoch 10.
// The live Lease is a semaphore, where monotonic is refused and only a live
// permit's epoch is accepted (docs/design.md §3 "Objects of a semaphore
// lock"): henry's stale write must be refused.
func TestRegressionCachedFreeMutexAdmitsStaleEpochAtSemaphoreObject(t *testing.T) {
	cachedFree := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "report", UID: "lease-uid"}}
	fkv1.Ledger{Exists: true, Epoch: 10, EpochValid: true, PreviousUID: "uid-henry"}.ApplyTo(cachedFree, "report")
	liveSem := semaphoreLease(map[int64]string{11: "alice", 12: "bob", 13: "carol"})
	liveSem.Annotations[fkv1.AnnotationEpoch] = "13"

	henry := fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "henry", UID: "uid-henry",
		Annotations: map[string]string{fkv1.AnnotationCreatedBy: "henry"}},
		Spec:   fkv1.FencedLeaseSpec{LockName: "report", HolderIdentity: "henry"},
		Status: fkv1.FencedLeaseStatus{Phase: fkv1.PhaseExpired, Epoch: 10}}

	h := &FencingHandler{Cache: leaseAndClaims{lease: cachedFree, claims: []fkv1.FencedLease{henry}},
		APIReader: oneLease{liveSem}, Authority: realAuthority{}}
	resp := h.Handle(context.Background(), cmUpdate("report", "henry", "10",
		map[string]string{fkv1.AnnotationFencedEpoch: "10", fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic}))
	if resp.Allowed {
		t.Fatalf("henry's write presenting epoch 10 (a mutex epoch whose hold ended) was accepted at an object of lock report, " +
			"whose live Lease is a semaphore with permits 11, 12, 13: the cached free mutex Lease was trusted without vouching")
	}
}

// Lock "x" is a semaphore; its permit with epoch 12 renews Lease
// "x-permit-12" (v1alpha1.PermitLeaseName). The webhook reads the Lease
// named after an object's lock and never checks that it is that lock's
// ledger: for an object fenced by lock "x-permit-12" it reads the permit's
// renewal Lease as a mutex ledger held at epoch 12 by alice. So alice, the
// holder of a permit of lock x, is accepted as the holder of lock
// "x-permit-12", which nobody holds (the authority refuses that Lease as the
// lock's ledger: gather.leaseOf). CEL mode does the same (its parameter is
// the Lease of that name).
func TestRegressionPermitLeaseReadAsLedgerOfAnotherLock(t *testing.T) {
	permit := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fkv1.PermitLeaseName("x", 12), UID: "permit-uid",
		Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: "x", fkv1.LabelPermitEpoch: "12"},
		Annotations: map[string]string{fkv1.AnnotationEpoch: "12", fkv1.AnnotationClaim: "a", fkv1.AnnotationClaimUID: "uid-alice",
			fkv1.AnnotationHolderUser: "alice"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("alice"), LeaseDurationSeconds: ptr.To[int32](30)}}
	h := &FencingHandler{Cache: oneLease{permit}, APIReader: oneLease{permit}}
	resp := h.Handle(context.Background(), cmUpdate("x-permit-12", "alice", "12",
		map[string]string{fkv1.AnnotationFencedEpoch: "11"}))
	if resp.Allowed {
		t.Fatalf("a write to an object of lock x-permit-12 presenting epoch 12 was accepted from alice: the renewal Lease of " +
			"permit 12 of lock x was read as the ledger of lock x-permit-12")
	}
}

// b (needs the Lease guard off, or an admin): the capacity
// annotation removed from a semaphore's Lease that still lists live
// permits. The Lease is then read as a free mutex (LockState.Semaphore is
// Capacity > 1 only), so at an object still carrying fence-policy
// monotonic a stale epoch >= the watermark is accepted, though the Lease
// lists permits (and the authority keeps that layout: decideSemaphore sees
// capacity 1 == MaxHolders() and writes nothing).
func TestRegressionPermitsWithoutCapacityReadAsFreeMutex(t *testing.T) {
	lease := semaphoreLease(map[int64]string{11: "alice", 12: "bob"})
	delete(lease.Annotations, fkv1.AnnotationMaxHolders)
	henry := fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "henry", UID: "uid-henry",
		Annotations: map[string]string{fkv1.AnnotationCreatedBy: "henry"}},
		Spec:   fkv1.FencedLeaseSpec{LockName: "report", HolderIdentity: "henry"},
		Status: fkv1.FencedLeaseStatus{Phase: fkv1.PhaseExpired, Epoch: 10}}
	h := &FencingHandler{Cache: leaseAndClaims{lease: lease, claims: []fkv1.FencedLease{henry}}, APIReader: leaseAndClaims{lease: lease}}
	resp := h.Handle(context.Background(), cmUpdate("report", "henry", "10",
		map[string]string{fkv1.AnnotationFencedEpoch: "10", fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic}))
	if resp.Allowed {
		t.Fatalf("epoch 10, held by no permit, accepted at an object of lock report whose Lease lists permits 11 and 12 " +
			"(capacity annotation removed): read as a free mutex")
	}
}

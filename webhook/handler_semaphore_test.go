package webhook

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

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
)

// permitAuthority vouches (or not) for a semaphore's permits.
type permitAuthority struct {
	permits []int64
	floor   int64
	fresh   bool
}

func (a permitAuthority) FreshView(types.NamespacedName) (int64, int64, bool) {
	return 0, a.floor, false
}

func (a permitAuthority) FreshPermits(types.NamespacedName) ([]int64, int64, bool) {
	return slices.Clone(a.permits), a.floor, a.fresh
}

// countingLease is oneLease that counts its reads.
type countingLease struct {
	oneLease
	reads *int
}

func (c countingLease) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	*c.reads++
	return c.oneLease.Get(ctx, key, obj, opts...)
}

// semaphoreLease is lock "report"'s Lease as a semaphore of 3 with the
// given live permits (epoch -> the user its claim is bound to), counter 12.
func semaphoreLease(permits map[int64]string) *coordinationv1.Lease {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "report"}}
	l := fkv1.Ledger{Exists: true, Epoch: 12, EpochValid: true, Capacity: 3}
	for e, user := range permits {
		l.Permits = append(l.Permits, fkv1.Permit{Epoch: e, Claim: "c", UID: types.UID("uid-" + user), Holder: user, User: user, TTL: 30})
	}
	slices.SortFunc(l.Permits, func(a, b fkv1.Permit) int { return int(a.Epoch - b.Epoch) })
	l.ApplyTo(lease, "report")
	return lease
}

func guardedUpdate(user, epoch string) admission.Request {
	cm := func(v string, ann map[string]string) runtime.RawExtension {
		raw, _ := json.Marshal(&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guarded", UID: "cm-uid", ResourceVersion: "1234",
				Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: ann},
			Data: map[string]string{"v": v}})
		return runtime.RawExtension{Raw: raw}
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "req", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Namespace: "ns", Name: "guarded", Operation: admissionv1.Update, UserInfo: authenticationv1.UserInfo{Username: user},
		Object:    cm("2", map[string]string{fkv1.AnnotationEpoch: epoch, fkv1.AnnotationFencedEpoch: "12"}),
		OldObject: cm("1", map[string]string{fkv1.AnnotationFencedEpoch: "12"}),
	}}
}

func causeOf(resp admission.Response) string {
	if resp.Result == nil || resp.Result.Details == nil || len(resp.Result.Details.Causes) == 0 {
		return ""
	}
	return string(resp.Result.Details.Causes[0].Type)
}

// The cached Lease of a semaphore is used only when the authority vouches
// for exactly its permits, with a floor not above its counter; otherwise the
// Lease is read live. The cache here still shows permit 11, which the live
// Lease no longer does.
func TestSemaphoreVouching(t *testing.T) {
	cached := semaphoreLease(map[int64]string{11: "alice", 12: "bob"})
	live := semaphoreLease(map[int64]string{12: "bob"})
	for _, tc := range []struct {
		name      string
		authority Authority
		wantLive  bool
	}{
		{"vouched for exactly the cached permits", permitAuthority{permits: []int64{11, 12}, floor: 12, fresh: true}, false},
		{"no authority in this process", nil, true},
		{"the authority does not vouch", permitAuthority{permits: []int64{11, 12}, floor: 12, fresh: false}, true},
		{"the authority knows fewer permits", permitAuthority{permits: []int64{12}, floor: 12, fresh: true}, true},
		{"the authority knows more permits", permitAuthority{permits: []int64{10, 11, 12}, floor: 12, fresh: true}, true},
		{"the authority issued beyond the cached counter", permitAuthority{permits: []int64{11, 12}, floor: 13, fresh: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var liveReads int
			h := &FencingHandler{Cache: oneLease{cached}, APIReader: countingLease{oneLease{live}, &liveReads}, Authority: tc.authority}
			resp := h.Handle(context.Background(), guardedUpdate("alice", "11"))
			if tc.wantLive {
				if liveReads != 1 || resp.Allowed || causeOf(resp) != fkv1.AdmissionNotCurrentEpoch.CauseType() {
					t.Fatalf("live reads %d, allowed %v (%s); want the live Lease read and epoch 11 refused as NotCurrentEpoch", liveReads, resp.Allowed, causeOf(resp))
				}
				return
			}
			if liveReads != 0 || !resp.Allowed {
				t.Fatalf("live reads %d, allowed %v (%v); want the vouched cache used and permit 11 accepted", liveReads, resp.Allowed, resp.Result)
			}
		})
	}
}

// Rule 9 for a semaphore: the identity is the permit entry's for the
// presented epoch, not another permit's.
func TestSemaphoreIdentity(t *testing.T) {
	lease := semaphoreLease(map[int64]string{11: "alice", 12: "bob"})
	h := &FencingHandler{Cache: oneLease{lease}, APIReader: oneLease{lease}, Authority: permitAuthority{permits: []int64{11, 12}, floor: 12, fresh: true}}
	for _, tc := range []struct {
		user, epoch string
		allow       bool
	}{
		{"alice", "11", true},
		{"bob", "12", true},
		{"bob", "11", false},
		{"alice", "12", false},
		{"mallory", "12", false},
	} {
		resp := h.Handle(context.Background(), guardedUpdate(tc.user, tc.epoch))
		if resp.Allowed != tc.allow {
			t.Errorf("%s presenting %s: allowed %v (%v), want %v", tc.user, tc.epoch, resp.Allowed, resp.Result, tc.allow)
		}
		if !tc.allow && causeOf(resp) != fkv1.AdmissionIdentityMismatch.CauseType() {
			t.Errorf("%s presenting %s: cause %q, want IdentityMismatch", tc.user, tc.epoch, causeOf(resp))
		}
	}
}

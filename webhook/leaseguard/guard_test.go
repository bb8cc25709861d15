package leaseguard

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// holderUser is the identity the holder's claim is bound to.
const holderUser = "w2-user"

func managed() *coordinationv1.Lease {
	t := metav1.NewMicroTime(time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC))
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "report-2026-07", Namespace: "reports",
			Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: "report-2026-07"},
			Annotations: map[string]string{fkv1.AnnotationEpoch: "42", fkv1.AnnotationClaimUID: "uid-w2", fkv1.AnnotationHolderUser: holderUser},
			Finalizers:  []string{fkv1.LeaseFinalizer}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("W2"), LeaseDurationSeconds: ptr.To(int32(30)), RenewTime: &t, AcquireTime: &t},
	}
}

func TestCheck(t *testing.T) {
	with := func(f func(*coordinationv1.Lease)) *coordinationv1.Lease { l := managed(); f(l); return l }
	renewed := func(l *coordinationv1.Lease) {
		n := metav1.NewMicroTime(l.Spec.RenewTime.Add(time.Second))
		l.Spec.RenewTime = &n
	}
	plain := func() *coordinationv1.Lease { l := managed(); l.Labels = nil; return l }
	owner := func(uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: types.UID(uid)}
	}
	owned := func() *coordinationv1.Lease {
		return with(func(l *coordinationv1.Lease) { l.OwnerReferences = []metav1.OwnerReference{owner("uid-1")} })
	}
	// podBound: the holder's claim was made with a token bound to pod-1.
	podBound := func() *coordinationv1.Lease {
		return with(func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationHolderPodUID] = "pod-1" })
	}
	// noUser: granted before identity binding.
	noUser := func() *coordinationv1.Lease {
		return with(func(l *coordinationv1.Lease) { delete(l.Annotations, fkv1.AnnotationHolderUser) })
	}
	// podHeld: the pod bridge's claim, bound to pod-1 and no user.
	podHeld := func() *coordinationv1.Lease {
		return with(func(l *coordinationv1.Lease) {
			delete(l.Annotations, fkv1.AnnotationHolderUser)
			l.Annotations[fkv1.AnnotationHolderPodUID] = "pod-1"
		})
	}
	cases := []struct {
		name  string
		req   Request
		allow bool
	}{
		{"a holder advances renewTime", Request{Op: Update, User: holderUser, Old: managed(), New: with(renewed)}, true},
		{"a holder sets renewTime to the end of time", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) {
			n := metav1.NewMicroTime(time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC))
			l.Spec.RenewTime = &n
		})}, true},
		{"renewTime moved backward", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) {
			n := metav1.NewMicroTime(l.Spec.RenewTime.Add(-time.Hour))
			l.Spec.RenewTime = &n
		})}, false},
		{"renewing a Lease that names nobody", Request{Op: Update, User: holderUser, Old: with(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }),
			New: with(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil; renewed(l) })}, false},
		{"another user renews", Request{Op: Update, User: "mallory", Old: managed(), New: with(renewed)}, false},
		{"another user sets renewTime to the end of time", Request{Op: Update, User: "mallory", Old: managed(), New: with(func(l *coordinationv1.Lease) {
			n := metav1.NewMicroTime(time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC))
			l.Spec.RenewTime = &n
		})}, false},
		{"the holder's user with a token bound to some pod renews a user-bound hold", Request{Op: Update, User: holderUser, PodUID: "pod-1", Old: managed(), New: with(renewed)}, true},
		{"the holder's pod renews a pod-bound hold", Request{Op: Update, User: holderUser, PodUID: "pod-1", Old: podBound(), New: with(func(l *coordinationv1.Lease) {
			l.Annotations[fkv1.AnnotationHolderPodUID] = "pod-1"
			renewed(l)
		})}, true},
		{"the holder's user from another pod renews a pod-bound hold", Request{Op: Update, User: holderUser, PodUID: "pod-2", Old: podBound(), New: with(func(l *coordinationv1.Lease) {
			l.Annotations[fkv1.AnnotationHolderPodUID] = "pod-1"
			renewed(l)
		})}, false},
		{"the holder's user without a pod renews a pod-bound hold", Request{Op: Update, User: holderUser, Old: podBound(), New: with(func(l *coordinationv1.Lease) {
			l.Annotations[fkv1.AnnotationHolderPodUID] = "pod-1"
			renewed(l)
		})}, false},
		{"the claim's creator renews a Lease that records no holder user", Request{Op: Update, User: holderUser, Old: noUser(), New: with(func(l *coordinationv1.Lease) {
			delete(l.Annotations, fkv1.AnnotationHolderUser)
			renewed(l)
		})}, false},
		{"a pod renews its pod-held Lease (no holder user)", Request{Op: Update, User: "system:serviceaccount:ns:worker", PodUID: "pod-1", Old: podHeld(), New: with(func(l *coordinationv1.Lease) {
			delete(l.Annotations, fkv1.AnnotationHolderUser)
			l.Annotations[fkv1.AnnotationHolderPodUID] = "pod-1"
			renewed(l)
		})}, false},
		{"the manager renews a Lease that records no holder user", Request{Op: Update, IsManager: true, Old: noUser(), New: with(func(l *coordinationv1.Lease) {
			delete(l.Annotations, fkv1.AnnotationHolderUser)
			renewed(l)
		})}, true},
		{"owner reference added", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.OwnerReferences = []metav1.OwnerReference{owner("uid-1")}; renewed(l) })}, false},
		{"owner reference uid changed", Request{Op: Update, User: holderUser, Old: owned(), New: with(func(l *coordinationv1.Lease) { l.OwnerReferences = []metav1.OwnerReference{owner("uid-2")}; renewed(l) })}, false},
		{"owner reference made to block its owner's deletion", Request{Op: Update, User: holderUser, Old: owned(), New: with(func(l *coordinationv1.Lease) {
			o := owner("uid-1")
			o.BlockOwnerDeletion = ptr.To(true)
			l.OwnerReferences = []metav1.OwnerReference{o}
			renewed(l)
		})}, false},
		{"owner reference removed", Request{Op: Update, User: holderUser, Old: owned(), New: with(renewed)}, false},
		{"the manager adds an owner reference", Request{Op: Update, IsManager: true, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.OwnerReferences = []metav1.OwnerReference{owner("uid-1")} })}, true},
		{"the manager removes an owner reference", Request{Op: Update, IsManager: true, Old: owned(), New: managed()}, true},
		{"epoch changed", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationEpoch] = "99"; renewed(l) })}, false},
		{"holder changed", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("mallory"); renewed(l) })}, false},
		{"finalizer removed", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Finalizers = nil; renewed(l) })}, false},
		{"managed-by label removed", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) { delete(l.Labels, fkv1.LabelManagedBy); renewed(l) })}, false},
		{"TTL changed with a renewal", Request{Op: Update, User: holderUser, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = ptr.To(int32(86400)); renewed(l) })}, false},
		{"delete", Request{Op: Delete, Old: managed()}, false},
		{"delete while the namespace terminates", Request{Op: Delete, Old: managed(), NamespaceTerminating: true}, true},
		{"create a managed Lease", Request{Op: Create, New: managed()}, false},
		{"create a Lease fencekeeper does not manage", Request{Op: Create, New: plain()}, true},
		{"add the managed-by label to a plain Lease", Request{Op: Update, User: holderUser, Old: plain(), New: with(renewed)}, false},
		{"rewrite a plain Lease", Request{Op: Update, Old: plain(), New: func() *coordinationv1.Lease { l := plain(); l.Spec.HolderIdentity = ptr.To("x"); return l }()}, true},
		{"the manager rewrites", Request{Op: Update, IsManager: true, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationEpoch] = "43" })}, true},
		{"the manager creates", Request{Op: Create, IsManager: true, New: managed()}, true},
		{"the manager deletes", Request{Op: Delete, IsManager: true, Old: managed()}, true},
	}
	// why: the refusal each case must get (the rule that refuses it).
	why := map[string]string{
		"another user renews":                                            `only the holder's bound identity may renew managed Lease report-2026-07 (user "w2-user"), but this request comes from user "mallory"`,
		"another user sets renewTime to the end of time":                 `only the holder's bound identity may renew`,
		"the holder's user from another pod renews a pod-bound hold":     `(user "w2-user" with a token bound to pod pod-1), but this request comes from user "w2-user" with a token bound to pod pod-2`,
		"the holder's user without a pod renews a pod-bound hold":        `but this request comes from user "w2-user"`,
		"the claim's creator renews a Lease that records no holder user": "only the fencekeeper manager may renew managed Lease report-2026-07: it records no holder user",
		"a pod renews its pod-held Lease (no holder user)":               "only the fencekeeper manager may renew managed Lease report-2026-07: it records no holder user",
		"owner reference added":                                          "ownerReferences",
		"owner reference uid changed":                                    "ownerReferences",
		"owner reference made to block its owner's deletion":             "ownerReferences",
		"owner reference removed":                                        "ownerReferences",
		"renewTime moved backward":                                       "a holder may only advance renewTime",
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.req)
			if (err == nil) != tc.allow {
				t.Fatalf("Check = %v, want allowed=%v", err, tc.allow)
			}
			if w := why[tc.name]; w != "" && !strings.Contains(err.Error(), w) {
				t.Fatalf("Check = %v, want it to say %q", err, w)
			}
		})
	}
}

package leaseguard

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func managed() *coordinationv1.Lease {
	t := metav1.NewMicroTime(time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC))
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "report-2026-07", Namespace: "reports",
			Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: "report-2026-07"},
			Annotations: map[string]string{fkv1.AnnotationEpoch: "42", fkv1.AnnotationClaimUID: "uid-w2"},
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
	cases := []struct {
		name  string
		req   Request
		allow bool
	}{
		{"a holder advances renewTime", Request{Op: Update, Old: managed(), New: with(renewed)}, true},
		{"renewTime moved backward", Request{Op: Update, Old: managed(), New: with(func(l *coordinationv1.Lease) {
			n := metav1.NewMicroTime(l.Spec.RenewTime.Add(-time.Hour))
			l.Spec.RenewTime = &n
		})}, false},
		{"renewing a Lease that names nobody", Request{Op: Update, Old: with(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }),
			New: with(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil; renewed(l) })}, false},
		{"epoch changed", Request{Op: Update, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationEpoch] = "99"; renewed(l) })}, false},
		{"holder changed", Request{Op: Update, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("mallory"); renewed(l) })}, false},
		{"finalizer removed", Request{Op: Update, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Finalizers = nil; renewed(l) })}, false},
		{"managed-by label removed", Request{Op: Update, Old: managed(), New: with(func(l *coordinationv1.Lease) { delete(l.Labels, fkv1.LabelManagedBy); renewed(l) })}, false},
		{"TTL changed with a renewal", Request{Op: Update, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = ptr.To(int32(86400)); renewed(l) })}, false},
		{"delete", Request{Op: Delete, Old: managed()}, false},
		{"delete while the namespace terminates", Request{Op: Delete, Old: managed(), NamespaceTerminating: true}, true},
		{"create a managed Lease", Request{Op: Create, New: managed()}, false},
		{"create a Lease fencekeeper does not manage", Request{Op: Create, New: plain()}, true},
		{"add the managed-by label to a plain Lease", Request{Op: Update, Old: plain(), New: with(renewed)}, false},
		{"rewrite a plain Lease", Request{Op: Update, Old: plain(), New: func() *coordinationv1.Lease { l := plain(); l.Spec.HolderIdentity = ptr.To("x"); return l }()}, true},
		{"the manager rewrites", Request{Op: Update, IsManager: true, Old: managed(), New: with(func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationEpoch] = "43" })}, true},
		{"the manager creates", Request{Op: Create, IsManager: true, New: managed()}, true},
		{"the manager deletes", Request{Op: Delete, IsManager: true, Old: managed()}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := Check(tc.req); (err == nil) != tc.allow {
				t.Fatalf("Check = %v, want allowed=%v", err, tc.allow)
			}
		})
	}
}

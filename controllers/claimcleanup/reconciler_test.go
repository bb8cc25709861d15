package claimcleanup

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestDeleteAt(t *testing.T) {
	created := time.Date(2026, 7, 1, 10, 0, 0, 0, time.UTC)
	ended := created.Add(time.Hour)
	const after = 24 * time.Hour
	claim := func(phase fkv1.FencedLeasePhase, mutate ...func(*fkv1.FencedLease)) *fkv1.FencedLease {
		c := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		c.Status.Phase = phase
		c.Status.Conditions = []metav1.Condition{{Type: fkv1.ConditionHeld, Status: metav1.ConditionFalse, Reason: fkv1.ReasonExpired, LastTransitionTime: metav1.NewTime(ended)}}
		for _, m := range mutate {
			m(c)
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		claim  *fkv1.FencedLease
		want   time.Time
		wantOK bool
	}{
		{"expired: after its end", claim(fkv1.PhaseExpired), ended.Add(after), true},
		{"held: never", claim(fkv1.PhaseHeld, func(c *fkv1.FencedLease) { c.Status.Conditions[0].Status = metav1.ConditionTrue }), time.Time{}, false},
		{"pending: never", claim(fkv1.PhasePending), time.Time{}, false},
		{"no phase yet: never", claim(""), time.Time{}, false},
		{"expired without a Held condition: after its creation", claim(fkv1.PhaseExpired, func(c *fkv1.FencedLease) { c.Status.Conditions = nil }), created.Add(after), true},
		{"expired, Held condition still True (odd): counts from creation", claim(fkv1.PhaseExpired, func(c *fkv1.FencedLease) { c.Status.Conditions[0].Status = metav1.ConditionTrue }), created.Add(after), true},
		{"expired, owned by a pod: left to the garbage collector", claim(fkv1.PhaseExpired, func(c *fkv1.FencedLease) {
			c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "u", Controller: ptr.To(true)}}
		}), time.Time{}, false},
		{"expired, owned (not controlled) by a pod: deleted", claim(fkv1.PhaseExpired, func(c *fkv1.FencedLease) {
			c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "u"}}
		}), ended.Add(after), true},
		{"expired, already being deleted: nothing to do", claim(fkv1.PhaseExpired, func(c *fkv1.FencedLease) {
			c.DeletionTimestamp = ptr.To(metav1.NewTime(ended))
		}), time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := DeleteAt(tc.claim, after)
			if ok != tc.wantOK || !got.Equal(tc.want) {
				t.Fatalf("DeleteAt = %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

package lock

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// statusEqual must answer as the semantic comparison it replaces does, on
// statuses that differ in one field or not at all (each field from a small
// set of values, so equal and unequal pairs both come up often), and must
// be told about every field the status and its conditions have.
func TestStatusEqual(t *testing.T) {
	if n := reflect.TypeOf(fkv1.FencedLeaseStatus{}).NumField(); n != 8 {
		t.Fatalf("FencedLeaseStatus has %d fields, statusEqual compares 8: compare the new one, then update this test", n)
	}
	if n := reflect.TypeOf(metav1.Condition{}).NumField(); n != 6 {
		t.Fatalf("metav1.Condition has %d fields, conditionsEqual compares 6", n)
	}
	t0 := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	// The same instant in another zone is equal; a nanosecond later is not.
	times := []*metav1.Time{nil, {Time: t0}, {Time: t0.In(time.FixedZone("x", 3600))}, {Time: t0.Add(time.Nanosecond)}}
	cond := func(rng *rand.Rand) metav1.Condition {
		return metav1.Condition{
			Type:               []string{"Held", "LockConflict"}[rng.IntN(2)],
			Status:             []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse}[rng.IntN(2)],
			ObservedGeneration: int64(rng.IntN(2)),
			LastTransitionTime: *times[1+rng.IntN(3)],
			Reason:             []string{"Queued", "Granted"}[rng.IntN(2)],
			Message:            []string{"", "m"}[rng.IntN(2)],
		}
	}
	conds := func(rng *rand.Rand) []metav1.Condition {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1:
			return []metav1.Condition{}
		case 2:
			return []metav1.Condition{cond(rng)}
		}
		return []metav1.Condition{cond(rng), cond(rng)}
	}
	// field i of a status, set to a random value of its small set.
	set := []func(*fkv1.FencedLeaseStatus, *rand.Rand){
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) {
			s.Phase = []fkv1.FencedLeasePhase{"", fkv1.PhasePending, fkv1.PhaseHeld}[r.IntN(3)]
		},
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) { s.Epoch = int64(r.IntN(2)) },
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) { s.LeaseName = []string{"", "x"}[r.IntN(2)] },
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) { s.AcquireTime = times[r.IntN(4)] },
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) { s.RenewTime = times[r.IntN(4)] },
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) { s.ExpireTime = times[r.IntN(4)] },
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) { s.ObservedGeneration = int64(r.IntN(2)) },
		func(s *fkv1.FencedLeaseStatus, r *rand.Rand) { s.Conditions = conds(r) },
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var equal, unequal int
	for i := 0; i < 50000; i++ {
		var a fkv1.FencedLeaseStatus
		for _, f := range set {
			f(&a, rng)
		}
		b := *a.DeepCopy()
		if rng.IntN(4) > 0 {
			set[rng.IntN(len(set))](&b, rng)
		}
		want := equality.Semantic.DeepEqual(a, b)
		if got := statusEqual(a, b); got != want {
			t.Fatalf("statusEqual = %v, semantic equality %v, for\n%#v\n%#v", got, want, a, b)
		}
		if want {
			equal++
		} else {
			unequal++
		}
	}
	if equal < 1000 || unequal < 1000 {
		t.Fatalf("too few cases of one kind: %d equal, %d unequal", equal, unequal)
	}
}

package chaos

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A Held claim carrying a break its breaker was recorded for is a break in
// the history at once; without the recorded breaker it is a plain hold.
func TestConvertRecordsABreakFromItsRequest(t *testing.T) {
	claim := func(ann map[string]string) *fkv1.FencedLease {
		return &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Name: "w3", UID: "uid-w3", Annotations: ann},
			Spec:   fkv1.FencedLeaseSpec{LockName: "report", HolderIdentity: "w3"},
			Status: fkv1.FencedLeaseStatus{Phase: fkv1.PhaseHeld, Epoch: 255}}
	}
	e, ok := convert(claim(map[string]string{fkv1.AnnotationBreakReason: "hung", fkv1.AnnotationBrokenBy: "alice"}), "report", false)
	if !ok || e.Kind != KindBroken || e.Epoch != 255 {
		t.Fatalf("a requested break was recorded as %+v %v", e, ok)
	}
	e, ok = convert(claim(map[string]string{fkv1.AnnotationBreakReason: "hung"}), "report", false)
	if !ok || e.Kind != KindClaim {
		t.Fatalf("a break request without its recorded breaker was recorded as %+v %v", e, ok)
	}
}

package fencecli

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A fencing refusal is a 403 like an RBAC denial; explain must not send
// its reader to their RBAC rules for it.
func TestExplainTellsFencingFromRBAC(t *testing.T) {
	fenced := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: "admission webhook \"fenced.fencekeeper.io\" denied the request: stale epoch 41",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseType(fkv1.AdmissionStaleEpoch.CauseType())}}},
	}}
	cel := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "report",
		errorString("ValidatingAdmissionPolicy 'fencekeeper-fencing' with binding 'b' denied request: fencekeeper.io/NotCurrentEpoch: stale epoch 41"))
	rbac := apierrors.NewForbidden(schema.GroupResource{Group: "fencekeeper.io", Resource: "fencedleases"}, "w1", errorString("user cannot create"))
	for name, err := range map[string]error{"webhook": fenced, "cel": cel} {
		if got := explain(err); strings.Contains(got, "RBAC") {
			t.Errorf("%s fencing refusal explained as RBAC: %s", name, got)
		}
	}
	if got := explain(rbac); !strings.Contains(got, "RBAC") {
		t.Errorf("an RBAC denial is not explained as one: %s", got)
	}
	// A semaphore's holders read and renew their permits' Leases.
	if got := explain(rbac); !strings.Contains(got, "get/watch/update on leases") || !strings.Contains(got, "LOCK-permit-EPOCH") {
		t.Errorf("the RBAC hint does not name what holders do with Leases: %s", got)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

package lease

import (
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// In CEL enforcement mode a denial has no status cause: the reason is at
// the start of the policy's message.
func TestIsStaleEpochReadsCELModeDenials(t *testing.T) {
	denial := func(reason string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
			Reason: metav1.StatusReasonForbidden,
			Message: `configmaps "report" is forbidden: ValidatingAdmissionPolicy 'fencekeeper-fencing' with binding 'fencekeeper-lock-r' denied request: fencekeeper.io/` +
				reason + `: ...`}}
	}
	for reason, want := range map[string]bool{"StaleEpoch": true, "NotCurrentEpoch": true, "FutureEpoch": false, "MissingEpoch": false, "IdentityMismatch": false} {
		if got := IsStaleEpoch(denial(reason)); got != want {
			t.Errorf("IsStaleEpoch(%s denial) = %v, want %v", reason, got, want)
		}
	}
}

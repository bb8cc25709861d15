package v1alpha1

import "testing"

func TestPolicyDenialReason(t *testing.T) {
	for _, tc := range []struct {
		message string
		want    AdmissionReason
	}{
		{`configmaps "report" is forbidden: ValidatingAdmissionPolicy 'fencekeeper-fencing' with binding 'fencekeeper-lock-r' denied request: fencekeeper.io/NotCurrentEpoch: stale epoch 41 for lock ns/r: ...`, AdmissionNotCurrentEpoch},
		{`The configmaps "report" is invalid: : ValidatingAdmissionPolicy 'fencekeeper-fencing-base' with binding 'fencekeeper-fencing-base' denied request: fencekeeper.io/EmptyLockLabel: the fencekeeper.io/lock label must name a lock`, AdmissionEmptyLockLabel},
		{"configmaps \"report\" is forbidden: ValidatingAdmissionPolicy 'fencekeeper-lease-required' with binding 'fencekeeper-lock--create-r' denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction", AdmissionNoLease},
		// Not one of ours, or not a reason.
		{"ValidatingAdmissionPolicy 'other' with binding 'x' denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction", ""},
		{"ValidatingAdmissionPolicy 'fencekeeper-lease-required' with binding 'fencekeeper-lock--create-r' denied request: failed to configure binding: paramKind not found", ""},
		{`ValidatingAdmissionPolicy 'other' with binding 'x' denied request: replicas must be odd`, ""},
		{`denied request: fencekeeper.io/lock label missing`, ""},
		{`admission webhook "fenced.fencekeeper.io" denied the request: stale epoch 41`, ""},
		{"", ""},
	} {
		if got := PolicyDenialReason(tc.message); got != tc.want {
			t.Errorf("PolicyDenialReason(%q) = %q, want %q", tc.message, got, tc.want)
		}
	}
}

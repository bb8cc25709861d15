package lease

import (
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var (
	// ErrStaleEpoch: the protected object refused the write because a newer
	// holder's epoch is current (or the object already accepted a newer one).
	ErrStaleEpoch = errors.New("fencekeeper: stale epoch: the object refused a write from an older ownership generation")
	// ErrLost: the lease is lost; its context is cancelled.
	ErrLost = errors.New("fencekeeper: lease lost")
	// ErrExpired: the claim expired before it could be used.
	ErrExpired = errors.New("fencekeeper: claim expired")
	// ErrQueueFull: the lock already had its maximum of waiting claims; the
	// claim was turned away. Retry later.
	ErrQueueFull = errors.New("fencekeeper: the lock's queue is full")
	// ErrAcquireTimeout: the authority ended the claim without a grant
	// because it was still waiting Options.AcquireTimeout after the authority
	// first observed it (at once for TryAcquire). The claim never held the
	// lock and was deleted. Not ErrExpired: nothing was held.
	ErrAcquireTimeout = errors.New("fencekeeper: not granted within the acquire timeout")
	// ErrReleaseUncertain: the release request's outcome is unknown (a lost
	// reply). The claim is either gone or will expire; repeating is harmless.
	ErrReleaseUncertain = errors.New("fencekeeper: release outcome unknown; the claim will expire if it was not deleted")
)

// IsStaleEpoch reports whether err is the fencing admission refusing a stale
// epoch (directly or wrapped in ErrStaleEpoch). It goes by the denial's cause
// type, never by its message text.
func IsStaleEpoch(err error) bool {
	return errors.Is(err, ErrStaleEpoch) || FencingReason(err).IsStaleHolder()
}

// FencingReason is the fencing rule that refused err ("" when err is not a
// fencing refusal): the webhook's cause type, or in CEL mode the policy's
// message prefix (a policy cannot set causes). A fencing refusal is a 403 or
// a 422, like an RBAC or validation error, and this tells them apart.
func FencingReason(err error) fkv1.AdmissionReason {
	var se apierrors.APIStatus
	if err == nil || !errors.As(err, &se) {
		return ""
	}
	st := se.Status()
	if r := fkv1.PolicyDenialReason(st.Message); r != "" {
		return r
	}
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			if r, ok := strings.CutPrefix(string(c.Type), fkv1.Prefix); ok {
				return fkv1.AdmissionReason(r)
			}
		}
	}
	return ""
}

type staleError struct{ err error }

func (e staleError) Error() string { return ErrStaleEpoch.Error() + ": " + e.err.Error() }
func (e staleError) Unwrap() []error {
	return []error{ErrStaleEpoch, e.err}
}

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
	// ErrReleaseUncertain: the release request's outcome is unknown (a lost
	// reply). The claim is either gone or will expire; repeating is harmless.
	ErrReleaseUncertain = errors.New("fencekeeper: release outcome unknown; the claim will expire if it was not deleted")
)

// IsStaleEpoch reports whether err is the fencing admission refusing a stale
// epoch (directly or wrapped in ErrStaleEpoch). It goes by the denial's cause
// type, never by its message text.
func IsStaleEpoch(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrStaleEpoch) {
		return true
	}
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return false
	}
	st := se.Status()
	// The CEL-mode policies cannot set causes; their message names the reason.
	if fkv1.PolicyDenialReason(st.Message).IsStaleHolder() {
		return true
	}
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			if strings.HasPrefix(string(c.Type), fkv1.Prefix) &&
				fkv1.AdmissionReason(strings.TrimPrefix(string(c.Type), fkv1.Prefix)).IsStaleHolder() {
				return true
			}
		}
	}
	return false
}

type staleError struct{ err error }

func (e staleError) Error() string { return ErrStaleEpoch.Error() + ": " + e.err.Error() }
func (e staleError) Unwrap() []error {
	return []error{ErrStaleEpoch, e.err}
}

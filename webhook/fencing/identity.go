package fencing

import (
	"fmt"
	"net/http"
	"slices"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Identity is who sends a request: the user, and the pod UID a
// ServiceAccount token is bound to (if any).
type Identity struct {
	User   string
	PodUID string
}

// Binding is the identity a claim is bound to: the user who created it and,
// for a pod-bound token or a pod-lease claim, the pod. One empty field does
// not constrain; both empty bind nobody, and then nobody's write presenting
// the epoch is accepted. Known is false when the claim that held the epoch
// is gone.
type Binding struct {
	User, PodUID string
	Known        bool
}

func (b Binding) String() string {
	switch {
	case b.User != "" && b.PodUID != "":
		return fmt.Sprintf("user %q with a token bound to pod %s", b.User, b.PodUID)
	case b.PodUID != "":
		return fmt.Sprintf("a token bound to pod %s", b.PodUID)
	}
	return fmt.Sprintf("user %q", b.User)
}

// NeedsIdentity reports whether an allowed decision presented an epoch whose
// holder's identity must be checked (rule 9), and which epoch.
func NeedsIdentity(r Request, d Decision) (int64, bool) {
	if !d.Allowed {
		return 0, false
	}
	switch d.Reason {
	case fkv1.AdmissionEpochAccepted, fkv1.AdmissionDeleteMarked:
	default:
		return 0, false
	}
	if optedOut(r) {
		return 0, false
	}
	return d.Epoch, true
}

// LeaseBinding is the identity the lock's Lease records for epoch: the
// current holder's for a mutex's held epoch, the permit entry's for a live
// permit of a semaphore. ok is false when the Lease records none for it (an
// older epoch of a mutex, whose claim tells; any other epoch of a
// semaphore, which Decide never accepts).
func (l LockState) LeaseBinding(epoch int64) (Binding, bool) {
	if l.Semaphore() {
		p, ok := l.permitOf(epoch)
		return p.Binding, ok
	}
	if epoch != 0 && epoch == l.HeldEpoch {
		return l.HolderBinding, true
	}
	return Binding{}, false
}

// CheckIdentity is rule 9: an epoch is an identifier, not a bearer token. A
// write presenting epoch N is accepted only from the identity that holds N,
// unless the stored object opts out with fencekeeper.io/fence-identity: any
// (never on CREATE, so nobody else can create objects under a holder's
// epoch).
func CheckIdentity(lock LockState, epoch int64, who Identity, bound Binding) Decision {
	lockRef := lock.String()
	if !bound.Known {
		return deny(http.StatusForbidden, fkv1.AdmissionIdentityMismatch, epoch,
			"epoch %d of lock %s: the claim that held it is gone (or two claims show it), so the writer's identity cannot be checked "+
				"(objects that accept old epochs from anyone carry %s: %s)", epoch, lockRef, fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)
	}
	if bound.User == "" && bound.PodUID == "" {
		// Rule 9 by default: only the identity holding an epoch may present
		// it. A claim created while the claim-identity policy was not in
		// effect (or before identities were recorded) names no identity, so
		// nobody can be told apart from its holder: fail closed rather than
		// let its epoch be a bearer token.
		return deny(http.StatusForbidden, fkv1.AdmissionIdentityMismatch, epoch,
			"epoch %d of lock %s: the claim that holds it records no identity (it was created while the claim-identity policy "+
				"was not in effect), so the writer's identity cannot be checked: release it and create a new claim "+
				"(or set %s: %s on the object to accept the epoch from any identity)", epoch, lockRef, fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)
	}
	userOK := bound.User == "" || bound.User == who.User
	podOK := bound.PodUID == "" || bound.PodUID == who.PodUID
	if userOK && podOK {
		return allow(fkv1.AdmissionEpochAccepted, epoch)
	}
	sender := fmt.Sprintf("user %q", who.User)
	if who.PodUID != "" {
		sender += " with a token bound to pod " + who.PodUID
	}
	return deny(http.StatusForbidden, fkv1.AdmissionIdentityMismatch, epoch,
		"epoch %d of lock %s is held by %s, but this write comes from %s: an epoch is accepted only from the identity holding it "+
			"(set %s: %s on the object to accept it from any identity)", epoch, lockRef, bound, sender, fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)
}

// optedOut: the stored object accepts epochs from any identity. A CREATE has
// no stored object, a write cannot opt itself out, and an unfenced object's
// opt-out says nothing (anyone could have set it).
func optedOut(r Request) bool {
	if r.Op == Create || r.Old == nil || !isFenced(r.Old) {
		return false
	}
	return r.Old.GetAnnotations()[fkv1.AnnotationFenceIdentity] == fkv1.FenceIdentityAny
}

// ClaimBinding is the identity a new claim is bound to: its creator, or,
// for a claim the manager (self) creates for a pod, that pod.
func ClaimBinding(creator Identity, self string, podOwnerUID string) Binding {
	if self != "" && creator.User == self && podOwnerUID != "" {
		return Binding{PodUID: podOwnerUID, Known: true}
	}
	return Binding{User: creator.User, PodUID: creator.PodUID, Known: true}
}

// PodUIDOf reads the pod UID a ServiceAccount token is bound to from the
// request's user-info extra ("" if none).
func PodUIDOf(extra map[string][]string) string {
	if v := extra[fkv1.PodUIDExtra]; len(v) > 0 && !slices.Contains(v, "") {
		return v[0]
	}
	return ""
}

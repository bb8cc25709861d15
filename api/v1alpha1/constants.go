package v1alpha1

import (
	"strings"
	"time"
)

// Condition types of a FencedLease.
const (
	// ConditionHeld is True while the claim holds the lock.
	ConditionHeld = "Held"
	// ConditionLockConflict is True while a same-named Lease that fencekeeper
	// does not manage blocks the lock; the claim stays Pending.
	ConditionLockConflict = "LockConflict"
)

// Condition reasons, also used as Event reasons for ownership transitions.
const (
	ReasonQueued = "Queued"
	// ReasonNext: the claim entered the queue at its head and is still
	// there, the next to be granted. Its holder library watches the lock's
	// Lease for the grant; waiters further back watch only their claim, so
	// a lock's Lease has O(1) watchers however many wait. A waiter that
	// moves up to the head stays Queued (no status write per handoff).
	ReasonNext         = "Next"
	ReasonGranted      = "Granted"
	ReasonExpired      = "Expired"
	ReasonReleased     = "Released"
	ReasonSuperseded   = "Superseded"
	ReasonLockConflict = "LockConflict"
	// ReasonForcedRelease: an operator broke the lock (`kubectl fence
	// break`); the hold ended at once and the next waiter gets a higher epoch.
	ReasonForcedRelease = "ForcedRelease"
	// ReasonAcquireTimeout: the claim was still Pending its
	// spec.acquireTimeoutSeconds after the authority first observed it; it
	// ended without an epoch and left the queue (terminal).
	ReasonAcquireTimeout = "AcquireTimeout"
	// ReasonQueueFull: the lock already had its maximum of waiting claims
	// when this claim came; it is turned away (terminal).
	ReasonQueueFull = "QueueFull"
	// ReasonEpochsExhausted: the lock issued the largest epoch there is
	// (2^63-1) and never grants again; use another lock name.
	ReasonEpochsExhausted = "EpochsExhausted"
	// ReasonNoIdentity: the claim records no identity (RecordsNoIdentity: it
	// was created while the claim-identity policy was not in effect). It is
	// never granted (an epoch nobody may write with must not block a lock):
	// it stays Pending, the lock goes to the next waiter, and a Warning
	// Event says to delete and re-create it.
	ReasonNoIdentity = "NoIdentity"
	// ReasonCapacityMismatch: the claim asks for another maxHolders than
	// the lock's (recorded in its Lease while it has holders); it stays
	// Pending until the lock has no holder and it is first in line.
	ReasonCapacityMismatch = "CapacityMismatch"
)

// Labels, annotations and finalizers of the backing Lease.
const (
	// Prefix of every fencekeeper label and annotation.
	Prefix = "fencekeeper.io/"

	// LabelManagedBy marks Leases fencekeeper manages (value ManagedByValue).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is the value of LabelManagedBy on managed Leases.
	ManagedByValue = "fencekeeper"
	// LabelLock names the lock, on managed Leases and on protected objects.
	LabelLock = Prefix + "lock"

	// AnnotationEpoch is the last epoch issued for the lock (on the Lease),
	// or the writer's token (on a protected object). Decimal int64, read with
	// ParseEpoch.
	AnnotationEpoch = Prefix + "epoch"
	// AnnotationClaim is the name of the holder claim (empty when free).
	AnnotationClaim = Prefix + "claim"
	// AnnotationClaimUID is the UID of the holder claim: the lease identity
	// holders must see before renewing.
	AnnotationClaimUID = Prefix + "claim-uid"
	// AnnotationPreviousClaimUID is the UID of the claim that held the lock
	// before the current one. It lets a controller that crashed between the
	// Lease update and the claim status patch mark that claim Expired.
	AnnotationPreviousClaimUID = Prefix + "previous-claim-uid"

	// AnnotationTimedOutClaims, on the Lease, lists (comma-separated
	// name/uid) the waiting claims the authority ended for their
	// acquireTimeoutSeconds whose end is not yet seen on the claims. The
	// timeout is this guarded Lease write, like a grant, so a claim is never
	// both timed out and granted; no listed claim is granted.
	AnnotationTimedOutClaims = Prefix + "timed-out-claims"

	// AnnotationHolderUser and AnnotationHolderPodUID, on the Lease, are the
	// identity the holder claim is bound to (copied from the claim at
	// grant): a fenced write presenting the current epoch must come from it.
	AnnotationHolderUser   = Prefix + "holder-user"
	AnnotationHolderPodUID = Prefix + "holder-pod-uid"

	// AnnotationCreatedBy and AnnotationCreatedByPodUID, on a claim, record
	// who created it: the requesting user, and the pod a ServiceAccount
	// token is bound to. Admission sets them on CREATE (a client's values are
	// replaced) and refuses any change. A pod-lease claim is bound to its pod
	// (no user).
	AnnotationCreatedBy = Prefix + "created-by"
	// AnnotationBreakReason, on a holder claim, asks the authority to end the
	// hold at once (`kubectl fence break`). AnnotationBrokenBy is who asked,
	// set by the claim-break admission policy from the request's user (never
	// by the client); the authority honours a break only with both.
	AnnotationBreakReason     = Prefix + "break-reason"
	AnnotationBrokenBy        = Prefix + "broken-by"
	AnnotationCreatedByPodUID = Prefix + "created-by-pod-uid"

	// AnnotationMaxHolders, on the Lease, is the lock's capacity (absent:
	// 1, a mutex). Each live permit of a semaphore lock is one annotation,
	// AnnotationPermitPrefix plus its epoch (fencekeeper.io/permit-42), whose
	// value is the Permit as JSON: admission looks up the presented epoch
	// by key. All are the manager's.
	AnnotationMaxHolders   = Prefix + "max-holders"
	AnnotationPermitPrefix = Prefix + "permit-"
	// LabelPermitEpoch marks a permit's renewal Lease (PermitLeaseName):
	// the epoch of the permit it renews. Its LabelLock names the lock.
	LabelPermitEpoch = Prefix + "permit-epoch"
	// AnnotationLeaseMaxHolders on a pod sets the claim's maxHolders.
	AnnotationLeaseMaxHolders = Prefix + "lease-max-holders"

	// LeaseFinalizer keeps the backing Lease (the epoch ledger) from being
	// deleted while claims for its lock exist.
	LeaseFinalizer = Prefix + "lease-protection"
)

// MaxHolders returns the claim's capacity, defaulted (1: a mutex).
func (f *FencedLease) MaxHolders() int32 {
	if f.Spec.MaxHolders == nil || *f.Spec.MaxHolders < 1 {
		return 1
	}
	return *f.Spec.MaxHolders
}

// MaxMaxHolders is the largest capacity a lock may have.
const MaxMaxHolders = 100

// DefaultLeaseDurationSeconds is the TTL of a claim that sets none.
const DefaultLeaseDurationSeconds int32 = 15

// LeaseDuration returns the claim's TTL.
func (f *FencedLease) LeaseDuration() time.Duration {
	return time.Duration(f.LeaseDurationSeconds()) * time.Second
}

// LeaseDurationSeconds returns the claim's TTL in seconds, defaulted.
func (f *FencedLease) LeaseDurationSeconds() int32 {
	if f.Spec.LeaseDurationSeconds == nil || *f.Spec.LeaseDurationSeconds < 1 {
		return DefaultLeaseDurationSeconds
	}
	return *f.Spec.LeaseDurationSeconds
}

// Pod-held leases (docs/design.md §4).
const (
	// AnnotationLease on a pod requests the named lock.
	AnnotationLease = Prefix + "lease"
	// AnnotationLeaseDuration on a pod sets the claim's TTL in seconds.
	AnnotationLeaseDuration = Prefix + "lease-duration-seconds"
	// AnnotationLeaseState on a pod is Pending, Held or Lost.
	AnnotationLeaseState = Prefix + "lease-state"
	// PodConditionLeaseHeld is the pod condition (usable as a readiness gate).
	PodConditionLeaseHeld = Prefix + "lease-held"
	// LabelPodUID marks a claim made for a pod (the pod's UID).
	LabelPodUID = Prefix + "pod-uid"
)

// Pod lease states.
const (
	LeaseStatePending = "Pending"
	LeaseStateHeld    = "Held"
	LeaseStateLost    = "Lost"
)

// Pod condition reasons.
const (
	ReasonInvalidLeaseRequest = "InvalidLeaseRequest"
	ReasonPodNotLive          = "PodNotLive"
)

// Fencing of protected objects (docs/design.md §3).
const (
	// AnnotationFencePolicy selects the fencing policy of one object.
	AnnotationFencePolicy = Prefix + "fence-policy"
	// FencePolicyCurrent (default): the epoch must be the lock's current held epoch.
	FencePolicyCurrent = "current"
	// FencePolicyMonotonic: only the per-object watermark and the issued bound apply.
	FencePolicyMonotonic = "monotonic"

	// AnnotationFencedEpoch on a protected object is its watermark: the epoch
	// of the last accepted content write. Only admission writes it; the
	// per-request token (AnnotationEpoch) is consumed and never stored.
	AnnotationFencedEpoch = Prefix + "fenced-epoch"
	// AnnotationFenceIdentity: "any" on a protected object accepts the
	// current epoch from any identity (by default only the identity the
	// holder claim is bound to may present it).
	AnnotationFenceIdentity = Prefix + "fence-identity"
	// FenceIdentityAny is the value of AnnotationFenceIdentity that opts out.
	FenceIdentityAny = "any"

	// AnnotationDeleteEpoch marks a protected object for deletion by the
	// current holder: set it to your epoch in a fenced write, then delete.
	// The delete passes while the mark equals the watermark and the lock's
	// current held epoch, under every policy.
	AnnotationDeleteEpoch = Prefix + "delete-epoch"
)

// AdmissionReason is the machine-readable reason of a fencing admission
// decision. A denial carries it as details.causes[0].type, prefixed with
// Prefix (see CauseType).
type AdmissionReason string

// Admission reasons.
const (
	AdmissionEpochAccepted      AdmissionReason = "EpochAccepted"
	AdmissionMetadataOnly       AdmissionReason = "MetadataOnly"
	AdmissionMissingEpoch       AdmissionReason = "MissingEpoch"
	AdmissionMalformedEpoch     AdmissionReason = "MalformedEpoch"
	AdmissionStaleEpoch         AdmissionReason = "StaleEpoch"
	AdmissionNotCurrentEpoch    AdmissionReason = "NotCurrentEpoch"
	AdmissionFutureEpoch        AdmissionReason = "FutureEpoch"
	AdmissionLockLabelImmutable AdmissionReason = "LockLabelImmutable"
	AdmissionEpochRemoved       AdmissionReason = "EpochAnnotationRemoved"
	AdmissionInvalidPolicy      AdmissionReason = "InvalidFencePolicy"
	AdmissionClusterScoped      AdmissionReason = "ClusterScoped"
	AdmissionEmptyLockLabel     AdmissionReason = "EmptyLockLabel"
	AdmissionDeleteMarked       AdmissionReason = "DeleteMarked"
	AdmissionDeleteNotMarked    AdmissionReason = "DeleteNotMarked"
	AdmissionNamespaceDeletion  AdmissionReason = "NamespaceTerminating"
	AdmissionGarbageCollection  AdmissionReason = "GarbageCollection"
	AdmissionInvalidDeleteMark  AdmissionReason = "InvalidDeleteMark"
	AdmissionIdentityMismatch   AdmissionReason = "IdentityMismatch"
	// AdmissionNoLease (CEL mode only) refuses creating an object fenced by
	// a lock that has no Lease in the object's namespace; the webhook says
	// MissingEpoch or FutureEpoch there.
	AdmissionNoLease AdmissionReason = "NoLease"
	// AdmissionStatusChangesFencing refuses a write to the status
	// subresource that adds or changes a fencekeeper.io/ annotation or adds
	// an owner (some built-in kinds keep metadata sent there); in CEL mode
	// also one that would drop the lock label or such an annotation.
	AdmissionStatusChangesFencing AdmissionReason = "StatusChangesFencing"
	// AdmissionInheritedFromUnfenced refuses the write that fences an
	// object (adds the lock label) while the object keeps something it got
	// while unfenced, when anyone who could write it could have planted it:
	// fence-identity any, fence-policy monotonic, a deletion mark, an owner
	// reference (the garbage collector may delete a fenced object whose
	// owner is gone), or a deletion in progress.
	AdmissionInheritedFromUnfenced AdmissionReason = "InheritedFromUnfenced"
	// AdmissionScaleBeforeFencedWrite refuses a scale presenting the
	// current epoch to an object whose watermark is another epoch: a scale
	// cannot move the watermark, so a newer holder makes one fenced write
	// of the object first.
	AdmissionScaleBeforeFencedWrite AdmissionReason = "ScaleBeforeFencedWrite"
	// AdmissionSemaphoreNotSupported (CEL mode only) refuses every content
	// write and delete of an object whose lock's Lease records a capacity
	// (fencekeeper.io/max-holders): CEL mode does not admit writes to
	// objects of semaphore locks; webhook mode does.
	AdmissionSemaphoreNotSupported AdmissionReason = "SemaphoreNotSupported"
)

// CauseType is the details.causes[].type a denial with this reason carries.
func (r AdmissionReason) CauseType() string { return Prefix + string(r) }

// IsStaleHolder reports whether the reason says the writer's epoch was
// superseded: the object or the lock has moved on to a newer holder.
func (r AdmissionReason) IsStaleHolder() bool {
	return r == AdmissionStaleEpoch || r == AdmissionNotCurrentEpoch
}

// PodUIDExtra is the user-info extra key under which a ServiceAccount token
// bound to a pod names that pod's UID.
const PodUIDExtra = "authentication.kubernetes.io/pod-uid"

// IndexLockName is the cache index of claims by spec.lockName that the lock
// authority registers and the fencing webhook reads.
const IndexLockName = "spec.lockName"

// LeaseRequiredPolicy is the CEL-mode ValidatingAdmissionPolicy whose
// per-lock bindings (parameterNotFoundAction Deny) refuse creating an object
// fenced by a lock that has no Lease in the object's namespace.
const LeaseRequiredPolicy = "fencekeeper-lease-required"

// PolicyDenialReason reads the fencing reason from the message of a denial
// by the CEL-mode admission policies ("" when it is not one). A policy
// cannot set status causes, so its messages start with
// fencekeeper.io/<Reason>: after the apiserver's "denied request: ". The
// lease-required binding's refusal is the apiserver's own message (no
// parameter found); it reads as AdmissionNoLease.
func PolicyDenialReason(message string) AdmissionReason {
	if strings.Contains(message, "'"+LeaseRequiredPolicy+"' with binding ") &&
		strings.Contains(message, "denied request: failed to configure binding: no params found") {
		return AdmissionNoLease
	}
	_, rest, ok := strings.Cut(message, "denied request: "+Prefix)
	if !ok {
		return ""
	}
	r, _, ok := strings.Cut(rest, ":")
	if !ok || r == "" || strings.ContainsAny(r, " /") {
		return ""
	}
	return AdmissionReason(r)
}

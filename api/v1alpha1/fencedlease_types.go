package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FencedLeasePhase is where a claim is in its life.
// +kubebuilder:validation:Enum=Pending;Held;Expired
type FencedLeasePhase string

const (
	// PhasePending: the claim waits in the lock's FIFO queue.
	PhasePending FencedLeasePhase = "Pending"
	// PhaseHeld: the claim holds the lock; status.epoch is its fencing token.
	PhaseHeld FencedLeasePhase = "Held"
	// PhaseExpired: the claim held the lock and lost it (expiry or
	// supersession). Terminal: to contend again, create a new claim.
	PhaseExpired FencedLeasePhase = "Expired"
)

// FencedLeaseSpec is a holder's request for a lock.
// +kubebuilder:validation:XValidation:rule="self.lockName == oldSelf.lockName",message="lockName is immutable: create a new FencedLease to contend for another lock"
// +kubebuilder:validation:XValidation:rule="self.holderIdentity == oldSelf.holderIdentity",message="holderIdentity is immutable: create a new FencedLease for another holder"
// +kubebuilder:validation:XValidation:rule="has(self.acquireTimeoutSeconds) == has(oldSelf.acquireTimeoutSeconds)",message="acquireTimeoutSeconds is immutable: it cannot be set or removed after the claim is created"
// +kubebuilder:validation:XValidation:rule="(has(self.maxHolders) ? self.maxHolders : 1) == (has(oldSelf.maxHolders) ? oldSelf.maxHolders : 1)",message="maxHolders is immutable: create a new claim for another capacity"
type FencedLeaseSpec struct {
	// lockName names the lock in this namespace. The backing
	// coordination.k8s.io Lease and the fencekeeper.io/lock label of
	// protected objects use the same name, so it must be a DNS-1123
	// subdomain that also fits a label value (at most 63 characters).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="lockName must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (e.g. report-2026-07)"
	LockName string `json:"lockName"`

	// holderIdentity names the holder (a worker, a pod). It is copied to the
	// backing Lease's spec.holderIdentity while this claim holds the lock.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	HolderIdentity string `json:"holderIdentity"`

	// leaseDurationSeconds is the lease's time to live: the controller expires
	// the claim this long after it last observed a renewal.
	// +optional
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="leaseDurationSeconds is immutable: the TTL in force is the one recorded at grant; create a new claim for another TTL"
	LeaseDurationSeconds *int32 `json:"leaseDurationSeconds,omitempty"`

	// acquireTimeoutSeconds bounds the wait: a claim still Pending this long
	// after the authority first observed it (on its own clock) ends Expired
	// with reason AcquireTimeout and no epoch, and leaves the queue. 0 is
	// try-once: granted at the authority's first decision, or ended at
	// once. Unset: wait until granted or deleted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="acquireTimeoutSeconds is immutable: create a new claim for another deadline"
	AcquireTimeoutSeconds *int32 `json:"acquireTimeoutSeconds,omitempty"`

	// maxHolders is the lock's capacity: 1 (the default) is a mutex, more
	// makes it a semaphore whose holders each hold a permit with an epoch
	// of its own (docs/design.md §9). A lock's capacity is recorded in its
	// Lease while it has no holder; a claim asking for another capacity
	// stays Pending with reason CapacityMismatch.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="maxHolders is immutable: create a new claim for another capacity"
	MaxHolders *int32 `json:"maxHolders,omitempty"`
}

// FencedLeaseStatus is the controller's view of the claim, derived from the
// backing Lease.
type FencedLeaseStatus struct {
	// phase is Pending, Held or Expired (terminal).
	// +optional
	Phase FencedLeasePhase `json:"phase,omitempty"`

	// epoch is the fencing token issued when this claim was granted. It is
	// kept after the claim expires, so the highest epoch ever issued for a
	// lock can be recovered from its claims.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Epoch int64 `json:"epoch,omitempty"`

	// leaseName is the backing coordination.k8s.io Lease (named after the lock).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	LeaseName string `json:"leaseName,omitempty"`

	// acquireTime is when the claim was granted.
	// +optional
	AcquireTime *metav1.Time `json:"acquireTime,omitempty"`

	// renewTime is the last renewal the controller observed when it last wrote
	// this status. Renewals are written to the backing Lease only (one write
	// per renewal); read spec.renewTime of the Lease for the live value.
	// +optional
	RenewTime *metav1.Time `json:"renewTime,omitempty"`

	// expireTime is an informational wall-clock estimate of when the lease
	// expires if not renewed. Expiry itself is decided on the controller's
	// monotonic clock, never from this value.
	// +optional
	ExpireTime *metav1.Time `json:"expireTime,omitempty"`

	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Held, and LockConflict while a same-named Lease that
	// fencekeeper does not manage blocks the lock.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// FencedLease is one holder's claim on a lock. The controller grants one claim
// per lock at a time, in FIFO order, each grant with the next epoch of the lock.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=fl,categories=fencekeeper
// +kubebuilder:printcolumn:name="Lock",type=string,JSONPath=`.spec.lockName`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.spec.holderIdentity`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Epoch",type=integer,JSONPath=`.status.epoch`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.maxHolders`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FencedLease struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec FencedLeaseSpec `json:"spec"`
	// +optional
	Status FencedLeaseStatus `json:"status,omitempty"`
}

// FencedLeaseList is a list of FencedLeases.
// +kubebuilder:object:root=true
type FencedLeaseList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FencedLease `json:"items"`
}

package v1alpha1

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Ledger is what a lock's backing Lease records (docs/design.md §2): the last
// epoch issued, the claim that holds the lock and the one before it. This file
// is the one owner of that format; the authority, the admission webhook, the
// holder library and the CLI all read and write the Lease through it.
//
// +kubebuilder:object:generate=false
type Ledger struct {
	// Exists is true when the lock has a Lease fencekeeper manages (the
	// managed-by label is set).
	Exists bool
	// Epoch is the last epoch issued (0: none yet). Valid only with EpochValid.
	Epoch int64
	// EpochValid is false when the epoch annotation is missing or malformed.
	EpochValid bool
	// HolderClaim and HolderUID name the claim that holds the lock ("" when free).
	HolderClaim string
	HolderUID   types.UID
	// HolderIdentity is the Lease's spec.holderIdentity ("" when free).
	HolderIdentity string
	// HolderUser and HolderPodUID are the identity the holder claim is bound
	// to ("" for either: not bound by it).
	HolderUser, HolderPodUID string
	// PreviousUID is the claim that held the lock before the current one.
	PreviousUID types.UID
	// TimedOut are the waiting claims ended for their acquireTimeoutSeconds
	// (AnnotationTimedOutClaims): never granted.
	TimedOut []ClaimRef
	// LeaseDurationSeconds is the TTL recorded at grant (0 when unset).
	LeaseDurationSeconds int32
	// Adopted is true when the labels and finalizer of a managed Lease of
	// this lock are all present.
	Adopted bool
	// Capacity is the lock's maxHolders as recorded (AnnotationMaxHolders;
	// 0 or 1: a mutex; read it with MaxHolders). CapacityInvalid is true
	// when the annotation is malformed or out of range.
	Capacity        int32
	CapacityInvalid bool
	// Permits are a semaphore lock's live permits, by epoch (the
	// AnnotationPermitPrefix annotations). PermitsInvalid is true when one
	// is malformed: no permit can be trusted, and admission accepts none.
	Permits        []Permit
	PermitsInvalid bool
}

// Permit is one live permit of a semaphore lock, as the lock's Lease
// records it: the epoch it was granted with and the claim, holder and
// identity it was granted to. Its holder renews the Lease named
// PermitLeaseName(lock, Epoch).
//
// +kubebuilder:object:generate=false
type Permit struct {
	// Epoch is the permit's epoch: the annotation key's suffix.
	Epoch int64     `json:"-"`
	Claim string    `json:"claim"`
	UID   types.UID `json:"uid"`
	// Holder is the claim's holderIdentity.
	Holder string `json:"holder"`
	// User and PodUID are the identity the claim is bound to.
	User   string `json:"user,omitempty"`
	PodUID string `json:"podUID,omitempty"`
	// TTL is the claim's leaseDurationSeconds, recorded at grant.
	TTL int32 `json:"ttl"`
}

// PermitLeaseName is the Lease a permit's holder renews.
func PermitLeaseName(lockName string, epoch int64) string {
	return lockName + "-permit-" + strconv.FormatInt(epoch, 10)
}

// IsPermitLease reports whether lease is a permit's renewal Lease that
// fencekeeper manages, and of which lock.
func IsPermitLease(lease *coordinationv1.Lease) (lockName string, ok bool) {
	if !IsManagedLease(lease) || lease.Labels[LabelPermitEpoch] == "" {
		return "", false
	}
	return lease.Labels[LabelLock], true
}

// IsSemaphore reports whether the ledger records a capacity above 1.
func (l Ledger) IsSemaphore() bool { return l.Capacity > 1 }

// MaxHolders is the recorded capacity (1: a mutex, also when unset).
func (l Ledger) MaxHolders() int32 { return max(l.Capacity, 1) }

// IsMutexLedger reports whether the ledger is a plain mutex one: no
// capacity above 1, no permit, nothing unreadable about either.
func (l Ledger) IsMutexLedger() bool {
	return l.Capacity <= 1 && !l.CapacityInvalid && len(l.Permits) == 0 && !l.PermitsInvalid
}

// PermitOf returns the live permit granted with epoch.
func (l Ledger) PermitOf(epoch int64) (Permit, bool) {
	for _, p := range l.Permits {
		if p.Epoch == epoch {
			return p, true
		}
	}
	return Permit{}, false
}

// PermitFor returns the live permit of claim uid.
func (l Ledger) PermitFor(uid types.UID) (Permit, bool) {
	for _, p := range l.Permits {
		if uid != "" && p.UID == uid {
			return p, true
		}
	}
	return Permit{}, false
}

// permitKey is the Lease annotation of the permit granted with epoch.
func permitKey(epoch int64) string { return AnnotationPermitPrefix + strconv.FormatInt(epoch, 10) }

// parsePermits reads the permit annotations (AnnotationPermitPrefix plus
// the epoch, a JSON Permit without the epoch as value), by epoch. A key or
// value that does not parse, or a permit naming no claim, is an error.
func parsePermits(annotations map[string]string) ([]Permit, error) {
	var ps []Permit
	for k, v := range annotations {
		suffix, ok := strings.CutPrefix(k, AnnotationPermitPrefix)
		if !ok {
			continue
		}
		epoch, err := ParseEpoch(suffix)
		if err != nil {
			return nil, fmt.Errorf("permit annotation %s: %w", k, err)
		}
		p := Permit{}
		if err := json.Unmarshal([]byte(v), &p); err != nil {
			return nil, fmt.Errorf("permit annotation %s: %w", k, err)
		}
		if p.UID == "" || p.Claim == "" {
			return nil, fmt.Errorf("permit annotation %s names no claim", k)
		}
		p.Epoch = epoch
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b Permit) int { return cmp.Compare(a.Epoch, b.Epoch) })
	return ps, nil
}

// ReadLedger reads the ledger of lock lockName from its Lease (nil: no Lease).
// A Lease without the managed-by label yields a Ledger with Exists false.
func ReadLedger(lease *coordinationv1.Lease, lockName string) Ledger {
	if lease == nil {
		return Ledger{EpochValid: true}
	}
	l := Ledger{
		Exists:       IsManagedLease(lease),
		HolderClaim:  lease.Annotations[AnnotationClaim],
		HolderUID:    types.UID(lease.Annotations[AnnotationClaimUID]),
		PreviousUID:  types.UID(lease.Annotations[AnnotationPreviousClaimUID]),
		HolderUser:   lease.Annotations[AnnotationHolderUser],
		HolderPodUID: lease.Annotations[AnnotationHolderPodUID],
	}
	for ref := range strings.SplitSeq(lease.Annotations[AnnotationTimedOutClaims], ",") {
		if name, uid, ok := strings.Cut(ref, "/"); ok && name != "" && uid != "" {
			l.TimedOut = append(l.TimedOut, ClaimRef{Name: name, UID: types.UID(uid)})
		}
	}
	if v, ok := lease.Annotations[AnnotationEpoch]; ok {
		if e, err := parseCounter(v); err == nil {
			l.Epoch, l.EpochValid = e, true
		}
	}
	if lease.Spec.HolderIdentity != nil {
		l.HolderIdentity = *lease.Spec.HolderIdentity
	}
	if v, ok := lease.Annotations[AnnotationMaxHolders]; ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err == nil && n >= 1 && n <= MaxMaxHolders && strconv.FormatInt(n, 10) == v {
			l.Capacity = int32(n)
		} else {
			l.CapacityInvalid = true
		}
	}
	if ps, err := parsePermits(lease.Annotations); err == nil {
		l.Permits = ps
	} else {
		l.PermitsInvalid = true
	}
	if lease.Spec.LeaseDurationSeconds != nil {
		l.LeaseDurationSeconds = *lease.Spec.LeaseDurationSeconds
	}
	l.Adopted = l.Exists && lease.Labels[LabelLock] == lockName && slices.Contains(lease.Finalizers, LeaseFinalizer)
	return l
}

// Held reports whether the ledger names a holder.
func (l Ledger) Held() bool { return l.HolderUID != "" }

// IsNew: no epoch was ever issued from this ledger as far as it shows (no
// Lease, a Lease that never granted, or a counter nobody can read). Epochs
// written into a new ledger start at the storage revision.
func (l Ledger) IsNew() bool { return l.Epoch == 0 || !l.EpochValid }

// HeldEpoch is the epoch of the current holder: the last issued epoch while
// the lock is held, 0 while it is free or the counter is unreadable.
func (l Ledger) HeldEpoch() int64 {
	if !l.Held() || !l.EpochValid {
		return 0
	}
	return l.Epoch
}

// ApplyTo writes the ledger into lease: the managed labels, the epoch
// counter and the holder annotations (removed when the lock is free). The
// Lease's spec (holderIdentity, times, TTL) is the caller's business.
func (l Ledger) ApplyTo(lease *coordinationv1.Lease, lockName string) {
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	lease.Labels[LabelManagedBy] = ManagedByValue
	lease.Labels[LabelLock] = lockName
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[AnnotationEpoch] = strconv.FormatInt(l.Epoch, 10)
	setOrDelete(lease.Annotations, AnnotationClaim, l.HolderClaim)
	setOrDelete(lease.Annotations, AnnotationClaimUID, string(l.HolderUID))
	setOrDelete(lease.Annotations, AnnotationPreviousClaimUID, string(l.PreviousUID))
	setOrDelete(lease.Annotations, AnnotationHolderUser, l.HolderUser)
	setOrDelete(lease.Annotations, AnnotationHolderPodUID, l.HolderPodUID)
	timedOut := make([]string, len(l.TimedOut))
	for i, ref := range l.TimedOut {
		timedOut[i] = ref.Name + "/" + string(ref.UID)
	}
	setOrDelete(lease.Annotations, AnnotationTimedOutClaims, strings.Join(timedOut, ","))
	capacity := ""
	if l.Capacity > 1 {
		capacity = strconv.FormatInt(int64(l.Capacity), 10)
	}
	setOrDelete(lease.Annotations, AnnotationMaxHolders, capacity)
	for k := range lease.Annotations {
		if strings.HasPrefix(k, AnnotationPermitPrefix) {
			delete(lease.Annotations, k)
		}
	}
	for _, p := range l.Permits {
		b, _ := json.Marshal(p) // plain strings and numbers: cannot fail
		lease.Annotations[permitKey(p.Epoch)] = string(b)
	}
}

// ClaimRef names one claim of a lock.
type ClaimRef struct {
	Name string
	UID  types.UID
}

// TimedOutClaim reports whether the ledger lists claim uid as ended for its
// acquireTimeoutSeconds.
func (l Ledger) TimedOutClaim(uid types.UID) bool {
	return slices.ContainsFunc(l.TimedOut, func(r ClaimRef) bool { return r.UID == uid })
}

// IsManagedLease reports whether fencekeeper manages lease.
func IsManagedLease(lease *coordinationv1.Lease) bool {
	return lease.Labels[LabelManagedBy] == ManagedByValue
}

func setOrDelete(m map[string]string, k, v string) {
	if v == "" {
		delete(m, k)
		return
	}
	m[k] = v
}

// ParseEpoch parses a fencing token: decimal digits only, no sign, no
// spaces, no leading zero, in 1..2^63-1.
func ParseEpoch(s string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("epoch is empty; want a decimal integer in 1..%d", int64(math.MaxInt64))
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("epoch %q is not a decimal integer in 1..%d", s, int64(math.MaxInt64))
		}
	}
	if s[0] == '0' {
		return 0, fmt.Errorf("epoch %q must be in 1..%d without leading zeros", s, int64(math.MaxInt64))
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("epoch %q is out of range 1..%d", s, int64(math.MaxInt64))
	}
	return v, nil
}

// FormatEpoch formats an epoch the way ParseEpoch reads it.
func FormatEpoch(e int64) string { return strconv.FormatInt(e, 10) }

// parseCounter parses the Lease's counter: the epoch grammar, plus 0 for a
// Lease that never granted.
func parseCounter(s string) (int64, error) {
	if s == "0" {
		return 0, nil
	}
	return ParseEpoch(s)
}

// BreakRequest is who broke claim c and why, when it carries a complete
// break request (`kubectl fence break`: the reason from the breaker, the user
// recorded by admission).
func BreakRequest(c *FencedLease) (by, reason string, ok bool) {
	by, reason = c.Annotations[AnnotationBrokenBy], c.Annotations[AnnotationBreakReason]
	ok = by != "" && reason != ""
	// Admission caps the reason; a claim written without the policies may
	// carry more, which must not make the status or the Event too large to
	// write (a status the apiserver refuses would stall the lock).
	if len(reason) > MaxBreakReason {
		reason = reason[:MaxBreakReason] + "..."
	}
	return by, reason, ok
}

// RecordsNoIdentity reports whether claim c names nobody as its creator:
// it was created while the claim-identity policy was not in effect. Such a
// claim binds nobody, and admission refuses every write presenting its
// epoch (rule 9).
func RecordsNoIdentity(c *FencedLease) bool {
	return c.Annotations[AnnotationCreatedBy] == "" && c.Annotations[AnnotationCreatedByPodUID] == ""
}

// MaxBreakReason is the longest break reason admission accepts.
const MaxBreakReason = 512

package lock

import (
	"math"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

var t0 = time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC)

// claim is a claim created by user "user-<name>", as the claim-identity
// policy records it (unbound strips that record).
func claim(name string, created int, phase fkv1.FencedLeasePhase, epoch int64) *fkv1.FencedLease {
	return &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(created) * time.Second)),
			Annotations: map[string]string{fkv1.AnnotationCreatedBy: "user-" + name, fkv1.AnnotationCreatedByPodUID: ""}},
		Spec:   fkv1.FencedLeaseSpec{LockName: "report-2026-07", HolderIdentity: name, LeaseDurationSeconds: ptr.To(int32(30))},
		Status: fkv1.FencedLeaseStatus{Phase: phase, Epoch: epoch},
	}
}

// unbound is c as created while the claim-identity policy was not in
// effect: it records no identity (fkv1.RecordsNoIdentity).
func unbound(c *fkv1.FencedLease) *fkv1.FencedLease {
	c = c.DeepCopy()
	c.Annotations = nil
	return c
}

// madeByBridge is c as the pod bridge makes it for pod podUID: a controller
// reference to the pod, and the creator admission records for the
// manager's claims for pods (no user, bound to that pod).
func madeByBridge(c *fkv1.FencedLease, podUID types.UID) *fkv1.FencedLease {
	c = c.DeepCopy()
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod-" + string(podUID), UID: podUID, Controller: ptr.To(true)}}
	c.Annotations = map[string]string{fkv1.AnnotationCreatedBy: "", fkv1.AnnotationCreatedByPodUID: string(podUID)}
	return c
}

// madeByUser is c created by user with a controller reference to pod
// podUID: what admission records whatever the user sent.
func madeByUser(c *fkv1.FencedLease, user string, podUID types.UID) *fkv1.FencedLease {
	c = madeByBridge(c, podUID)
	c.Annotations = map[string]string{fkv1.AnnotationCreatedBy: user, fkv1.AnnotationCreatedByPodUID: ""}
	return c
}

// held is the ledger of a Lease naming holder at epoch, TTL 30 s.
func held(epoch int64, holder string) fkv1.Ledger {
	return fkv1.Ledger{Exists: true, Epoch: epoch, EpochValid: true, HolderClaim: holder, HolderUID: types.UID("uid-" + holder),
		Adopted: true, LeaseDurationSeconds: 30}
}

func free(epoch int64) fkv1.Ledger {
	return fkv1.Ledger{Exists: true, Epoch: epoch, EpochValid: true, Adopted: true}
}

func TestDecide(t *testing.T) {
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	w2 := claim("w2", 5, fkv1.PhasePending, 0)
	w3 := claim("w3", 3, fkv1.PhasePending, 0)
	expiredW1 := claim("w1", 0, fkv1.PhaseExpired, 41)
	withAnnotations := func(c *fkv1.FencedLease, kv ...string) *fkv1.FencedLease {
		c = c.DeepCopy()
		for i := 0; i < len(kv); i += 2 {
			c.Annotations[kv[i]] = kv[i+1]
		}
		return c
	}
	brokenW1 := withAnnotations(w1, fkv1.AnnotationBreakReason, "stuck for an hour", fkv1.AnnotationBrokenBy, "alice")
	unrecordedBreakW1 := withAnnotations(w1, fkv1.AnnotationBreakReason, "stuck for an hour")
	reasonlessBreakW1 := withAnnotations(w1, fkv1.AnnotationBrokenBy, "alice")
	cases := []struct {
		name       string
		snap       snapshot
		kind       actionKind
		holder     string
		epoch      int64
		end        holderEnd
		repaired   bool
		exhausted  bool
		unrecorded bool
		requeueMin time.Duration
	}{
		{name: "holder renewed recently keeps the lock; nothing written",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(10 * time.Second)},
			kind: actKeep, holder: "w1", epoch: 41, requeueMin: 20 * time.Second},
		{name: "holder not renewed for a full TTL expires; FIFO waiter (oldest) gets epoch+1",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2, w3}, renewSeenAt: t0, now: t0.Add(30 * time.Second)},
			kind: actGrant, holder: "w3", epoch: 42, end: holderExpired},
		{name: "one nanosecond before the TTL the holder still holds",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(30*time.Second - 1)},
			kind: actKeep, holder: "w1", epoch: 41},
		{name: "holder claim gone is released; the next waiter is granted",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w2}, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w2", epoch: 42, end: holderReleased},
		{name: "released with nobody waiting frees the lock and keeps the epoch",
			snap: snapshot{ledger: held(41, "w1"), claims: nil, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 41, end: holderReleased},
		{name: "a broken holder (reason and recorded breaker) ends at once, well inside its TTL; the next waiter gets epoch+1",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{brokenW1, w2}, renewSeenAt: t0, now: t0.Add(time.Second)},
			kind: actGrant, holder: "w2", epoch: 42, end: holderForced},
		{name: "a broken holder with nobody waiting frees the lock and keeps the epoch",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{brokenW1}, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 41, end: holderForced},
		{name: "a break reason without the breaker (recorded by admission) is ignored",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{unrecordedBreakW1, w2}, renewSeenAt: t0, now: t0.Add(time.Second)},
			kind: actKeep, holder: "w1", epoch: 41},
		{name: "a broken waiter is never granted: the next one is",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{brokenW1, withAnnotations(w3, fkv1.AnnotationBreakReason, "x", fkv1.AnnotationBrokenBy, "alice"), w2}, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w2", epoch: 42, end: holderForced},
		// A claim that records no identity (created while the
		// claim-identity policy was not in effect) is never granted (rev.
		// 3): it keeps its place, and the next waiter is granted.
		{name: "an unbound head waiter is passed over: the bound one behind it is granted",
			snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{unbound(w3), w2}, now: t0},
			kind: actGrant, holder: "w2", epoch: 42},
		{name: "the holder ends with an unbound waiter ahead of a bound one: the bound one is granted",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, unbound(w3), w2}, renewSeenAt: t0, now: t0.Add(30 * time.Second)},
			kind: actGrant, holder: "w2", epoch: 42, end: holderExpired},
		{name: "only unbound waiters: nobody is granted, the lock is freed",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, unbound(w3), unbound(w2)}, renewSeenAt: t0, now: t0.Add(30 * time.Second)},
			kind: actFree, epoch: 41, end: holderExpired},
		{name: "only an unbound waiter on a free lock: nobody is granted",
			snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{unbound(w2)}, now: t0},
			kind: actKeep, epoch: 41},
		{name: "a pod claim the bridge made (no user, its pod's UID) is bound: granted",
			snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{madeByBridge(w2, "p")}, waiterPods: map[types.UID]pods.Liveness{}, now: t0},
			kind: actGrant, holder: "w2", epoch: 42},
		{name: "a breaker without a reason is ignored",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{reasonlessBreakW1, w2}, renewSeenAt: t0, now: t0.Add(time.Second)},
			kind: actKeep, holder: "w1", epoch: 41},
		{name: "an Expired holder (terminal) gives the lock up",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{expiredW1, w2}, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w2", epoch: 42, end: holderGaveUp},
		{name: "a Lease edited below an issued epoch grants above the floor, and counts as a repair",
			snap: snapshot{ledger: free(3), claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 41, now: t0},
			kind: actGrant, holder: "w2", epoch: 42, repaired: true},
		{name: "a Lease edited below an issued epoch with nobody waiting is repaired",
			snap: snapshot{ledger: free(3), claims: []*fkv1.FencedLease{expiredW1}, floor: 41, now: t0},
			kind: actRepair, epoch: 41, repaired: true},
		// A new ledger is written from the storage revision (gather reads it
		// for every new ledger of a lock that is not idle), never from the
		// floor alone: after a restart, the floor misses epochs whose claims
		// were deleted.
		{name: "an unreadable counter nobody holds is repaired from the storage revision",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true}, claims: []*fkv1.FencedLease{expiredW1}, floor: 41, storageRevision: 5000, now: t0},
			kind: actRepair, epoch: 5000, repaired: true},
		{name: "a deleted Lease is written again from the storage revision",
			snap: snapshot{claims: []*fkv1.FencedLease{expiredW1}, floor: 41, storageRevision: 5000, now: t0},
			kind: actRepair, epoch: 5000, repaired: true},
		{name: "without the storage revision, a new ledger nobody holds is not written",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true}, claims: []*fkv1.FencedLease{expiredW1}, floor: 41, now: t0},
			kind: actKeep, epoch: 41, repaired: true},
		{name: "a holder's claim still Held after its Lease was deleted: a Lease at the storage revision ends it",
			snap: snapshot{claims: []*fkv1.FencedLease{w1}, floor: 41, storageRevision: 5000, now: t0},
			kind: actRepair, epoch: 5000, repaired: true},
		{name: "a holder gone from a ledger whose counter is unreadable: freed at the storage revision",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true, HolderClaim: "w1", HolderUID: "uid-w1", LeaseDurationSeconds: 30},
				claims: []*fkv1.FencedLease{expiredW1}, floor: 41, storageRevision: 5000, now: t0},
			kind: actFree, epoch: 5000, end: holderGaveUp, repaired: true},
		// A grant is the pair (claim UID, epoch): a holder whose epoch the
		// Lease can no longer show is never given another one (these rows
		// kept it at a fresh epoch before rev. 3). Its hold ends, and the
		// lock goes to the next waiter, or is freed, from the storage
		// revision.
		{name: "a holder whose grant no status recorded, on an unreadable counter: its hold ends, the lock is freed at the storage revision",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true, HolderClaim: "w2", HolderUID: "uid-w2", LeaseDurationSeconds: 30},
				claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 41, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 5000, end: holderEpochLost, repaired: true},
		{name: "the same with a waiter: the waiter is granted at the storage revision, never the same claim again",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true, HolderClaim: "w2", HolderUID: "uid-w2", LeaseDurationSeconds: 30},
				claims: []*fkv1.FencedLease{expiredW1, w2, w3}, floor: 41, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w3", epoch: 5000, end: holderEpochLost, repaired: true},
		{name: "the same without the storage revision: nothing is written, and the holder is not kept",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true, HolderClaim: "w2", HolderUID: "uid-w2", LeaseDurationSeconds: 30},
				claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 41, renewSeenAt: t0, now: t0},
			kind: actKeep, epoch: 41, unrecorded: true},
		{name: "a holder whose grant no status recorded, on a counter set back to the previous holder's epoch: its hold ends, freed at the storage revision",
			snap: snapshot{ledger: held(41, "w2"), claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 41, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 5000, end: holderEpochLost, repaired: true},
		{name: "the same with a waiter: the waiter is granted at the storage revision",
			snap: snapshot{ledger: held(41, "w2"), claims: []*fkv1.FencedLease{expiredW1, w2, w3}, floor: 41, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w3", epoch: 5000, end: holderEpochLost},
		{name: "a holder whose grant no status recorded, on a counter below an epoch this process issued: its hold ends, freed at the storage revision",
			snap: snapshot{ledger: held(30, "w2"), claims: []*fkv1.FencedLease{w2}, floor: 42, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 5000, end: holderEpochLost, repaired: true},
		{name: "a holder whose grant no status recorded, on a set-back counter, when epochs were raised by hand above the storage revision: its hold ends; the waiter gets one above everything issued",
			snap: snapshot{ledger: held(9000000, "w2"), claims: []*fkv1.FencedLease{claim("w1", 0, fkv1.PhaseExpired, 9000000), w2, w3}, floor: 9000000, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w3", epoch: 9000001, end: holderEpochLost},
		{name: "a holder whose grant no status recorded, on a set-back counter, without the storage revision: nothing written, not shown Held",
			snap: snapshot{ledger: held(41, "w2"), claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 41, renewSeenAt: t0, now: t0},
			kind: actKeep, epoch: 41, unrecorded: true},
		{name: "a holder whose status records its epoch, below one issued after it (the counter set back, then raised past it): its hold ends; the waiter gets the next epoch",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, claim("x", 0, fkv1.PhaseExpired, 45), w2}, floor: 45, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w2", epoch: 46, end: holderEpochLost, repaired: true},
		{name: "the same with nobody waiting: freed at the epoch issued last, never re-epoched",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, claim("x", 0, fkv1.PhaseExpired, 45)}, floor: 45, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 45, end: holderEpochLost, repaired: true},
		{name: "a holder whose Lease counter was raised past its recorded epoch: its hold ends",
			snap: snapshot{ledger: held(45, "w1"), claims: []*fkv1.FencedLease{w1, w2}, floor: 45, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w2", epoch: 46, end: holderEpochLost},
		{name: "a holder whose counter was set back below its own recorded epoch keeps it: the repair restores that epoch",
			snap: snapshot{ledger: held(3, "w1"), claims: []*fkv1.FencedLease{w1, w2}, floor: 41, renewSeenAt: t0, now: t0},
			kind: actRepair, holder: "w1", epoch: 41, repaired: true},
		{name: "a holder whose grant no status recorded, on a set-back counter, expired with a waiter, without the storage revision: nothing written, not shown Held",
			snap: snapshot{ledger: held(41, "w2"), claims: []*fkv1.FencedLease{expiredW1, w2, w3}, floor: 41, renewSeenAt: t0, now: t0.Add(time.Minute)},
			kind: actKeep, epoch: 41, unrecorded: true},
		{name: "a holder whose grant no status recorded, on a set-back counter, expired, without the storage revision: nothing written, not shown Held",
			snap: snapshot{ledger: held(41, "w2"), claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 41, renewSeenAt: t0, now: t0.Add(time.Minute)},
			kind: actKeep, epoch: 41, unrecorded: true},
		{name: "a holder whose grant no status recorded, on a counter above every other epoch: that counter is its grant, nothing written",
			snap: snapshot{ledger: held(42, "w2"), claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 42, renewSeenAt: t0, now: t0},
			kind: actKeep, holder: "w2", epoch: 42},
		{name: "a new ledger without the storage revision grants nobody",
			snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, claims: []*fkv1.FencedLease{w2}, floor: 41, now: t0},
			kind: actKeep, epoch: 41},
		{name: "a holder whose claim is gone, on a counter set back to an earlier holder's epoch, with nobody waiting: freed at the storage revision",
			snap: snapshot{ledger: held(41, "w2"), claims: []*fkv1.FencedLease{expiredW1}, floor: 41, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 5000, end: holderReleased, repaired: true},
		{name: "the same with a waiter: granted at the storage revision",
			snap: snapshot{ledger: held(41, "w2"), claims: []*fkv1.FencedLease{expiredW1, w3}, floor: 41, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w3", epoch: 5000, end: holderReleased},
		{name: "a holder whose status records its epoch, on an unreadable counter: repaired to that epoch",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true, HolderClaim: "w1", HolderUID: "uid-w1", LeaseDurationSeconds: 30},
				claims: []*fkv1.FencedLease{w1, w2}, floor: 41, storageRevision: 5000, renewSeenAt: t0, now: t0},
			kind: actRepair, holder: "w1", epoch: 41, repaired: true},
		{name: "the grant on an unreadable counter starts at the storage revision",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true}, claims: []*fkv1.FencedLease{expiredW1, w2},
				floor: 41, storageRevision: 5000, now: t0},
			kind: actGrant, holder: "w2", epoch: 5000, repaired: true},
		{name: "an Expired or once-held claim is never granted again",
			snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{expiredW1, claim("x", 0, fkv1.PhasePending, 7)}, now: t0},
			kind: actKeep, epoch: 41},
		{name: "the previous holder (status never written) is not granted again",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Epoch: 41, EpochValid: true, Adopted: true, PreviousUID: "uid-w2"},
				claims: []*fkv1.FencedLease{w2}, now: t0},
			kind: actKeep, epoch: 41},
		{name: "a Lease missing its finalizer is adopted",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Epoch: 5, EpochValid: true}, claims: []*fkv1.FencedLease{expiredW1}, now: t0},
			kind: actRepair, epoch: 5},
		{name: "a new ledger's first epoch is the storage revision",
			snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, claims: []*fkv1.FencedLease{w2}, storageRevision: 1234, now: t0},
			kind: actGrant, holder: "w2", epoch: 1234},
		{name: "a new ledger never starts below an epoch still remembered",
			snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, claims: []*fkv1.FencedLease{expiredW1, w2}, floor: 5000, storageRevision: 1234, now: t0},
			kind: actGrant, holder: "w2", epoch: 5001, repaired: true},
		{name: "a ledger whose counter was lost restarts at the storage revision",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true}, claims: []*fkv1.FencedLease{w2}, storageRevision: 1234, now: t0},
			kind: actGrant, holder: "w2", epoch: 1234, repaired: true},
		{name: "ties in creationTimestamp go by name",
			snap: snapshot{ledger: fkv1.Ledger{EpochValid: true}, claims: []*fkv1.FencedLease{claim("b", 1, "", 0), claim("a", 1, "", 0)}, storageRevision: 1, now: t0},
			kind: actGrant, holder: "a", epoch: 1},
		{name: "the TTL in force is the one the Lease recorded at grant, not the claim's",
			snap: snapshot{ledger: func() fkv1.Ledger { l := held(41, "w1"); l.LeaseDurationSeconds = 60; return l }(),
				claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(45 * time.Second)},
			kind: actKeep, holder: "w1", epoch: 41, requeueMin: 15 * time.Second},
		{name: "a holder whose Lease TTL was cut below its claim's (an edit after the grant) keeps the claim's, and the Lease is repaired",
			snap: snapshot{ledger: func() fkv1.Ledger { l := held(41, "w1"); l.LeaseDurationSeconds = 10; return l }(),
				claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(10 * time.Second)},
			kind: actRepair, holder: "w1", epoch: 41, requeueMin: 19 * time.Second},
		{name: "... and expires on the claim's",
			snap: snapshot{ledger: func() fkv1.Ledger { l := held(41, "w1"); l.LeaseDurationSeconds = 10; return l }(),
				claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(30 * time.Second)},
			kind: actGrant, holder: "w2", epoch: 42, end: holderExpired},
		{name: "a Lease that lost its TTL is repaired from the holder's claim",
			snap: snapshot{ledger: func() fkv1.Ledger { l := held(41, "w1"); l.LeaseDurationSeconds = 0; return l }(),
				claims: []*fkv1.FencedLease{w1}, renewSeenAt: t0, now: t0},
			kind: actRepair, holder: "w1", epoch: 41},

		// The epoch counter never wraps.
		{name: "a lock at the largest epoch grants nobody and says why",
			snap: snapshot{ledger: free(math.MaxInt64), claims: []*fkv1.FencedLease{w2}, now: t0},
			kind: actKeep, epoch: math.MaxInt64, exhausted: true},
		{name: "a holder at the largest epoch keeps it; when it ends, the lock is freed, not wrapped",
			snap: snapshot{ledger: held(math.MaxInt64, "w1"), claims: []*fkv1.FencedLease{w2}, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: math.MaxInt64, end: holderReleased, exhausted: true},
		{name: "an idle lock (no claims, nobody holds) does nothing",
			snap: snapshot{ledger: free(41), hasLease: true, now: t0},
			kind: actIdle, epoch: 0},
		{name: "a deleted Lease with no claims left is let go",
			snap: snapshot{ledger: free(41), hasLease: true, leaseDeleting: true, now: t0},
			kind: actReleaseFinalizer},
		{name: "a deleted Lease that still has claims keeps its finalizer and keeps granting",
			snap: snapshot{ledger: free(41), hasLease: true, leaseDeleting: true, claims: []*fkv1.FencedLease{w2}, now: t0},
			kind: actGrant, holder: "w2", epoch: 42},

		// Owner references another writer left on the Lease go (the manager
		// sets none), held, free or idle, in a repair that is no renewal.
		{name: "owners on a held Lease: a repair that keeps the holder, its epoch and its TTL clock",
			snap: snapshot{ledger: held(41, "w1"), hasLease: true, foreignOwners: true, claims: []*fkv1.FencedLease{w1, w2}, renewSeenAt: t0, now: t0.Add(10 * time.Second)},
			kind: actRepair, holder: "w1", epoch: 41, requeueMin: 20 * time.Second},
		{name: "owners on an idle Lease (no claims, nobody holds): repaired, not left idle",
			snap: snapshot{ledger: free(41), hasLease: true, foreignOwners: true, now: t0},
			kind: actRepair, epoch: 41},
		{name: "owners on a free Lease whose waiters are not ready: repaired, nobody granted",
			snap: snapshot{ledger: free(41), hasLease: true, foreignOwners: true, claims: []*fkv1.FencedLease{w3}, waiterPods: map[types.UID]pods.Liveness{w3.UID: pods.NotLive}, now: t0},
			kind: actRepair, epoch: 41},
		{name: "owners on an idle Lease whose counter is unreadable: written from the storage revision, never the floor alone",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true}, hasLease: true, foreignOwners: true, floor: 41, storageRevision: 5000, now: t0},
			kind: actRepair, epoch: 5000, repaired: true},
		{name: "... and without the storage revision, nothing is written yet",
			snap: snapshot{ledger: fkv1.Ledger{Exists: true, Adopted: true}, hasLease: true, foreignOwners: true, floor: 41, now: t0},
			kind: actKeep, epoch: 41, repaired: true},
		{name: "owners on a deleted Lease with no claims left: let go, not repaired",
			snap: snapshot{ledger: free(41), hasLease: true, leaseDeleting: true, foreignOwners: true, now: t0},
			kind: actReleaseFinalizer},
		{name: "owners on a deleted Lease whose holder keeps it: no write for them",
			snap: snapshot{ledger: held(41, "w1"), hasLease: true, leaseDeleting: true, foreignOwners: true, claims: []*fkv1.FencedLease{w1}, renewSeenAt: t0, now: t0},
			kind: actKeep, holder: "w1", epoch: 41},
		{name: "a foreign Lease blocks the lock whatever waits",
			snap: snapshot{foreign: "not ours", claims: []*fkv1.FencedLease{w2}, now: t0},
			kind: actForeign},

		// Pod-held leases: the pod's liveness stands in for renewals.
		{name: "pod: a live holder pod keeps the lock long after its last observed change",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, holderPod: pods.Live, renewSeenAt: t0, now: t0.Add(time.Hour)},
			kind: actKeep, holder: "w1", epoch: 41, requeueMin: 30 * time.Second},
		{name: "pod: a holder pod not ready for less than a TTL keeps the lock",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, holderPod: pods.NotLive, renewSeenAt: t0, now: t0.Add(29 * time.Second)},
			kind: actKeep, holder: "w1", epoch: 41},
		{name: "pod: a holder pod not ready for a full TTL expires; the next waiter is granted",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, holderPod: pods.NotLive, renewSeenAt: t0, now: t0.Add(30 * time.Second)},
			kind: actGrant, holder: "w2", epoch: 42, end: holderExpired},
		{name: "pod: a gone holder pod releases at once, before any TTL",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, holderPod: pods.Gone, renewSeenAt: t0, now: t0},
			kind: actGrant, holder: "w2", epoch: 42, end: holderReleased},
		{name: "pod: a waiter whose pod is not ready keeps its place; the ready one behind it is granted",
			snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{w3, w2}, waiterPods: map[types.UID]pods.Liveness{w3.UID: pods.NotLive}, now: t0},
			kind: actGrant, holder: "w2", epoch: 42},
		{name: "pod: no waiter ready, nobody is granted",
			snap: snapshot{ledger: free(41), claims: []*fkv1.FencedLease{w3, w2}, waiterPods: map[types.UID]pods.Liveness{w3.UID: pods.NotLive, w2.UID: pods.NotLive}, now: t0},
			kind: actKeep, epoch: 41},
		{name: "pod: the holder expires with no ready waiter: the lock is freed, not granted",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, w2}, waiterPods: map[types.UID]pods.Liveness{w2.UID: pods.NotLive}, renewSeenAt: t0, now: t0.Add(time.Minute)},
			kind: actFree, epoch: 41, end: holderExpired},
		{name: "pod: a gone holder pod with nobody waiting frees the lock",
			snap: snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1}, holderPod: pods.Gone, renewSeenAt: t0, now: t0},
			kind: actFree, epoch: 41, end: holderReleased},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := decide(tc.snap)
			if a.kind != tc.kind {
				t.Errorf("kind = %v, want %v", a.kind, tc.kind)
			}
			got := ""
			if a.holder != nil {
				got = a.holder.Name
			}
			if got != tc.holder {
				t.Errorf("holder = %q, want %q", got, tc.holder)
			}
			if a.epoch != tc.epoch {
				t.Errorf("epoch = %d, want %d", a.epoch, tc.epoch)
			}
			if a.end != tc.end {
				t.Errorf("end = %q, want %q", a.end, tc.end)
			}
			if a.repaired != tc.repaired {
				t.Errorf("repaired = %v, want %v", a.repaired, tc.repaired)
			}
			if a.unrecorded != tc.unrecorded && (tc.unrecorded || a.kind == actKeep) {
				// A no-write keep must carry it: act's status syncs use it.
				t.Errorf("unrecorded = %v, want %v", a.unrecorded, tc.unrecorded)
			}
			if a.exhausted != tc.exhausted {
				t.Errorf("exhausted = %v, want %v", a.exhausted, tc.exhausted)
			}
			if a.requeueAfter < tc.requeueMin {
				t.Errorf("requeueAfter = %v, want >= %v", a.requeueAfter, tc.requeueMin)
			}
		})
	}
}

// A claim is pod-held only when the pod bridge made it for that pod (rev.
// 3): a controller reference to a ready pod on a hand-made claim gives it
// no liveness, and it expires a TTL after its last renewal like any claim.
// holderPod's decision (podLiveness) feeds decide, as gather does.
func TestHandMadeClaimBorrowsNoPodLiveness(t *testing.T) {
	readyPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-p", UID: "p"}, Spec: corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.ContainersReady, Status: corev1.ConditionTrue}}}}
	readyNode := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	w1, w2 := claim("w1", 0, fkv1.PhaseHeld, 41), claim("w2", 5, fkv1.PhasePending, 0)
	bridgeMovedToP := madeByBridge(w1, "other-pod")
	bridgeMovedToP.OwnerReferences[0].UID = "p"
	noRecord := madeByBridge(w1, "p")
	noRecord.Annotations = nil
	cases := []struct {
		name   string
		holder *fkv1.FencedLease
		live   pods.Liveness
		// after one TTL without a renewal, and after an hour
		atTTL, atHour actionKind
	}{
		{"made by the bridge for the ready pod: kept while the pod is ready", madeByBridge(w1, "p"), pods.Live, actKeep, actKeep},
		{"made by a user with a controller reference to the ready pod: expires after its TTL", madeByUser(w1, "mallory", "p"), pods.NotAPod, actGrant, actGrant},
		{"recording no creator, controller reference to the ready pod: expires after its TTL", noRecord, pods.NotAPod, actGrant, actGrant},
		{"made by the bridge for another pod, reference moved to the ready pod: expires after its TTL", bridgeMovedToP, pods.NotAPod, actGrant, actGrant},
		{"a plain claim: expires after its TTL", w1, pods.NotAPod, actGrant, actGrant},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			live, _, err := podLiveness(tc.holder, readyPod, readyNode)
			if err != nil || live != tc.live {
				t.Errorf("podLiveness = %v (%v), want %v", live, err, tc.live)
			}
			for _, at := range []struct {
				after time.Duration
				want  actionKind
			}{{30 * time.Second, tc.atTTL}, {time.Hour, tc.atHour}} {
				a := decide(snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{tc.holder, w2}, holderPod: live,
					renewSeenAt: t0, now: t0.Add(at.after)})
				if a.kind != at.want {
					t.Fatalf("%v without a renewal: kind = %v, want %v", at.after, a.kind, at.want)
				}
				if at.want == actGrant && (a.end != holderExpired || a.holder != w2) {
					t.Fatalf("%v without a renewal: end %q, grant to %v; want Expired, w2", at.after, a.end, a.holder)
				}
			}
		})
	}

	// A waiter: only a bridge claim waits for its pod to be ready; a
	// hand-made one naming a pod that is not ready is granted like any.
	notReady := readyPod.DeepCopy()
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	for _, tc := range []struct {
		name    string
		waiter  *fkv1.FencedLease
		granted bool
	}{
		{"bridge claim of a pod not ready keeps its place", madeByBridge(w2, "p"), false},
		{"hand-made claim naming a pod not ready is granted", madeByUser(w2, "mallory", "p"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live, _, _ := podLiveness(tc.waiter, notReady, readyNode)
			var waiterPods map[types.UID]pods.Liveness
			if live != pods.NotAPod && live != pods.Live {
				waiterPods = map[types.UID]pods.Liveness{tc.waiter.UID: live}
			}
			a := decide(snapshot{ledger: free(41), claims: []*fkv1.FencedLease{tc.waiter}, waiterPods: waiterPods, now: t0})
			if got := a.kind == actGrant; got != tc.granted {
				t.Fatalf("granted = %v (%v), want %v", got, a.kind, tc.granted)
			}
		})
	}
}

// An unbound waiter passed over (decide) stays Pending with a condition
// saying why and how to fix it, and its Warning Event is said once: when
// the condition first says it, not at every reconcile.
func TestDesiredStatusOfAnUnboundWaiter(t *testing.T) {
	head := unbound(claim("w3", 3, "", 0))
	after := held(42, "w2") // the bound waiter behind it was granted
	lease := &coordinationv1.Lease{}
	for _, in := range []statusInputs{{lease: lease, ledger: after}, {lease: lease, ledger: free(41)}, {foreign: "not ours", ledger: free(41)}} {
		st, tr := desiredStatus(head, in)
		cond := meta.FindStatusCondition(st.Conditions, fkv1.ConditionHeld)
		if st.Phase != fkv1.PhasePending || st.Epoch != 0 || cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != fkv1.ReasonNoIdentity {
			t.Fatalf("new unbound claim: got %s epoch %d %+v, want Pending with Held=False %s", st.Phase, st.Epoch, cond, fkv1.ReasonNoIdentity)
		}
		for _, want := range []string{"records no identity", "claim-identity policy was not in effect", "delete it and create it again"} {
			if !strings.Contains(cond.Message, want) {
				t.Fatalf("condition message %q does not say %q", cond.Message, want)
			}
		}
		if tr != fkv1.ReasonNoIdentity {
			t.Fatalf("first status of an unbound claim: transition %q, want %q (one Warning Event)", tr, fkv1.ReasonNoIdentity)
		}
		again := head.DeepCopy()
		again.Status = st
		st2, tr2 := desiredStatus(again, in)
		if tr2 != "" || !statusEqual(st2, st) {
			t.Fatalf("second reconcile: transition %q, status changed %v: want no write and no second Event", tr2, !statusEqual(st2, st))
		}
	}
	// A claim queued before the rule (Pending, Queued) is told once too.
	queued := unbound(claim("w3", 3, fkv1.PhasePending, 0))
	queued.Status.Conditions = []metav1.Condition{{Type: fkv1.ConditionHeld, Status: metav1.ConditionFalse, Reason: fkv1.ReasonQueued}}
	if _, tr := desiredStatus(queued, statusInputs{lease: lease, ledger: after}); tr != fkv1.ReasonNoIdentity {
		t.Fatalf("queued unbound claim: transition %q, want %q", tr, fkv1.ReasonNoIdentity)
	}
	// The bound waiter is shown Held.
	if st, _ := desiredStatus(claim("w2", 5, fkv1.PhasePending, 0), statusInputs{lease: lease, ledger: after}); st.Phase != fkv1.PhaseHeld {
		t.Fatalf("bound waiter granted: phase %s, want Held", st.Phase)
	}
}

func TestDesiredStatusNeverLeavesExpired(t *testing.T) {
	c := claim("w1", 0, fkv1.PhaseExpired, 41)
	st, tr := desiredStatus(c, statusInputs{ledger: held(41, "w1")})
	if st.Phase != fkv1.PhaseExpired || tr != "" {
		t.Fatalf("Expired claim moved to %s (%s)", st.Phase, tr)
	}
}

// The holder whose hold ended because the Lease could not keep its epoch
// goes Expired (terminal: never granted again) as Superseded, saying why,
// whether or not its grant was ever shown.
func TestDesiredStatusEndsAHolderWhoseEpochWasLost(t *testing.T) {
	for _, c := range []*fkv1.FencedLease{claim("w2", 0, fkv1.PhasePending, 0), claim("w1", 0, fkv1.PhaseHeld, 41)} {
		after := free(5000)
		after.PreviousUID = c.UID
		st, tr := desiredStatus(c, statusInputs{lease: &coordinationv1.Lease{}, ledger: after, epochLostUID: string(c.UID)})
		cond := meta.FindStatusCondition(st.Conditions, fkv1.ConditionHeld)
		if st.Phase != fkv1.PhaseExpired || tr != transitionEpochLost || cond == nil || cond.Reason != fkv1.ReasonSuperseded {
			t.Fatalf("%s: got %s (%s, %+v), want Expired, Superseded", c.Name, st.Phase, tr, cond)
		}
		if st.Epoch != c.Status.Epoch {
			t.Fatalf("%s: epoch %d, want the one it had (%d)", c.Name, st.Epoch, c.Status.Epoch)
		}
		ended := c.DeepCopy()
		ended.Status = st
		if grantable(ended, fkv1.Ledger{Exists: true, Epoch: 5001, EpochValid: true}) {
			t.Fatalf("%s: an ended holder is grantable again once the Lease forgets it", c.Name)
		}
	}
}

func TestDesiredStatusIgnoresALeaseOlderThanTheGrant(t *testing.T) {
	// A cache behind another controller's grant of epoch 42 to w1 shows the
	// Lease at epoch 41 held by someone else: w1 must not be demoted.
	c := claim("w1", 0, fkv1.PhaseHeld, 42)
	st, _ := desiredStatus(c, statusInputs{ledger: held(41, "w0")})
	if st.Phase != fkv1.PhaseHeld {
		t.Fatalf("demoted on a stale Lease: %s", st.Phase)
	}
	// The Lease at or past the grant, naming someone else: demoted.
	st, tr := desiredStatus(c, statusInputs{ledger: held(43, "w2")})
	if st.Phase != fkv1.PhaseExpired || tr != fkv1.ReasonSuperseded {
		t.Fatalf("got %s/%s, want Expired/Superseded", st.Phase, tr)
	}
}

func TestDesiredStatusGrantsNoEpochFromALostCounter(t *testing.T) {
	// The Lease names w2, whose grant was never written to its status, and
	// its counter is unreadable: nothing says which epoch w2 was granted.
	c := claim("w2", 0, fkv1.PhasePending, 0)
	lost := fkv1.Ledger{Exists: true, Adopted: true, HolderClaim: "w2", HolderUID: "uid-w2"}
	st, tr := desiredStatus(c, statusInputs{lease: &coordinationv1.Lease{}, ledger: lost})
	if st.Phase == fkv1.PhaseHeld || tr != "" {
		t.Fatalf("granted from a lost counter: %s with epoch %d (%s)", st.Phase, st.Epoch, tr)
	}
	// A readable counter that cannot be its grant's epoch (decide's
	// grantUnrecorded): the same.
	st, tr = desiredStatus(c, statusInputs{lease: &coordinationv1.Lease{}, ledger: held(41, "w2"), unrecorded: true})
	if st.Phase == fkv1.PhaseHeld || tr != "" {
		t.Fatalf("granted from a set-back counter: %s with epoch %d (%s)", st.Phase, st.Epoch, tr)
	}
	// A claim shown Held without an epoch (never written since this rule)
	// gets the Lease's.
	heldNoEpoch := claim("w2", 0, fkv1.PhaseHeld, 0)
	if st, _ = desiredStatus(heldNoEpoch, statusInputs{lease: &coordinationv1.Lease{}, ledger: held(5000, "w2")}); st.Epoch != 5000 {
		t.Fatalf("a Held claim without an epoch kept %d, want 5000", st.Epoch)
	}
	// Once the Lease is repaired, it is granted the repaired epoch.
	lost.Epoch, lost.EpochValid = 5000, true
	st, tr = desiredStatus(c, statusInputs{lease: &coordinationv1.Lease{}, ledger: lost})
	if st.Phase != fkv1.PhaseHeld || st.Epoch != 5000 || tr != fkv1.ReasonGranted {
		t.Fatalf("got %s with epoch %d (%s), want Held with 5000", st.Phase, st.Epoch, tr)
	}
}

func TestRenewClockUsesItsOwnClock(t *testing.T) {
	fc := &fakeClock{now: t0}
	var c lockMemory
	seen, watched := c.observe(renewal{holderUID: "uid-w1", renewTime: "09:00:00"}, fc.now)
	if watched {
		t.Fatal("a first look counts as a watched renewal: a restarted or resumed authority would vouch for a holder it never saw renew")
	}
	fc.now = fc.now.Add(20 * time.Second)
	if got, watched := c.observe(renewal{holderUID: "uid-w1", renewTime: "09:00:00"}, fc.now); !got.Equal(seen) || watched {
		t.Fatalf("unchanged renewTime moved the observation to %v (watched %v)", got, watched)
	}
	// A renewTime written with a clock far in the past or future counts only
	// as "changed": the observation is our own now.
	if got, watched := c.observe(renewal{holderUID: "uid-w1", renewTime: "1999-01-01T00:00:00Z"}, fc.now); !got.Equal(fc.now) || !watched {
		t.Fatalf("observation = %v (watched %v), want our now %v, watched", got, watched, fc.now)
	}
	// A pod holder's liveness changing is a new observation too.
	fc.now = fc.now.Add(time.Second)
	if got, _ := c.observe(renewal{holderUID: "uid-w1", pod: pods.NotLive}, fc.now); !got.Equal(fc.now) {
		t.Fatalf("pod liveness change not observed: %v", got)
	}
}

// A pod holder's containers stopping being ready at another time than the
// last look saw renews its lease only between two looks that both saw a
// time: they were ready in between. A time appearing or going away (the
// node turned not Ready, the containers flipped while it was) is not one:
// the pod was never live, and its TTL keeps running from the first look.
func TestPodNotReadySinceRenewsOnlyBetweenTwoTimes(t *testing.T) {
	fc := &fakeClock{now: t0}
	var c lockMemory
	look := func(since string) time.Time {
		fc.now = fc.now.Add(time.Second)
		at, _ := c.observe(renewal{holderUID: "uid-w1", pod: pods.NotLive, podNotReadySince: since}, fc.now)
		return at
	}
	first := look("09:00:10")
	steps := []struct {
		since   string
		renewed bool
	}{
		{"09:00:10", false}, // the same not-ready spell
		{"", false},         // its node turned not Ready
		{"09:00:12", false}, // back on a Ready node, with a flip in between: no proof it was live
		{"09:00:12", false},
		{"09:00:15", true}, // ready and not ready again between two such looks
		{"", false},
		{"", false}, // containers flipping on a node that is not Ready
	}
	want := first
	for i, st := range steps {
		got := look(st.since)
		if st.renewed {
			want = fc.now
		}
		if !got.Equal(want) {
			t.Fatalf("step %d (%q): TTL runs from %v, want %v", i, st.since, got.Sub(t0), want.Sub(t0))
		}
	}
}

func TestEpochFloorsNeverGoDown(t *testing.T) {
	var f lockMemory
	f.raiseFloor(42)
	if got := f.raiseFloor(7, 0); got != 42 {
		t.Fatalf("floor went down to %d", got)
	}
}

type fakeClock struct{ now time.Time }

func (f *fakeClock) Now() time.Time                  { return f.now }
func (f *fakeClock) Since(t time.Time) time.Duration { return f.now.Sub(t) }

func TestFreshViewLapsesOnTheAuthoritysClock(t *testing.T) {
	fc := &fakeClock{now: t0}
	r := NewReconciler(nil, nil, nil, Options{Clock: fc})
	r.term.caughtUp.Store(true) // its term has begun
	lock := types.NamespacedName{Namespace: "reports", Name: "report-2026-07"}
	if _, _, ok := r.FreshView(lock); ok {
		t.Fatal("a lock never decided on is vouched for")
	}
	r.memory.publishView(lock, View{HeldEpoch: 41, Floor: 41, deadline: t0.Add(30 * time.Second)})
	r.EndTerm()
	if _, _, ok := r.FreshView(lock); ok {
		t.Fatal("vouched for a holder after this process's term ended")
	}
	r.term.caughtUp.Store(true)
	fc.now = t0.Add(29 * time.Second)
	if held, _, ok := r.FreshView(lock); !ok || held != 41 {
		t.Fatalf("fresh view before the deadline: %d %v", held, ok)
	}
	fc.now = t0.Add(30 * time.Second)
	if _, _, ok := r.FreshView(lock); ok {
		t.Fatal("vouched for a holder whose lease lapsed on our clock")
	}
	r.memory.publishView(lock, View{})
	if _, _, ok := r.FreshView(lock); ok {
		t.Fatal("a withdrawn view is still vouched for")
	}
}

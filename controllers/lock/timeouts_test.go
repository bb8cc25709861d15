package lock

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// bounded is claim c with spec.acquireTimeoutSeconds = seconds.
func bounded(c *fkv1.FencedLease, seconds int32) *fkv1.FencedLease {
	c = c.DeepCopy()
	c.Spec.AcquireTimeoutSeconds = ptr.To(seconds)
	return c
}

func withTimedOut(l fkv1.Ledger, names ...string) fkv1.Ledger {
	for _, n := range names {
		l.TimedOut = append(l.TimedOut, fkv1.ClaimRef{Name: n, UID: types.UID("uid-" + n)})
	}
	return l
}

func refNames(refs []fkv1.ClaimRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Name)
	}
	return out
}

func TestAcquireTimeouts(t *testing.T) {
	now := t0.Add(time.Hour)
	w1 := claim("w1", 0, fkv1.PhaseHeld, 41)
	for _, tc := range []struct {
		name         string
		snap         snapshot
		wantKind     actionKind
		wantHolder   string
		wantTimedOut []string
		wantWake     time.Duration
	}{
		{
			name:         "try-once behind a holder: timed out at the first decision, in a Lease write that keeps the holder",
			snap:         snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, bounded(claim("w2", 1, "", 0), 0)}, firstSeen: map[types.UID]time.Time{"uid-w2": now}},
			wantKind:     actRepair,
			wantHolder:   "w1",
			wantTimedOut: []string{"w2"},
		},
		{
			name:       "try-once on a free lock: granted",
			snap:       snapshot{ledger: free(41), claims: []*fkv1.FencedLease{bounded(claim("w2", 1, "", 0), 0)}, firstSeen: map[types.UID]time.Time{"uid-w2": now}},
			wantKind:   actGrant,
			wantHolder: "w2",
		},
		{
			name:     "a wait not yet run out: nothing written, woken when it does",
			snap:     snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, bounded(claim("w2", 1, "", 0), 10)}, firstSeen: map[types.UID]time.Time{"uid-w2": now.Add(-4 * time.Second)}},
			wantKind: actKeep, wantHolder: "w1", wantWake: 6 * time.Second,
		},
		{
			name:         "counted from when this process first observed it, not from creationTimestamp",
			snap:         snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{w1, bounded(claim("w2", 1, "", 0), 10)}, firstSeen: map[types.UID]time.Time{"uid-w2": now.Add(-10 * time.Second)}},
			wantKind:     actRepair,
			wantHolder:   "w1",
			wantTimedOut: []string{"w2"},
		},
		{
			name:         "a listed claim is never granted: the one behind it is, and the list is kept",
			snap:         snapshot{ledger: withTimedOut(free(41), "w2"), claims: []*fkv1.FencedLease{bounded(claim("w2", 1, fkv1.PhasePending, 0), 0), claim("w3", 2, fkv1.PhasePending, 0)}},
			wantKind:     actGrant,
			wantHolder:   "w3",
			wantTimedOut: []string{"w2"},
		},
		{
			name: "a write drops listed claims seen ended (Expired here, or gone by a live read), and keeps one the cache does not show",
			snap: snapshot{ledger: withTimedOut(free(41), "gone", "unseen", "w2", "w4"),
				claims:       []*fkv1.FencedLease{claim("w2", 1, fkv1.PhaseExpired, 0), claim("w3", 2, fkv1.PhasePending, 0), claim("w4", 0, fkv1.PhasePending, 0)},
				timedOutGone: map[types.UID]bool{"uid-gone": true}},
			wantKind:     actGrant,
			wantHolder:   "w3",
			wantTimedOut: []string{"unseen", "w4"},
		},
		{
			name:       "the holder is never timed out, whatever its limit",
			snap:       snapshot{ledger: held(41, "w1"), claims: []*fkv1.FencedLease{bounded(w1, 0)}, firstSeen: map[types.UID]time.Time{"uid-w1": now.Add(-time.Hour)}},
			wantKind:   actKeep,
			wantHolder: "w1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.snap.now, tc.snap.renewSeenAt, tc.snap.hasLease, tc.snap.storageRevision = now, now, true, 100
			for _, c := range tc.snap.claims {
				if c.Status.Phase == fkv1.PhaseHeld {
					c.Status.Epoch = tc.snap.ledger.Epoch
				}
			}
			tc.snap.ledger.Adopted = true
			a := decide(tc.snap)
			holder := ""
			if a.holder != nil {
				holder = a.holder.Name
			}
			if a.kind != tc.wantKind || holder != tc.wantHolder || !slices.Equal(refNames(a.timedOut), tc.wantTimedOut) || a.timeoutWake != tc.wantWake {
				t.Fatalf("got kind %v holder %q timedOut %v wake %v; want kind %v holder %q timedOut %v wake %v",
					a.kind, holder, refNames(a.timedOut), a.timeoutWake, tc.wantKind, tc.wantHolder, tc.wantTimedOut, tc.wantWake)
			}
			if a.kind == actGrant && slices.Contains(refNames(a.timedOut), a.holder.Name) {
				t.Fatalf("granted %s and timed it out in one write", a.holder.Name)
			}
		})
	}
}

// A listed claim that never held the lock shows Expired/AcquireTimeout, and
// is never passed over as an unchanged waiter.
func TestATimedOutClaimEndsWithoutAnEpoch(t *testing.T) {
	w2 := bounded(claim("w2", 1, fkv1.PhasePending, 0), 5)
	in := statusInputs{ledger: withTimedOut(held(41, "w1"), "w2")}
	queued, _ := desiredStatus(w2, statusInputs{ledger: held(41, "w1")})
	w2.Status = queued
	if queuedAsBefore(w2, in) {
		t.Fatal("a timed-out waiter was passed over as unchanged")
	}
	st, _ := desiredStatus(w2, in)
	if st.Phase != fkv1.PhaseExpired || st.Epoch != 0 || st.Conditions[0].Reason != fkv1.ReasonAcquireTimeout {
		t.Fatalf("status %+v, want Expired/AcquireTimeout without an epoch", st)
	}
}

package lock

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The remembered order puts any list of claims in the order a full sort
// gives, whatever changed since: claims gone, new ones (newer or older than
// the tail, as a cache that shows a claim late delivers them), and a fifo
// from another set of claims altogether.
func TestFifoOrderIsTheQueueOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	all := make([]*fkv1.FencedLease, 200)
	for i := range all {
		all[i] = claim(fmt.Sprintf("c%03d", rng.IntN(1000)), rng.IntN(40), fkv1.PhasePending, 0)
		all[i].Name += fmt.Sprint("-", i) // unique, as in a namespace
		all[i].UID = types.UID("uid-" + all[i].Name)
	}
	var q fifo
	kept, merged := 0, 0
	for round := range 300 {
		var claims []*fkv1.FencedLease
		for _, c := range all {
			if rng.IntN(4) > 0 {
				claims = append(claims, c)
			}
		}
		rng.Shuffle(len(claims), func(i, j int) { claims[i], claims[j] = claims[j], claims[i] })
		want := slices.Clone(claims)
		slices.SortFunc(want, func(a, b *fkv1.FencedLease) int {
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				if a.CreationTimestamp.Before(&b.CreationTimestamp) {
					return -1
				}
				return 1
			}
			if a.Name < b.Name {
				return -1
			}
			return 1
		})
		before := len(q)
		got, next := q.order(claims)
		if !slices.Equal(names(got), names(want)) {
			t.Fatalf("round %d: order\n got %v\nwant %v", round, names(got), names(want))
		}
		if len(next) != len(claims) {
			t.Fatalf("round %d: the fifo remembers %d claims, want %d", round, len(next), len(claims))
		}
		if before > 0 {
			kept++
		}
		if round%50 == 0 {
			q = nil // the memory was forgotten: start from nothing
			continue
		}
		q = next
		merged++
	}
	if kept == 0 || merged == 0 {
		t.Fatalf("no round started from a remembered order (%d) or kept one (%d)", kept, merged)
	}
}

// A waiter passed over as queuedAsBefore is one whose status desiredStatus
// would leave as it is, for every kind of claim and input; and a plain
// waiter in a plain queue is passed over (the fast path is taken).
func TestQueuedAsBeforeAgreesWithDesiredStatus(t *testing.T) {
	queuedStatus := func(c *fkv1.FencedLease, in statusInputs) *fkv1.FencedLease {
		c = c.DeepCopy()
		c.Status, _ = desiredStatus(c, in)
		return c
	}
	lease := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{AcquireTime: &metav1.MicroTime{Time: t0}, RenewTime: &metav1.MicroTime{Time: t0}}}
	plainIn := statusInputs{ledger: held(41, "w0"), lease: lease}
	w1 := queuedStatus(claim("w1", 1, "", 0), plainIn)
	if !queuedAsBefore(w1, plainIn) {
		t.Fatalf("a queued waiter in a plain queue is not passed over: %+v", w1.Status)
	}
	variants := map[string]*fkv1.FencedLease{
		"queued":  w1,
		"new":     claim("w1", 1, "", 0),
		"unbound": queuedStatus(unbound(claim("w1", 1, "", 0)), plainIn),
		"held":    claim("w1", 1, fkv1.PhaseHeld, 42),
		"expired": claim("w1", 1, fkv1.PhaseExpired, 0),
		"broken": func() *fkv1.FencedLease {
			c := w1.DeepCopy()
			c.Annotations[fkv1.AnnotationBreakReason], c.Annotations[fkv1.AnnotationBrokenBy] = "x", "alice"
			return c
		}(),
		"other lock":  func() *fkv1.FencedLease { c := w1.DeepCopy(); c.Spec.LockName = "other"; return c }(),
		"new spec":    func() *fkv1.FencedLease { c := w1.DeepCopy(); c.Generation++; return c }(),
		"conflicted":  queuedStatus(claim("w1", 1, "", 0), statusInputs{foreign: "a foreign Lease"}),
		"exhausted":   queuedStatus(claim("w1", 1, "", 0), statusInputs{ledger: held(41, "w0"), exhausted: true}),
		"next":        queuedStatus(claim("w1", 1, "", 0), statusInputs{ledger: held(41, "w0"), lease: lease, next: "uid-w1"}),
		"wrong label": func() *fkv1.FencedLease { c := w1.DeepCopy(); c.Status.Conditions[0].Message += "x"; return c }(),
	}
	inputs := map[string]statusInputs{
		"plain":          plainIn,
		"w1 holds":       {ledger: held(43, "w1"), lease: lease},
		"w1 held":        {ledger: fkv1.Ledger{Epoch: 43, PreviousUID: "uid-w1", EpochValid: true}, lease: lease},
		"foreign":        {foreign: "a foreign Lease"},
		"exhausted":      {ledger: held(41, "w0"), exhausted: true, lease: lease},
		"w1 next":        {ledger: held(41, "w0"), lease: lease, next: "uid-w1"},
		"w2 next":        {ledger: held(41, "w0"), lease: lease, next: "uid-w2"},
		"w1 turned away": {ledger: held(41, "w0"), lease: lease, queueFull: map[types.UID]bool{"uid-w1": true}, maxWaiters: 1},
	}
	passed := 0
	for cn, c := range variants {
		for in, inputs := range inputs {
			if !queuedAsBefore(c, inputs) {
				continue
			}
			passed++
			if want, _ := desiredStatus(c, inputs); !statusEqual(want, c.Status) {
				t.Errorf("claim %s, inputs %s: passed over, but desiredStatus changes its status\n got %+v\nwant %+v", cn, in, c.Status, want)
			}
		}
	}
	if passed == 0 {
		t.Fatal("no claim was passed over: the check compared nothing")
	}
}

func names(claims []*fkv1.FencedLease) []string {
	out := make([]string, len(claims))
	for i, c := range claims {
		out[i] = c.Name
	}
	return out
}

// A claim that enters the queue at its head is shown Next (its library then
// watches the Lease), and keeps it while it stays the head; every other
// waiter is Queued, and a waiter that becomes the head later stays Queued
// (marking it would be one more status write per handoff).
func TestOnlyAWaiterEnteringAtTheHeadIsShownNext(t *testing.T) {
	in := statusInputs{ledger: held(41, "w0"), next: "uid-w1"}
	reason := func(c *fkv1.FencedLease, in statusInputs) string {
		st, _ := desiredStatus(c, in)
		return st.Conditions[0].Reason
	}
	w1, w2 := claim("w1", 1, "", 0), claim("w2", 2, "", 0)
	if got := reason(w1, in); got != fkv1.ReasonNext {
		t.Fatalf("a claim entering at the head: reason %q, want %q", got, fkv1.ReasonNext)
	}
	if got := reason(w2, in); got != fkv1.ReasonQueued {
		t.Fatalf("a claim entering behind it: reason %q, want %q", got, fkv1.ReasonQueued)
	}
	w1.Status, _ = desiredStatus(w1, in)
	w2.Status, _ = desiredStatus(w2, in)
	if st, _ := desiredStatus(w1, in); !statusEqual(st, w1.Status) {
		t.Fatal("the head waiter's Next status is rewritten while it stays the head")
	}
	in.next = "uid-w2"
	if got := reason(w2, in); got != fkv1.ReasonQueued || !queuedAsBefore(w2, in) {
		t.Fatalf("a Queued waiter that became the head: reason %q (a status write per handoff), want it left %q", got, fkv1.ReasonQueued)
	}
	if got := reason(w1, in); got != fkv1.ReasonQueued {
		t.Fatalf("a Next waiter no longer the head keeps %q", got)
	}
}

// Package chaos runs randomized, seeded fault runs against a real control
// plane and fencekeeper managers, records what the apiserver accepted, and
// checks the histories for violations of the fencing promise (DESIGN §2–§3,
// seed §22). The checker is pure and tested on hand-made bad histories; the
// runs live in chaos_test.go (make test runs a short budget, make chaos a
// long one).
package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Kind says which watch an Event came from.
type Kind string

const (
	// KindWrite: a guarded object (ConfigMap) as stored after an accepted write.
	KindWrite Kind = "write"
	// KindLease: the lock's Lease (the ledger) as stored.
	KindLease Kind = "lease"
	// KindClaim: a FencedLease showing Held with an epoch.
	KindClaim Kind = "claim"
	// KindBroken: a FencedLease whose hold an operator ended (kubectl fence
	// break: Expired with reason ForcedRelease).
	KindBroken Kind = "broken"
)

// Event is one stored state, as a watch delivered it. RV orders events of
// one etcd; At is when the recorder received it.
type Event struct {
	Kind Kind
	RV   int64
	At   time.Time
	// Object is the name of the written object (KindWrite) or claim.
	Object string
	// Epoch: the fenced-epoch watermark the write was admitted with
	// (KindWrite), the ledger's issued epoch (KindLease), the claim's epoch.
	Epoch int64
	// DataEpoch is the epoch the writer put in the data (KindWrite).
	DataEpoch int64
	// Holder is the claim UID the ledger or claim names.
	Holder string
	// Who is the claim's holder identity (KindClaim) or the writer the data
	// names (KindWrite).
	Who string
	// Held: the ledger names a holder (KindLease).
	Held bool
	// Current: the object's fence policy is current (KindWrite).
	Current bool
	// Deleted: the object was deleted (KindWrite); its history restarts.
	// For a semaphore lock (semaphore.go) also: the Lease was deleted
	// (KindPermits), the claim was deleted or is being deleted
	// (KindSemClaim).
	Deleted bool
	// Permits are the live permits a semaphore lock's Lease version lists
	// (KindPermits), in FormatPermits' form; PermitsInvalid: its permit
	// entries do not parse.
	Permits        string
	PermitsInvalid bool
}

func (e Event) String() string {
	switch e.Kind {
	case KindWrite:
		if e.Deleted {
			return fmt.Sprintf("rv=%d write %s deleted", e.RV, e.Object)
		}
		return fmt.Sprintf("rv=%d write %s fenced-epoch=%d data-epoch=%d current=%v", e.RV, e.Object, e.Epoch, e.DataEpoch, e.Current)
	case KindLease:
		return fmt.Sprintf("rv=%d lease epoch=%d held=%v holder=%s", e.RV, e.Epoch, e.Held, e.Holder)
	case KindBroken:
		return fmt.Sprintf("rv=%d claim %s broken at epoch=%d uid=%s", e.RV, e.Object, e.Epoch, e.Holder)
	case KindPermits:
		if e.Deleted {
			return fmt.Sprintf("rv=%d lease %s deleted", e.RV, e.Object)
		}
		return fmt.Sprintf("rv=%d lease %s epoch=%d permits=[%s] invalid=%v", e.RV, e.Object, e.Epoch, e.Permits, e.PermitsInvalid)
	case KindSemClaim:
		return fmt.Sprintf("rv=%d claim %s (%s) held=%v epoch=%d uid=%s deleted=%v", e.RV, e.Object, e.Who, e.Held, e.Epoch, e.Holder, e.Deleted)
	default:
		return fmt.Sprintf("rv=%d claim %s Held epoch=%d uid=%s", e.RV, e.Object, e.Epoch, e.Holder)
	}
}

// Violation is one broken rule, with the events that show it.
type Violation struct {
	Rule   string
	Detail string
	Events []Event
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", v.Rule, v.Detail)
	for _, e := range v.Events {
		fmt.Fprintf(&b, "\n    %s", e)
	}
	return b.String()
}

// Rules the checker enforces.
const (
	RuleEpochReused      = "an epoch issued to two claims"
	RuleLeaseWentBack    = "the Lease's epoch decreased"
	RuleDataNotToken     = "an accepted write's data names another epoch than its token"
	RuleObjectWentBack   = "an object accepted an older epoch after a newer one"
	RuleStaleCurrent     = "a current-policy object accepted a superseded epoch past the window"
	RuleHistoryUnordered = "the history is not ordered by resourceVersion"
	RuleFutureToken      = "a write was accepted with an epoch not yet issued"
	RuleWrongWriter      = "a write was accepted from another writer than the epoch's holder"
	RuleTwoBelievers     = "a holder still believed it held after a newer epoch was granted"
)

// Belief is a holder's own view at one moment: its library said it held
// epoch Epoch with safe time left (lease.Held and Remaining() > 0).
type Belief struct {
	Epoch int64
	Who   string
	At    time.Time
}

// Stats are figures of a checked history.
type Stats struct {
	Writes, Grants int
	// InsideWindow counts current-policy writes of a superseded epoch that
	// were accepted within the documented window after the newer grant was
	// observed (allowed; reported).
	InsideWindow int
	// ByWriter counts accepted writes by the writer their data names.
	ByWriter map[string]int
}

// Broken counts the holds an operator ended in h (distinct epochs).
func Broken(h []Event) int {
	epochs := map[int64]bool{}
	for _, e := range h {
		if e.Kind == KindBroken {
			epochs[e.Epoch] = true
		}
	}
	return len(epochs)
}

// Check returns every violation in h (sorted by RV first). window is the
// documented staleness window of policy current: how long after a newer
// epoch's grant was observed an older epoch's write may still be accepted.
func Check(h []Event, window time.Duration) ([]Violation, Stats) {
	h = append([]Event(nil), h...)
	sort.SliceStable(h, func(i, j int) bool { return h[i].RV < h[j].RV })
	var out []Violation
	st := Stats{ByWriter: map[string]int{}}
	claimOf := map[int64]Event{}   // epoch -> first event naming its holder
	holderOf := map[int64]string{} // epoch -> the claim's holder identity
	var issued int64               // highest epoch granted so far, in RV order
	var lastLease *Event
	lastWrite := map[string]Event{}
	// newest grant seen so far, in RV order, and when it was observed
	var newest *Event
	for i := range h {
		e := h[i]
		if e.Kind == KindLease || e.Kind == KindClaim {
			if e.Holder != "" && (e.Kind == KindClaim || e.Held) {
				if prev, ok := claimOf[e.Epoch]; ok && prev.Holder != e.Holder {
					out = append(out, Violation{RuleEpochReused, fmt.Sprintf("epoch %d", e.Epoch), []Event{prev, e}})
				} else if !ok {
					claimOf[e.Epoch] = e
					st.Grants++
				}
				if newest == nil || e.Epoch > newest.Epoch {
					newest = &h[i]
				}
				issued = max(issued, e.Epoch)
				if e.Kind == KindClaim && e.Who != "" {
					holderOf[e.Epoch] = e.Who
				}
			}
		}
		switch e.Kind {
		case KindLease:
			if lastLease != nil && e.Epoch < lastLease.Epoch {
				out = append(out, Violation{RuleLeaseWentBack, fmt.Sprintf("%d after %d", e.Epoch, lastLease.Epoch), []Event{*lastLease, e}})
			}
			lastLease = &h[i]
		case KindWrite:
			if e.Deleted {
				delete(lastWrite, e.Object)
				continue
			}
			st.Writes++
			st.ByWriter[e.Who]++
			if e.Epoch > issued {
				out = append(out, Violation{RuleFutureToken, fmt.Sprintf("%s: epoch %d accepted; the highest granted so far is %d", e.Object, e.Epoch, issued), []Event{e}})
			}
			if who, ok := holderOf[e.Epoch]; ok && e.Who != "" && e.Who != who {
				out = append(out, Violation{RuleWrongWriter, fmt.Sprintf("%s: epoch %d is %s's, written by %s", e.Object, e.Epoch, who, e.Who), []Event{claimOf[e.Epoch], e}})
			}
			if e.DataEpoch != e.Epoch {
				out = append(out, Violation{RuleDataNotToken, fmt.Sprintf("%s: data says %d, admitted as %d", e.Object, e.DataEpoch, e.Epoch), []Event{e}})
			}
			if prev, ok := lastWrite[e.Object]; ok && e.Epoch < prev.Epoch {
				out = append(out, Violation{RuleObjectWentBack, fmt.Sprintf("%s: %d after %d", e.Object, e.Epoch, prev.Epoch), []Event{prev, e}})
			}
			lastWrite[e.Object] = e
			if e.Current && newest != nil && e.Epoch < newest.Epoch {
				if late := e.At.Sub(newest.At); late > window {
					out = append(out, Violation{RuleStaleCurrent, fmt.Sprintf("%s: epoch %d accepted %v after epoch %d was granted (window %v)",
						e.Object, e.Epoch, late.Round(time.Millisecond), newest.Epoch, window), []Event{*newest, e}})
				} else {
					st.InsideWindow++
				}
			}
		}
	}
	for i := 1; i < len(h); i++ {
		if h[i].RV == h[i-1].RV && h[i].Kind == h[i-1].Kind && h[i].Object == h[i-1].Object && h[i] != h[i-1] {
			out = append(out, Violation{RuleHistoryUnordered, "two different states at one resourceVersion", []Event{h[i-1], h[i]}})
		}
	}
	return out, st
}

// CheckBeliefs returns a violation for each moment a holder's library still
// said it held epoch E (with safe time left) after the recorder had already
// seen a grant of an epoch above E: the library must report LOST before the
// authority can grant the next epoch (its safe time ends a TTL after it
// sent its last acknowledged renewal; the authority's expiry comes a TTL
// after it observed that renewal, and the grant after that). Both clocks are
// this process's.
//
// A hold an operator broke (KindBroken in h) ends at once: the next epoch
// can be granted before the broken holder's library can know, so that
// holder's beliefs are exempt for grace after the break was recorded (its
// safe time ends at most a TTL after its last acknowledged renewal: pass
// TTL plus the observation slack). Its writes are still checked by Check.
func CheckBeliefs(h []Event, beliefs []Belief, grace time.Duration) []Violation {
	var grants []Event
	brokenAt := map[int64]time.Time{}
	for _, e := range h {
		if (e.Kind == KindClaim || (e.Kind == KindLease && e.Held)) && e.Holder != "" {
			grants = append(grants, e)
		}
		if at, seen := brokenAt[e.Epoch]; e.Kind == KindBroken && (!seen || e.At.Before(at)) {
			brokenAt[e.Epoch] = e.At
		}
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].At.Before(grants[j].At) })
	var out []Violation
	for _, b := range beliefs {
		if at, ok := brokenAt[b.Epoch]; ok && b.At.Before(at.Add(grace)) {
			continue
		}
		for _, g := range grants {
			if g.At.After(b.At) {
				break
			}
			if g.Epoch > b.Epoch {
				out = append(out, Violation{RuleTwoBelievers, fmt.Sprintf("%s believed it held epoch %d %v after epoch %d was granted",
					b.Who, b.Epoch, b.At.Sub(g.At).Round(time.Millisecond), g.Epoch), []Event{g}})
				break
			}
		}
	}
	return out
}

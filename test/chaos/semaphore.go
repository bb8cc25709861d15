package chaos

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The semaphore lock of a run (docs/design.md §9): holders of up to
// SemaphoreCapacity permits at once, each with an epoch of its own, write
// ObjectsSemaphore (policy current, the only one a semaphore's objects may
// have) while a live permit holds their epoch.
const (
	SemaphoreLock     = "pool"
	SemaphoreCapacity = 3
)

// ObjectsSemaphore are the objects of the semaphore lock.
var ObjectsSemaphore = []string{"pool-a", "pool-b", "pool-c"}

// Kinds of a semaphore lock's history (RecordSemaphore). Its writes are
// KindWrite and its breaks KindBroken, as a mutex's.
const (
	// KindPermits: the lock's Lease as stored: its counter (Epoch) and its
	// live permits (Permits); Deleted: the Lease was deleted (no permit).
	KindPermits Kind = "permits"
	// KindSemClaim: any version of a claim of the lock: Held is its phase
	// being Held (not while it is being deleted), Deleted that it was
	// deleted or carries a deletion timestamp.
	KindSemClaim Kind = "sem-claim"
)

// LivePermit is one permit a Lease version lists: its epoch, the claim UID
// it was granted to and that claim's holder identity.
type LivePermit struct {
	Epoch  int64
	UID    string
	Holder string
}

// FormatPermits is the Event.Permits form of a Lease version's permits:
// "EPOCH:UID:HOLDER" by epoch, space-separated (a string keeps Event
// comparable).
func FormatPermits(ps []LivePermit) string {
	ps = append([]LivePermit(nil), ps...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].Epoch < ps[j].Epoch })
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("%d:%s:%s", p.Epoch, p.UID, p.Holder)
	}
	return strings.Join(parts, " ")
}

// ParsePermits reads FormatPermits' form back.
func ParsePermits(s string) []LivePermit {
	var out []LivePermit
	for _, f := range strings.Fields(s) {
		parts := strings.SplitN(f, ":", 3)
		if len(parts) != 3 {
			continue
		}
		e, _ := strconv.ParseInt(parts[0], 10, 64)
		out = append(out, LivePermit{Epoch: e, UID: parts[1], Holder: parts[2]})
	}
	return out
}

// convertSemaphore turns one stored state into events of the semaphore
// lock's history: every Lease version with its permits, every claim version
// (Held or not, and its deletion: the count of claims Held at once needs
// them all), breaks as convert records them, and writes as convert does.
func convertSemaphore(obj runtime.Object, lock string, deleted bool) []Event {
	switch o := obj.(type) {
	case *coordinationv1.Lease:
		if o.Name != lock {
			return nil // the permits' own renewal Leases, other locks
		}
		e := Event{Kind: KindPermits, Object: o.Name, Deleted: deleted}
		if deleted {
			return []Event{e}
		}
		led := fkv1.ReadLedger(o, lock)
		e.Epoch, e.PermitsInvalid = led.Epoch, led.PermitsInvalid
		ps := make([]LivePermit, 0, len(led.Permits))
		for _, p := range led.Permits {
			ps = append(ps, LivePermit{Epoch: p.Epoch, UID: string(p.UID), Holder: p.Holder})
		}
		e.Permits = FormatPermits(ps)
		return []Event{e}
	case *fkv1.FencedLease:
		if o.Spec.LockName != lock {
			return nil
		}
		gone := deleted || o.DeletionTimestamp != nil
		out := []Event{{Kind: KindSemClaim, Object: o.Name, Epoch: o.Status.Epoch, Holder: string(o.UID), Who: o.Spec.HolderIdentity,
			Held: o.Status.Phase == fkv1.PhaseHeld && !gone, Deleted: gone}}
		if b, ok := convert(obj, lock, deleted); ok && b.Kind == KindBroken {
			out = append(out, b)
		}
		return out
	}
	if e, ok := convert(obj, lock, deleted); ok {
		return []Event{e}
	}
	return nil
}

// Rules of a semaphore lock's history (CheckSemaphore, CheckPermitBeliefs).
const (
	RuleTooManyPermits     = "a Lease version lists more permits than the semaphore's capacity"
	RuleTooManyHeld        = "more claims of the semaphore showed Held at once than its capacity"
	RulePermitsUnreadable  = "a Lease version's permit entries do not parse"
	RulePermitTwoClaims    = "a permit epoch was granted to two claims"
	RulePermitRegranted    = "a permit epoch was granted again after it ended"
	RulePermitNotNew       = "a new permit's epoch is not above the counter of the Lease version before"
	RulePermitAboveCounter = "a Lease version lists a permit above its own counter"
	RuleClaimTwoPermits    = "a Lease version lists one claim with two permits"
	RuleHeldNotPermitted   = "a claim showed Held with an epoch the Lease never permitted it"
	RuleNotAPermit         = "a write was accepted with an epoch no permit had held"
	RuleStalePermit        = "a write was accepted with the epoch of an ended permit past the window"
	RuleSemaphoreMonotonic = "an object of a semaphore lock stored policy monotonic"
	RulePermitOutlived     = "a holder still believed it held a permit after the Lease stopped listing it"
)

// SemStats are figures of a checked semaphore history.
type SemStats struct {
	Writes int
	// Permits counts the distinct permit epochs the Lease listed.
	Permits int
	// MaxLive is the most permits one Lease version listed; MaxHeld the
	// most claims shown Held at once.
	MaxLive, MaxHeld int
	// InsideWindow counts writes of an ended permit's epoch accepted
	// within the window after the Lease stopped listing it (allowed, as a
	// mutex's superseded epoch under policy current; reported).
	InsideWindow int
	// Regranted counts permits granted to a claim whose earlier permit had
	// ended (allowed: the grant is the pair of claim and epoch, and the
	// claim's holder is LOST when the Lease shows its claim with another
	// epoch; reported). Regrants lists the Lease versions that did.
	Regranted int
	Regrants  []Event
}

// CheckSemaphore returns every violation of a semaphore lock's promise in
// h (sorted by RV first), for a lock of capacity permits. It reads only the
// recorded states, in resourceVersion order:
//
//  1. At most capacity permits exist: every Lease version lists at most
//     capacity; the claims' statuses never show more than capacity Held at
//     once (a claim's last version counts, until it is deleted).
//  2. Each epoch is permitted to one claim, once: never to two claims,
//     never again once a Lease version stopped listing it, only above the
//     counter of the Lease version before its grant and never above the
//     counter of its own; no Lease version lists one claim twice; a claim
//     shows Held only with an epoch the Lease permitted it. (A claim
//     granted a new epoch after its permit ended is counted, not flagged.)
//  3. Every accepted write presented a live permit's epoch: listed by the
//     latest Lease version before the write (from the permit's holder;
//     the data names the token); an epoch no permit ever held is never
//     accepted, and an ended permit's only within window after the Lease
//     stopped listing it (the webhook's view of the Lease may trail it, as
//     under a mutex's policy current). Policy monotonic is never stored.
func CheckSemaphore(h []Event, capacity int, window time.Duration) ([]Violation, SemStats) {
	h = append([]Event(nil), h...)
	sort.SliceStable(h, func(i, j int) bool { return h[i].RV < h[j].RV })
	var out []Violation
	var st SemStats
	flag := func(rule, detail string, es ...Event) { out = append(out, Violation{rule, detail, es}) }

	live := map[int64]LivePermit{} // the latest Lease version's permits
	grantedIn := map[int64]Event{} // epoch -> the Lease version that first listed it
	endedIn := map[int64]Event{}   // epoch -> the Lease version that first stopped listing it
	epochOfClaim := map[string]int64{}
	var lastLease *Event
	held := map[string]Event{} // claim UID -> its last version, while it shows Held
	for i := range h {
		e := h[i]
		switch e.Kind {
		case KindPermits:
			if e.PermitsInvalid {
				flag(RulePermitsUnreadable, "the Lease's permit entries cannot be read", e)
			}
			ps := ParsePermits(e.Permits)
			if e.Deleted {
				ps = nil
			}
			st.MaxLive = max(st.MaxLive, len(ps))
			if len(ps) > capacity {
				flag(RuleTooManyPermits, fmt.Sprintf("%d permits listed, capacity %d", len(ps), capacity), e)
			}
			if lastLease != nil && !e.Deleted && !lastLease.Deleted && e.Epoch < lastLease.Epoch {
				flag(RuleLeaseWentBack, fmt.Sprintf("%d after %d", e.Epoch, lastLease.Epoch), *lastLease, e)
			}
			now := map[int64]LivePermit{}
			byClaim, twice := map[string]int64{}, map[string]bool{}
			for _, p := range ps {
				if other, dup := byClaim[p.UID]; dup {
					twice[p.UID] = true
					flag(RuleClaimTwoPermits, fmt.Sprintf("claim %s: epochs %d and %d", p.UID, other, p.Epoch), e)
				}
				byClaim[p.UID] = p.Epoch
			}
			for _, p := range ps {
				now[p.Epoch] = p
				if p.Epoch > e.Epoch && !e.Deleted {
					flag(RulePermitAboveCounter, fmt.Sprintf("permit %d, counter %d", p.Epoch, e.Epoch), e)
				}
				first, seen := grantedIn[p.Epoch]
				switch {
				case seen && ParsePermitOf(first, p.Epoch).UID != p.UID:
					flag(RulePermitTwoClaims, fmt.Sprintf("epoch %d: claim %s, then claim %s", p.Epoch, ParsePermitOf(first, p.Epoch).UID, p.UID), first, e)
				case seen:
					if end, ended := endedIn[p.Epoch]; ended {
						if _, wasLive := live[p.Epoch]; !wasLive {
							flag(RulePermitRegranted, fmt.Sprintf("epoch %d listed again after it ended", p.Epoch), first, end, e)
						}
					}
				default:
					grantedIn[p.Epoch] = e
					st.Permits++
					if lastLease != nil && !lastLease.Deleted && p.Epoch <= lastLease.Epoch {
						flag(RulePermitNotNew, fmt.Sprintf("permit %d granted while the counter already was %d", p.Epoch, lastLease.Epoch), *lastLease, e)
					}
					if prev, ok := epochOfClaim[p.UID]; ok && prev != p.Epoch && !twice[p.UID] {
						st.Regranted++
						st.Regrants = append(st.Regrants, grantedIn[prev], e)
					}
					epochOfClaim[p.UID] = p.Epoch
				}
			}
			for epoch := range live {
				if _, still := now[epoch]; !still {
					if _, ended := endedIn[epoch]; !ended {
						endedIn[epoch] = e
					}
				}
			}
			live = now
			lastLease = &h[i]
		case KindSemClaim:
			if !e.Held {
				delete(held, e.Holder)
				continue
			}
			held[e.Holder] = e
			if len(held) > st.MaxHeld {
				st.MaxHeld = len(held)
			}
			if len(held) > capacity {
				es := make([]Event, 0, len(held))
				for _, c := range held {
					es = append(es, c)
				}
				sort.Slice(es, func(i, j int) bool { return es[i].RV < es[j].RV })
				flag(RuleTooManyHeld, fmt.Sprintf("%d claims Held, capacity %d", len(held), capacity), es...)
			}
			if first, ok := grantedIn[e.Epoch]; !ok || ParsePermitOf(first, e.Epoch).UID != e.Holder {
				flag(RuleHeldNotPermitted, fmt.Sprintf("claim %s (%s) Held with epoch %d", e.Object, e.Holder, e.Epoch), e)
			}
		case KindWrite:
			if e.Deleted {
				continue
			}
			st.Writes++
			if !e.Current {
				flag(RuleSemaphoreMonotonic, e.Object, e)
			}
			if e.DataEpoch != e.Epoch {
				flag(RuleDataNotToken, fmt.Sprintf("%s: data says %d, admitted as %d", e.Object, e.DataEpoch, e.Epoch), e)
			}
			first, ever := grantedIn[e.Epoch]
			if !ever {
				flag(RuleNotAPermit, fmt.Sprintf("%s: epoch %d accepted; no Lease version before it listed that permit", e.Object, e.Epoch), e)
				continue
			}
			if p := ParsePermitOf(first, e.Epoch); e.Who != "" && p.Holder != e.Who {
				flag(RuleWrongWriter, fmt.Sprintf("%s: permit %d is %s's, written by %s", e.Object, e.Epoch, p.Holder, e.Who), first, e)
			}
			if _, ok := live[e.Epoch]; ok {
				continue
			}
			end := endedIn[e.Epoch]
			if late := e.At.Sub(end.At); late > window {
				flag(RuleStalePermit, fmt.Sprintf("%s: epoch %d accepted %v after the Lease stopped listing its permit (window %v)",
					e.Object, e.Epoch, late.Round(time.Millisecond), window), end, e)
			} else {
				st.InsideWindow++
			}
		}
	}
	for i := 1; i < len(h); i++ {
		if h[i].RV == h[i-1].RV && h[i].Kind == h[i-1].Kind && h[i].Object == h[i-1].Object && h[i] != h[i-1] {
			flag(RuleHistoryUnordered, "two different states at one resourceVersion", h[i-1], h[i])
		}
	}
	return out, st
}

// ParsePermitOf is the permit with epoch in a KindPermits event (zero if
// it lists none).
func ParsePermitOf(e Event, epoch int64) LivePermit {
	for _, p := range ParsePermits(e.Permits) {
		if p.Epoch == epoch {
			return p
		}
	}
	return LivePermit{}
}

// CheckPermitBeliefs returns a violation for each moment a permit holder's
// library still said it held its permit (Held or Suspect, safe time left)
// after the recorder had seen a Lease version that no longer listed it: the
// library's safe time ends a TTL after it sent its last acknowledged
// renewal, the authority expires a permit a TTL after it observed that
// renewal, so it must report LOST first. A permit an operator broke ends at
// once: its holder's beliefs are exempt for grace after the break was
// recorded, as in CheckBeliefs. Both clocks are this process's.
func CheckPermitBeliefs(h []Event, beliefs []Belief, grace time.Duration) []Violation {
	h = append([]Event(nil), h...)
	sort.SliceStable(h, func(i, j int) bool { return h[i].RV < h[j].RV })
	endedIn := map[int64]Event{}
	brokenAt := map[int64]time.Time{}
	live := map[int64]bool{}
	for _, e := range h {
		switch e.Kind {
		case KindPermits:
			now := map[int64]bool{}
			if !e.Deleted {
				for _, p := range ParsePermits(e.Permits) {
					now[p.Epoch] = true
				}
			}
			for epoch := range live {
				if _, ended := endedIn[epoch]; !now[epoch] && !ended {
					endedIn[epoch] = e
				}
			}
			live = now
		case KindBroken:
			if at, seen := brokenAt[e.Epoch]; !seen || e.At.Before(at) {
				brokenAt[e.Epoch] = e.At
			}
		}
	}
	var out []Violation
	for _, b := range beliefs {
		end, ended := endedIn[b.Epoch]
		if !ended || !b.At.After(end.At) {
			continue
		}
		if at, ok := brokenAt[b.Epoch]; ok && b.At.Before(at.Add(grace)) {
			continue
		}
		out = append(out, Violation{RulePermitOutlived, fmt.Sprintf("%s believed it held permit %d %v after the Lease stopped listing it",
			b.Who, b.Epoch, b.At.Sub(end.At).Round(time.Millisecond)), []Event{end}})
	}
	return out
}

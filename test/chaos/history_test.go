package chaos

import (
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lease := func(rv int64, epoch int64, holder string, ms int) Event {
		return Event{Kind: KindLease, RV: rv, Epoch: epoch, Holder: holder, Held: holder != "", At: at(ms)}
	}
	write := func(rv int64, obj string, epoch, data int64, current bool, ms int) Event {
		return Event{Kind: KindWrite, RV: rv, Object: obj, Epoch: epoch, DataEpoch: data, Current: current, At: at(ms)}
	}
	claim := func(rv int64, name string, epoch int64, uid string, ms int) Event {
		return Event{Kind: KindClaim, RV: rv, Object: name, Epoch: epoch, Holder: uid, Who: name, At: at(ms)}
	}
	withWho := func(e Event, who string) Event { e.Who = who; return e }
	good := []Event{
		lease(10, 100, "w1", 0), claim(11, "w1", 100, "w1", 1),
		write(12, "report", 100, 100, true, 5), write(13, "ledger", 100, 100, false, 6),
		lease(20, 100, "", 3000), lease(21, 101, "w2", 3001), claim(22, "w2", 101, "w2", 3002),
		// W1's write in flight when W2 was granted: inside the window
		write(23, "report", 100, 100, true, 3100),
		write(24, "report", 101, 101, true, 3200),
		// monotonic object: an old epoch is fine while the object never saw a newer one
		write(25, "ledger", 100, 100, false, 9000),
	}
	with := func(h []Event, more ...Event) []Event { return append(append([]Event(nil), h...), more...) }
	cases := []struct {
		name string
		h    []Event
		want string // rule, "" for none
	}{
		{"a safe history", good, ""},
		{"an epoch issued to two claims", with(good, claim(30, "w3", 101, "w3", 9500)), RuleEpochReused},
		{"the Lease goes back", with(good, lease(30, 99, "w9", 9500)), RuleLeaseWentBack},
		{"data names another epoch", with(good, write(30, "report", 101, 100, true, 9500)), RuleDataNotToken},
		{"an object accepts an older epoch", with(good, write(30, "ledger", 101, 101, false, 9500), write(31, "ledger", 100, 100, false, 9600)), RuleObjectWentBack},
		{"a write with an epoch not yet issued", with(good, write(30, "ledger", 102, 102, false, 9500)), RuleFutureToken},
		{"a write by another writer than the epoch's holder", with(good, withWho(write(30, "report", 101, 101, true, 9500), "w1")), RuleWrongWriter},
		{"the holder's own write", with(good, withWho(write(30, "report", 101, 101, true, 9500), "w2")), ""},
		{"a current object accepts a superseded epoch late", with(good[:7], write(23, "other", 100, 100, true, 4500)), RuleStaleCurrent},
		{"the same order checked out of order (the checker sorts by RV)", []Event{write(24, "report", 101, 101, true, 3200), lease(21, 101, "w2", 3001), write(13, "report", 100, 100, true, 6), lease(10, 100, "w1", 0)}, ""},
		{"after a delete, the history of the name restarts", []Event{lease(4, 100, "w1", 0), write(5, "r", 100, 100, false, 0), {Kind: KindWrite, RV: 6, Object: "r", Deleted: true}, write(7, "r", 100, 100, false, 1)}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, st := Check(tc.h, time.Second)
			switch {
			case tc.want == "" && len(v) > 0:
				t.Fatalf("unexpected violations: %v", v)
			case tc.want != "" && (len(v) != 1 || v[0].Rule != tc.want):
				t.Fatalf("want exactly %q, got %v", tc.want, v)
			}
			if tc.want == "" && tc.name == "a safe history" && (st.InsideWindow != 1 || st.Grants != 2 || st.Writes != 5) {
				t.Fatalf("stats %+v, want 1 inside the window, 2 grants, 5 writes", st)
			}
		})
	}
}

func TestCheckBeliefs(t *testing.T) {
	t0 := time.Unix(1000, 0)
	h := []Event{
		{Kind: KindLease, RV: 10, Epoch: 100, Holder: "w1", Held: true, At: t0},
		{Kind: KindClaim, RV: 21, Epoch: 101, Holder: "w2", Who: "w2", At: t0.Add(3 * time.Second)},
	}
	ok := []Belief{{Epoch: 100, Who: "w1", At: t0.Add(2900 * time.Millisecond)}, {Epoch: 101, Who: "w2", At: t0.Add(4 * time.Second)}}
	if v := CheckBeliefs(h, ok, time.Second); len(v) != 0 {
		t.Fatalf("unexpected: %v", v)
	}
	late := append(append([]Belief(nil), ok...), Belief{Epoch: 100, Who: "w1", At: t0.Add(3100 * time.Millisecond)})
	if v := CheckBeliefs(h, late, time.Second); len(v) != 1 || v[0].Rule != RuleTwoBelievers {
		t.Fatalf("want one %q, got %v", RuleTwoBelievers, v)
	}
	// A forced unlock grants the next epoch before the broken holder can
	// know: the broken epoch's beliefs are exempt, for grace after the
	// break was recorded only.
	broken := append(append([]Event(nil), h...), Event{Kind: KindBroken, RV: 20, Epoch: 100, Holder: "w1", At: t0.Add(2950 * time.Millisecond)})
	if v := CheckBeliefs(broken, late, time.Second); len(v) != 0 {
		t.Fatalf("a broken epoch's belief right after the break counted: %v", v)
	}
	tooLate := append(append([]Belief(nil), late...), Belief{Epoch: 100, Who: "w1", At: t0.Add(4 * time.Second)})
	if v := CheckBeliefs(broken, tooLate, time.Second); len(v) != 1 {
		t.Fatalf("a broken holder believing past the grace was not flagged: %v", v)
	}
	if v, _ := Check(broken, time.Second); len(v) != 0 {
		t.Fatalf("a recorded break is a violation of Check: %v", v)
	}
	if n := Broken(broken); n != 1 {
		t.Fatalf("Broken = %d, want 1", n)
	}
}

package lease

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every caller takes its locks in one order, whatever order it names them
// in: sorted by name. A name given twice, an empty or invalid name, or no
// name at all is refused, naming the bad one.
func TestAcquisitionOrder(t *testing.T) {
	for _, tt := range []struct {
		in   []string
		want []string
		err  string
	}{
		{in: []string{"a"}, want: []string{"a"}},
		{in: []string{"b", "a"}, want: []string{"a", "b"}},
		{in: []string{"a", "b"}, want: []string{"a", "b"}},
		{in: []string{"report-2026-07", "ledger.2026-07", "ledger-2026-07", "a9", "a10"},
			want: []string{"a10", "a9", "ledger-2026-07", "ledger.2026-07", "report-2026-07"}},
		{in: nil, err: "no lock given"},
		{in: []string{}, err: "no lock given"},
		{in: []string{"a", ""}, err: `lock 2 of 2 is an empty name (in ["a" ""])`},
		{in: []string{"a", "Bad_Lock"}, err: `invalid lock name "Bad_Lock"`},
		{in: []string{"b", "a", "b"}, err: `lock "b" is given twice (in ["b" "a" "b"])`},
		{in: []string{"a", "a"}, err: `lock "a" is given twice`},
	} {
		in := slices.Clone(tt.in)
		got, err := AcquisitionOrder(in)
		if !slices.Equal(in, tt.in) {
			t.Errorf("AcquisitionOrder(%q) changed its argument to %q", tt.in, in)
		}
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("AcquisitionOrder(%q): error %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("AcquisitionOrder(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// Bad input is refused before any request: the Client here has no API
// client at all, so a request would panic.
func TestAcquireAllChecksBeforeAnyRequest(t *testing.T) {
	c := &Client{namespace: "ns"}
	for _, tt := range []struct {
		locks  []string
		holder string
		opts   Options
		err    string
	}{
		{locks: []string{"a", "a"}, holder: "W1", err: `lock "a" is given twice`},
		{locks: []string{"a", ""}, holder: "W1", err: "empty name"},
		{locks: nil, holder: "W1", err: "no lock given"},
		{locks: []string{"a", "B"}, holder: "W1", err: `invalid lock name "B"`},
		{locks: []string{"a", "b"}, holder: "", err: "invalid holder"},
		{locks: []string{"a", "b"}, holder: "W1", opts: Options{TTL: 1500 * time.Millisecond}, err: "whole seconds"},
	} {
		s, err := c.AcquireAll(context.Background(), tt.locks, tt.holder, tt.opts)
		if s != nil || err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("AcquireAll(%q, %q): %v, %v; want the error %q", tt.locks, tt.holder, s, err, tt.err)
		}
	}
}

// The set ends when any of its leases ends: its context's cause names the
// lock, and wraps ErrLost when that lease was lost.
func TestSetEndsWithAnyLease(t *testing.T) {
	c := &Client{namespace: "ns"}
	s := &Set{namespace: "ns", holder: "W1"}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	a, b := newLease(c, "a", "W1", Options{}), newLease(c, "b", "W1", Options{})
	a.Epoch, b.Epoch = 4, 9
	a.state, b.state = Held, Held
	s.add(a)
	s.add(b)
	if got := s.Epochs(); len(got) != 2 || got["a"] != 4 || got["b"] != 9 {
		t.Fatalf("Epochs() = %v", got)
	}
	if s.Lease("b") != b || s.Lease("c") != nil {
		t.Fatalf("Lease(b) = %v, Lease(c) = %v", s.Lease("b"), s.Lease("c"))
	}
	select {
	case <-s.Done():
		t.Fatal("the set ended with both leases held")
	default:
	}

	b.transition(Lost, "test")
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the set did not end when one of its leases was lost")
	}
	var le *LockError
	cause := context.Cause(s.Context())
	if !errors.As(cause, &le) || le.Lock != "b" || !errors.Is(cause, ErrLost) {
		t.Fatalf("the cause %v names no lost lock b", cause)
	}
	if got := s.State(); got != Lost {
		t.Errorf("State() = %s, want LOST", got)
	}
	if a.Context().Err() != nil {
		t.Errorf("the other lease ended with the set: it stays held until the set is released")
	}
	if want := "ns/a (epoch 4), ns/b (epoch 9)"; s.String() != want {
		t.Errorf("String() = %q, want %q", s.String(), want)
	}
}

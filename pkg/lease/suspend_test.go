package lease

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// heldLease is a lease HELD since a renewal acknowledged just now, with no
// API behind it (these tests only move its clock).
func heldLease() *Lease {
	l := newLease(&Client{namespace: "ns", log: logr.Discard()}, "report-2026-07", "w1", Options{SuspectMargin: 10 * time.Second})
	l.TTL, l.state, l.lastAckSent = 30*time.Second, Held, time.Now()
	return l
}

// suspend plays a machine suspended for an hour: its monotonic clock stood
// still, its wall clock moved on (elapsed.Since takes the longer).
func suspend(l *Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	real := l.since
	l.since = func(t time.Time) time.Duration { return real(t) + time.Hour }
}

func TestASuspendedHolderWakesUpLost(t *testing.T) {
	l := heldLease()
	if rem := l.Remaining(); rem < 29*time.Second {
		t.Fatalf("Remaining right after a renewal = %v", rem)
	}
	suspend(l)
	if rem := l.Remaining(); rem > 0 {
		t.Fatalf("Remaining after an hour asleep = %v, want none", rem)
	}
	// Its timers have not fired (they run on the monotonic clock): State
	// must not say HELD all the same. It only reads (the transition, and
	// Done, come from the loss timer: the next test).
	if s := l.State(); s != Lost {
		t.Fatalf("State after an hour asleep = %s, want %s", s, Lost)
	}
}

// State is called with callers' locks held (pkg/election's Get): it must
// never run OnTransition, which may take those locks again.
func TestStateRunsNoCallback(t *testing.T) {
	l := heldLease()
	called := false
	l.opts.OnTransition = func(Transition) { called = true }
	suspend(l)
	if s := l.State(); s != Lost || called {
		t.Fatalf("State = %s, OnTransition called = %v; want LOST without a callback", s, called)
	}
}

// The loss timer set for the full TTL before the suspend would fire late by
// the suspend's length: it looks again at least every elapsed.Poll.
func TestTheLossTimerSeesASuspendWithinAPoll(t *testing.T) {
	l := heldLease()
	l.wg.Add(1)
	go l.lossTimer()
	defer func() { l.cancel(); l.wg.Wait() }()
	time.Sleep(100 * time.Millisecond)
	suspend(l)
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("not LOST 5 s after the resume, with a %v TTL", l.TTL)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != Lost {
		t.Fatalf("state %s, want %s", l.state, Lost)
	}
}

// Package demokit is what the demos share. The timeline: processes print one JSON event
// per line, the orchestrator collects them into a timeline it prints as it
// goes and waits on.
package demokit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Event is one line a demo process prints for the orchestrator.
type Event struct {
	Actor  string `json:"actor"`
	Event  string `json:"event"`
	Epoch  int64  `json:"epoch,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Emit prints an event on standard output, for the orchestrator to read.
func Emit(actor, ev string, epoch int64, detail string) {
	b, _ := json.Marshal(Event{Actor: actor, Event: ev, Epoch: epoch, Detail: detail})
	fmt.Println(string(b))
}

// Timeline collects events in the order they arrive.
type Timeline struct {
	mu    sync.Mutex
	start time.Time
	seen  []Event
	cond  *sync.Cond
}

// New starts a timeline and prints its header.
func New() *Timeline {
	t := &Timeline{start: time.Now()}
	t.cond = sync.NewCond(&t.mu)
	fmt.Printf("%-8s %-9s %-22s %-6s %s\n", "TIME", "ACTOR", "EVENT", "EPOCH", "DETAIL")
	return t
}

// Add records and prints an event.
func (t *Timeline) Add(e Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	epoch := ""
	if e.Epoch > 0 {
		epoch = fmt.Sprint(e.Epoch)
	}
	fmt.Printf("%7.2fs %-9s %-22s %-6s %s\n", time.Since(t.start).Seconds(), e.Actor, e.Event, epoch, e.Detail)
	t.seen = append(t.seen, e)
	t.cond.Broadcast()
}

// Follow adds every event a process prints on r (other lines are ignored).
func (t *Timeline) Follow(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e Event
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Actor != "" {
			t.Add(e)
		}
	}
}

// Wait blocks until actor reported ev (or an error), up to d.
func (t *Timeline) Wait(actor, ev string, d time.Duration) (Event, error) {
	return t.WaitFor(actor, ev, "", d)
}

// WaitFor blocks until actor reported ev with detail containing about (or
// an error), up to d.
func (t *Timeline) WaitFor(actor, ev, about string, d time.Duration) (Event, error) {
	deadline := time.Now().Add(d)
	go func() { time.Sleep(d); t.cond.Broadcast() }()
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		for _, e := range t.seen {
			if e.Actor == actor && e.Event == ev && strings.Contains(e.Detail, about) {
				return e, nil
			}
			if e.Actor == actor && e.Event == "error" {
				return e, fmt.Errorf("%s failed: %s", actor, e.Detail)
			}
		}
		if time.Now().After(deadline) {
			return Event{}, fmt.Errorf("%s did not report %q within %v", actor, ev, d)
		}
		t.cond.Wait()
	}
}

// Find is the first event ev of actor, if any.
func (t *Timeline) Find(actor, ev string) (Event, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.seen {
		if e.Actor == actor && e.Event == ev {
			return e, true
		}
	}
	return Event{}, false
}

// All is every event so far.
func (t *Timeline) All() []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Event(nil), t.seen...)
}

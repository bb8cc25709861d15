package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// fakeLock is a leader-election lock whose writes succeed unless failing.
type fakeLock struct {
	resourcelock.Interface
	id      string
	failing bool
}

func (f *fakeLock) Identity() string { return f.id }

func (f *fakeLock) Create(context.Context, resourcelock.LeaderElectionRecord) error { return f.err() }

func (f *fakeLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return f.err() }

func (f *fakeLock) err() error {
	if f.failing {
		return errors.New("refused")
	}
	return nil
}

// The term is certain only within the renew deadline of a renewal that
// succeeded and named this process: not before the first, not after a
// failed one or a release, not once the deadline has passed.
func TestLeadershipLockCurrent(t *testing.T) {
	ctx := context.Background()
	inner := &fakeLock{id: "me"}
	l := &LeadershipLock{Interface: inner, renewDeadline: time.Hour}
	mine := resourcelock.LeaderElectionRecord{HolderIdentity: "me"}
	if l.Current() {
		t.Fatal("current before any renewal")
	}
	inner.failing = true
	if err := l.Create(ctx, mine); err == nil || l.Current() {
		t.Fatal("a failed acquire counted")
	}
	inner.failing = false
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: ""}); err != nil || l.Current() {
		t.Fatal("a release (no holder) counted as a renewal")
	}
	if err := l.Create(ctx, mine); err != nil || !l.Current() {
		t.Fatal("an acquire did not count")
	}

	short := &LeadershipLock{Interface: inner, renewDeadline: 20 * time.Millisecond}
	if err := short.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	time.Sleep(40 * time.Millisecond)
	if short.Current() {
		t.Fatal("current past the renew deadline: a paused leader would vouch after its successor took over")
	}
	inner.failing = true
	if err := short.Update(ctx, mine); err == nil || short.Current() {
		t.Fatal("a failed renewal counted")
	}
}

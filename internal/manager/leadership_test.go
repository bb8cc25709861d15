package manager

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

func TestValidateLeaderElection(t *testing.T) {
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		ok                  bool
	}{
		{15 * time.Second, 10 * time.Second, 2 * time.Second, true},
		{4 * time.Second, 3 * time.Second, 500 * time.Millisecond, true},
		// Stored as 10 s: a standby may lead before the renew deadline.
		{10500 * time.Millisecond, 10200 * time.Millisecond, 2 * time.Second, false},
		// Stored as 0 s: every standby leads at once.
		{900 * time.Millisecond, 800 * time.Millisecond, 200 * time.Millisecond, false},
		{4 * time.Second, 3 * time.Second, 2600 * time.Millisecond, false},
		{4 * time.Second, 3 * time.Second, 0, false},
		{3 * time.Second, 3 * time.Second, time.Second, false},
	} {
		err := ValidateLeaderElection(tc.lease, tc.renew, tc.retry)
		if (err == nil) != tc.ok {
			t.Errorf("lease %v, renew %v, retry %v: got %v, want ok=%v", tc.lease, tc.renew, tc.retry, err, tc.ok)
		}
	}
}

// A release ends the term before the write that lets a standby in.
func TestLeadershipLockReleaseEndsTheTerm(t *testing.T) {
	ctx := context.Background()
	l := &LeadershipLock{Interface: &fakeLock{id: "me"}, renewDeadline: time.Hour}
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil || !l.Current() {
		t.Fatal("a renewal did not count")
	}
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil || l.Current() {
		t.Fatal("still current after releasing the lease")
	}
}

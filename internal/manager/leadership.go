package manager

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/fencekeeper/fencekeeper/pkg/elapsed"
)

// LeaderElectionID names the manager's leader-election Lease.
const LeaderElectionID = "fencekeeper-manager.fencekeeper.io"

// LeadershipLock is the leader-election lock, remembering when this
// process last wrote it as the holder (an acquire or a renewal that
// succeeded), on its own clock.
//
// A leader can be paused (a stopped process, a frozen VM) for longer than
// the lease and resume still believing it leads: its elector notices at
// its next renewal, but its webhook may first answer requests that queued
// during the pause, while the next leader has granted and broken holds it
// never saw. No successor can take the lease before LeaseDuration has
// passed since the last renewal it saw, so this process's term is certain
// only within RenewDeadline (shorter) of its own last renewal, and its
// authority vouches for nothing outside that (Current).
type LeadershipLock struct {
	resourcelock.Interface
	renewDeadline time.Duration
	renewed       atomic.Pointer[time.Time]
}

// NewLeaderElectionLock returns the Lease lock namespace/name for
// identity "<hostname>_<uuid>" (as controller-runtime makes it), wrapped
// in a LeadershipLock. recorder may be nil (no leader-election Events).
func NewLeaderElectionLock(cfg *rest.Config, namespace, name string, renewDeadline time.Duration, recorder record.EventRecorder) (*LeadershipLock, error) {
	if namespace == "" {
		return nil, fmt.Errorf("the leader-election namespace is not set")
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	// One hung request must not cost the lease (controller-runtime's rule).
	cfg.Timeout = max(renewDeadline/2, time.Second)
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	coordination, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	inner, err := resourcelock.New(resourcelock.LeasesResourceLock, namespace, name, core, coordination,
		resourcelock.ResourceLockConfig{Identity: host + "_" + string(uuid.NewUUID()), EventRecorder: recorder})
	if err != nil {
		return nil, err
	}
	return &LeadershipLock{Interface: inner, renewDeadline: renewDeadline}, nil
}

// ValidateLeaderElection checks the leader-election timing the way the
// lease is used: a standby waits the lease duration as stored on the Lease
// (whole seconds), which must exceed the renew deadline (the leader's
// term, and its vouching, end within it); client-go needs the renew
// deadline above 1.2 retry periods.
func ValidateLeaderElection(leaseDuration, renewDeadline, retryPeriod time.Duration) error {
	stored := leaseDuration.Truncate(time.Second)
	switch {
	case retryPeriod <= 0:
		return fmt.Errorf("the retry period (%v) must be positive", retryPeriod)
	case float64(renewDeadline) <= 1.2*float64(retryPeriod):
		return fmt.Errorf("the renew deadline (%v) must exceed 1.2 retry periods (%v)", renewDeadline, retryPeriod)
	case stored <= renewDeadline:
		return fmt.Errorf("the lease duration as stored on the Lease, in whole seconds (%v of %v), must exceed the renew deadline (%v): "+
			"a standby may lead once it has passed, and the leader vouches until the renew deadline", stored, leaseDuration, renewDeadline)
	}
	return nil
}

// Create is the elector's acquire of a Lease that does not exist yet.
func (l *LeadershipLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.wrote(rec, func() error { return l.Interface.Create(ctx, rec) })
}

// Update is the elector's acquire, renewal or release.
func (l *LeadershipLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.wrote(rec, func() error { return l.Interface.Update(ctx, rec) })
}

// wrote records when a write naming this process as the holder was sent,
// once it succeeded (sent, not answered: a successor counts from when it
// saw the write, which is later).
func (l *LeadershipLock) wrote(rec resourcelock.LeaderElectionRecord, write func() error) error {
	if rec.HolderIdentity != l.Identity() {
		// A release: the term ends before the write that lets a standby in.
		l.renewed.Store(nil)
		return write()
	}
	sent := time.Now()
	if err := write(); err != nil {
		return err
	}
	l.renewed.Store(&sent)
	return nil
}

// Current reports whether this process's leadership is certainly its own
// now: its last renewal was sent less than RenewDeadline ago. Both the
// monotonic and the wall clock are asked, and the longer elapsed time
// counts: the monotonic clock does not advance while the machine is
// suspended, and a wall clock that jumps forward only costs vouching (the
// webhook reads live) until the next renewal. A pause that stops both
// clocks (some hypervisors pause a VM that way) cannot be seen from
// inside: that limit is documented.
func (l *LeadershipLock) Current() bool {
	t := l.renewed.Load()
	if t == nil {
		return false
	}
	return elapsed.Since(*t) < l.renewDeadline
}

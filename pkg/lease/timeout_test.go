package lease

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// AcquireTimeout is checked before any request and becomes the claim's
// acquireTimeoutSeconds rounded up: a wait is never cut shorter than asked.
func TestAcquireTimeoutOption(t *testing.T) {
	for _, tt := range []struct {
		d       *time.Duration
		seconds *int32
		err     string
	}{
		{d: nil, seconds: nil},
		{d: ptr.To(time.Duration(0)), seconds: ptr.To[int32](0)},
		{d: ptr.To(time.Nanosecond), seconds: ptr.To[int32](1)},
		{d: ptr.To(1500 * time.Millisecond), seconds: ptr.To[int32](2)},
		{d: ptr.To(3 * time.Second), seconds: ptr.To[int32](3)},
		{d: ptr.To(24 * time.Hour), seconds: ptr.To[int32](86400)},
		{d: ptr.To(-time.Second), err: "AcquireTimeout -1s: want 0 (try once) to 24h, or nil"},
		{d: ptr.To(24*time.Hour + time.Nanosecond), err: "AcquireTimeout 24h0m0.000000001s: want 0 (try once) to 24h"},
	} {
		o := Options{AcquireTimeout: tt.d}
		err := o.defaults()
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("AcquireTimeout %v: error %v, want %q", ptr.Deref(tt.d, -1), err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("AcquireTimeout %v: %v", ptr.Deref(tt.d, -1), err)
			continue
		}
		if got := acquireTimeoutSeconds(o.AcquireTimeout); !ptr.Equal(got, tt.seconds) {
			t.Errorf("AcquireTimeout %v: acquireTimeoutSeconds %v, want %v", ptr.Deref(tt.d, -1), showSeconds(got), showSeconds(tt.seconds))
		}
	}
}

// A claim ended for its acquire timeout is ErrAcquireTimeout, not ErrExpired
// (it never held the lock); a claim turned away is ErrQueueFull; any other
// Expired claim is ErrExpired.
func TestPhaseDoneReasons(t *testing.T) {
	ended := func(reason string) *fkv1.FencedLease {
		c := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
		c.Status.Phase = fkv1.PhaseExpired
		c.Status.Conditions = []metav1.Condition{{Type: fkv1.ConditionHeld, Status: metav1.ConditionFalse, Reason: reason, Message: "why"}}
		return c
	}
	for reason, want := range map[string]error{
		fkv1.ReasonAcquireTimeout: ErrAcquireTimeout,
		fkv1.ReasonQueueFull:      ErrQueueFull,
		fkv1.ReasonExpired:        ErrExpired,
		fkv1.ReasonForcedRelease:  ErrExpired,
	} {
		done, err := phaseDone(ended(reason))
		if !done || !errors.Is(err, want) {
			t.Errorf("Expired/%s: done %v, error %v, want %v", reason, done, err, want)
		}
		for _, other := range []error{ErrAcquireTimeout, ErrQueueFull, ErrExpired} {
			if !errors.Is(want, other) && errors.Is(err, other) {
				t.Errorf("Expired/%s: error %v is also %v", reason, err, other)
			}
		}
	}
	pending := &fkv1.FencedLease{}
	pending.Status.Phase = fkv1.PhasePending
	if done, err := phaseDone(pending); done || err != nil {
		t.Errorf("Pending: done %v, error %v; want still waiting", done, err)
	}
}

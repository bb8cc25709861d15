package lease

import (
	"context"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// watches is a client whose watches are fake ones the test drives, or the
// errors it queues.
type watches struct {
	mu      sync.Mutex
	errs    []error
	started chan *watch.FakeWatcher
	// leases, when set, gets the Lease watches (started the others).
	leases chan *watch.FakeWatcher
	rvs    []string // the resourceVersion of every watch started
}

func (w *watches) client() client.WithWatch {
	return interceptor.NewClient(fake.NewClientBuilder().WithScheme(Scheme()).Build(), interceptor.Funcs{
		Watch: func(_ context.Context, _ client.WithWatch, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
			lo := (&client.ListOptions{}).ApplyOptions(opts)
			w.mu.Lock()
			defer w.mu.Unlock()
			if lo.FieldSelector == nil || lo.FieldSelector.String() != "metadata.name=report" {
				panic("a follow watched more than its one object: " + lo.FieldSelector.String())
			}
			w.rvs = append(w.rvs, lo.Raw.ResourceVersion)
			if len(w.errs) > 0 {
				err := w.errs[0]
				w.errs = w.errs[1:]
				return nil, err
			}
			fw := watch.NewFakeWithChanSize(10, false)
			if _, isLease := list.(*coordinationv1.LeaseList); isLease && w.leases != nil {
				w.leases <- fw
			} else {
				w.started <- fw
			}
			return fw, nil
		},
	})
}

func ledgerLease(rv string, uid types.UID, epoch string) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "report", ResourceVersion: rv,
		Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: "report"},
		Annotations: map[string]string{fkv1.AnnotationEpoch: epoch, fkv1.AnnotationClaimUID: string(uid)}}}
	return l
}

func next[T client.Object](t *testing.T, ch <-chan seen[T]) (seen[T], bool) {
	t.Helper()
	select {
	case s, open := <-ch:
		return s, open
	case <-time.After(5 * time.Second):
		t.Fatal("nothing reported within 5s")
		return seen[T]{}, false
	}
}

func TestFollowReportsVersionsDeletesAndRestartsAfterAnErrorEvent(t *testing.T) {
	w := &watches{started: make(chan *watch.FakeWatcher, 4), errs: []error{apierrors.NewServiceUnavailable("busy")}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := follow(ctx, w.client(), client.ObjectKey{Namespace: "ns", Name: "report"}, leaseKind, reading(false), "")

	fw := <-w.started // after the transient error, retried
	fw.Add(ledgerLease("10", "a", "7"))
	if s, _ := next(t, ch); s.obj == nil || s.obj.ResourceVersion != "10" {
		t.Fatalf("got %+v, want version 10", s)
	}
	fw.Action(watch.Bookmark, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "11"}})
	fw.Delete(ledgerLease("12", "a", "7"))
	if s, _ := next(t, ch); !s.gone {
		t.Fatalf("got %+v, want gone", s)
	}
	fw.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired})
	fw2 := <-w.started
	fw2.Add(ledgerLease("20", "b", "8"))
	if s, _ := next(t, ch); s.obj == nil || s.obj.ResourceVersion != "20" {
		t.Fatalf("got %+v, want version 20", s)
	}
	fw2.Stop() // a normal end: resumes from the last version
	fw3 := <-w.started
	defer fw3.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	if want := []string{"", "", "", "20"}; len(w.rvs) != len(want) || w.rvs[2] != "" || w.rvs[3] != "20" {
		t.Fatalf("watches started from versions %q, want %q (after an error event, from scratch; after a normal end, from the last seen)", w.rvs, want)
	}
}

func TestFollowEndsOnAnErrorItDoesNotRetry(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "report", nil)
	w := &watches{started: make(chan *watch.FakeWatcher, 1), errs: []error{forbidden}}
	ch := follow(context.Background(), w.client(), client.ObjectKey{Namespace: "ns", Name: "report"}, leaseKind, reading(false), "")
	if s, open := next(t, ch); !open || !apierrors.IsForbidden(s.err) {
		t.Fatalf("got %+v (open %v), want the Forbidden error", s, open)
	}
	if _, open := next(t, ch); open {
		t.Fatal("the follow went on after an error it does not retry")
	}
}

func TestFollowWithReadReportsAMissingObjectGone(t *testing.T) {
	w := &watches{started: make(chan *watch.FakeWatcher, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := follow(ctx, w.client(), client.ObjectKey{Namespace: "ns", Name: "report"}, leaseKind, reading(true), "")
	if s, _ := next(t, ch); !s.gone {
		t.Fatalf("got %+v, want gone (the fake has no Lease)", s)
	}
	(<-w.started).Stop()
}

// A grant seen on the Lease hands the wait's Lease follow to the holder,
// which from then on reads the Lease when the follow starts over (a
// waiter's follow did not: its Lease may not exist yet): a Lease deleted
// while no watch ran is reported gone, not missed.
func TestHandedOverLeaseFollowReadsWhenItStartsOver(t *testing.T) {
	w := &watches{started: make(chan *watch.FakeWatcher, 4), leases: make(chan *watch.FakeWatcher, 4)}
	c := NewClientFrom(w.client(), "ns")
	opts := Options{TTL: 30 * time.Second}
	if err := opts.defaults(); err != nil {
		t.Fatal(err)
	}
	l := newLease(c, "report", "W1", opts)
	defer l.cancel()
	claim := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "report", UID: "us", ResourceVersion: "5"},
		Spec: fkv1.FencedLeaseSpec{LockName: "report", HolderIdentity: "W1"}}
	l.ClaimName, l.UID, l.MaxHolders = claim.Name, claim.UID, 1
	type result struct {
		g   grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := c.waitGrant(context.Background(), l, claim)
		done <- result{g, err}
	}()
	var lw *watch.FakeWatcher
	select {
	case lw = <-w.leases: // a new claim may be next: it watches the Lease
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter started no Lease watch")
	}
	lw.Add(ledgerLease("10", "us", "7"))
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no grant within 5s")
	}
	if r.err != nil || r.g.source != sourceLease || r.g.epoch != 7 || r.g.watches.leases == nil {
		t.Fatalf("waitGrant = %+v, %v; want epoch 7 seen on the Lease, its follow handed over", r.g, r.err)
	}
	defer r.g.watches.stop()
	// The stream ends with an error: the follow starts over, and the fake
	// has no Lease.
	lw.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired})
	if s, _ := next(t, r.g.watches.leases); !s.gone {
		t.Fatalf("got %+v, want the Lease reported gone", s)
	}
}

func TestLeaseGrant(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		want  int64 // 0: no grant
	}{
		{"names us with an epoch", ledgerLease("1", "us", "42"), 42},
		{"names another claim", ledgerLease("1", "them", "42"), 0},
		{"names nobody", ledgerLease("1", "", "42"), 0},
		{"names us with no epoch yet", ledgerLease("1", "us", "0"), 0},
		{"names us with an unreadable epoch", ledgerLease("1", "us", "x"), 0},
		{"not managed by fencekeeper", func() *coordinationv1.Lease {
			l := ledgerLease("1", "us", "42")
			delete(l.Labels, fkv1.LabelManagedBy)
			return l
		}(), 0},
	} {
		g, ok := leaseGrant(tc.lease, "report", "us", false)
		if got := map[bool]int64{true: g.epoch}[ok]; got != tc.want || (ok && (g.source != sourceLease || g.lease != tc.lease)) {
			t.Errorf("%s: grant %+v, %v; want epoch %d", tc.name, g, ok, tc.want)
		}
	}
}

func TestMayBeNext(t *testing.T) {
	claim := func(phase fkv1.FencedLeasePhase, reason string) *fkv1.FencedLease {
		c := &fkv1.FencedLease{Status: fkv1.FencedLeaseStatus{Phase: phase}}
		if reason != "" {
			c.Status.Conditions = []metav1.Condition{{Type: fkv1.ConditionHeld, Status: metav1.ConditionFalse, Reason: reason}}
		}
		return c
	}
	for _, tc := range []struct {
		c    *fkv1.FencedLease
		want bool
	}{
		{claim("", ""), true},
		{claim(fkv1.PhasePending, ""), true},
		{claim(fkv1.PhasePending, fkv1.ReasonNext), true},
		{claim(fkv1.PhasePending, fkv1.ReasonQueued), false},
		{claim(fkv1.PhasePending, fkv1.ReasonLockConflict), false},
		{claim(fkv1.PhasePending, fkv1.ReasonNoIdentity), false},
	} {
		if got := mayBeNext(tc.c); got != tc.want {
			t.Errorf("mayBeNext(%s %v) = %v, want %v", tc.c.Status.Phase, tc.c.Status.Conditions, got, tc.want)
		}
	}
}

package lease

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// semaphoreLease is the lock's Lease of a semaphore of capacity 3 with the
// given permits (epoch -> claim UID).
func semaphoreLease(rv string, permits map[int64]types.UID) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "report", ResourceVersion: rv,
		Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: "report"}}}
	led := fkv1.ReadLedger(l, "report")
	led.Exists, led.Epoch, led.EpochValid, led.Capacity = true, 50, true, 3
	for epoch, uid := range permits {
		led.Permits = append(led.Permits, fkv1.Permit{Epoch: epoch, Claim: "c-" + string(uid), UID: uid, Holder: "W-" + string(uid), TTL: 15})
	}
	led.ApplyTo(l, "report")
	return l
}

// permitLease is the renewal Lease the authority makes for permit epoch.
func permitLease(epoch int64, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fkv1.PermitLeaseName("report", epoch),
			Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: "report",
				fkv1.LabelPermitEpoch: fkv1.FormatEpoch(epoch)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: time.Now().Add(-time.Second)}},
	}
}

// permitHolder is a lease holding permit 42 of the semaphore "report" for
// claim "us" (holder W-us), against c, not started.
func permitHolder(c client.WithWatch) *Lease {
	cl := NewClientFrom(c, "ns")
	cl.log = logr.Discard()
	opts := Options{TTL: 15 * time.Second, MaxHolders: 3}
	if err := opts.defaults(); err != nil {
		panic(err)
	}
	opts.RenewInterval = 300 * time.Millisecond
	l := newLease(cl, "report", "W-us", opts)
	l.ClaimName, l.UID, l.Epoch, l.TTL, l.MaxHolders = "c-us", "us", 42, 15*time.Second, 3
	return l
}

func TestLeaseGrantOfAPermit(t *testing.T) {
	mutexNamingUs := ledgerLease("1", "us", "42")
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		want  int64 // 0: no grant
	}{
		{"a permit entry names us: its epoch", semaphoreLease("1", map[int64]types.UID{41: "them", 42: "us"}), 42},
		{"entries name others only", semaphoreLease("1", map[int64]types.UID{41: "them"}), 0},
		{"no entries", semaphoreLease("1", nil), 0},
		{"mutex holder annotations are no permit", mutexNamingUs, 0},
		{"entries unreadable", func() *coordinationv1.Lease {
			l := semaphoreLease("1", map[int64]types.UID{42: "us"})
			l.Annotations[fkv1.AnnotationPermitPrefix+"43"] = "not json"
			return l
		}(), 0},
		{"not managed by fencekeeper", func() *coordinationv1.Lease {
			l := semaphoreLease("1", map[int64]types.UID{42: "us"})
			delete(l.Labels, fkv1.LabelManagedBy)
			return l
		}(), 0},
	} {
		g, ok := leaseGrant(tc.lease, "report", "us", true)
		if got := map[bool]int64{true: g.epoch}[ok]; got != tc.want || (ok && (g.source != sourceLease || g.lease != tc.lease)) {
			t.Errorf("%s: grant %+v, %v; want epoch %d", tc.name, g, ok, tc.want)
		}
	}
	// A mutex claim is not granted by a permit entry naming it.
	if _, ok := leaseGrant(semaphoreLease("1", map[int64]types.UID{42: "us"}), "report", "us", false); ok {
		t.Error("a permit entry granted a mutex claim")
	}
}

func TestShowsPermit(t *testing.T) {
	l := permitHolder(fake.NewClientBuilder().WithScheme(Scheme()).Build())
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		lost  string // "" : shows the permit
	}{
		{"our entry among others", semaphoreLease("1", map[int64]types.UID{41: "them", 42: "us", 43: "more"}), ""},
		{"our entry gone", semaphoreLease("1", map[int64]types.UID{41: "them"}), "no longer shows permit 42"},
		{"our epoch names another claim", semaphoreLease("1", map[int64]types.UID{42: "them"}), `held by claim "them"`},
		{"our claim with another epoch", semaphoreLease("1", map[int64]types.UID{42: "us", 44: "us"}), "permit epoch 44"},
		{"our claim only with another epoch", semaphoreLease("1", map[int64]types.UID{44: "us"}), "permit epoch 44"},
		{"entries unreadable", func() *coordinationv1.Lease {
			x := semaphoreLease("1", map[int64]types.UID{42: "us"})
			x.Annotations[fkv1.AnnotationPermitPrefix+"x"] = "{}"
			return x
		}(), "cannot be read"},
		{"not managed", func() *coordinationv1.Lease {
			x := semaphoreLease("1", map[int64]types.UID{42: "us"})
			x.Labels = nil
			return x
		}(), "not managed by fencekeeper"},
	} {
		err := l.showsPermit(tc.lease)
		switch {
		case tc.lost == "" && err != nil:
			t.Errorf("%s: %v, want the permit shown", tc.name, err)
		case tc.lost != "" && (!errors.Is(err, ErrLost) || !strings.Contains(err.Error(), tc.lost)):
			t.Errorf("%s: %v, want ErrLost saying %q", tc.name, err, tc.lost)
		}
	}
}

func TestShowsPermitLease(t *testing.T) {
	l := permitHolder(fake.NewClientBuilder().WithScheme(Scheme()).Build())
	if err := l.showsPermitLease(permitLease(42, "W-us")); err != nil {
		t.Fatalf("our permit's Lease: %v", err)
	}
	for name, pl := range map[string]*coordinationv1.Lease{
		"another holder": permitLease(42, "W-them"),
		"no holder": func() *coordinationv1.Lease {
			x := permitLease(42, "W-us")
			x.Spec.HolderIdentity = nil
			return x
		}(),
		"another epoch label": func() *coordinationv1.Lease {
			x := permitLease(42, "W-us")
			x.Labels[fkv1.LabelPermitEpoch] = "43"
			return x
		}(),
		"another lock": func() *coordinationv1.Lease {
			x := permitLease(42, "W-us")
			x.Labels[fkv1.LabelLock] = "other"
			return x
		}(),
		"not managed": func() *coordinationv1.Lease {
			x := permitLease(42, "W-us")
			delete(x.Labels, fkv1.LabelManagedBy)
			return x
		}(),
	} {
		if err := l.showsPermitLease(pl); !errors.Is(err, ErrLost) {
			t.Errorf("%s: %v, want ErrLost", name, err)
		}
	}
}

// A permit renews its own Lease, never the lock's; the lock's Lease (as
// last seen) must still show the permit.
func TestRenewPermitAdvancesThePermitLeaseOnly(t *testing.T) {
	ledger := semaphoreLease("", map[int64]types.UID{41: "them", 42: "us"})
	pl := permitLease(42, "W-us")
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(ledger, pl).Build()
	l := permitHolder(c)
	before := pl.Spec.RenewTime.Time
	if err := l.renew(context.Background()); err != nil {
		t.Fatalf("renew: %v", err)
	}
	var got, lock coordinationv1.Lease
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(pl), &got)
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(ledger), &lock)
	if !got.Spec.RenewTime.After(before) {
		t.Errorf("the permit's Lease was not renewed: renewTime %v, was %v", got.Spec.RenewTime, before)
	}
	if lock.Spec.RenewTime != nil {
		t.Errorf("the lock's Lease was renewed: %v", lock.Spec.RenewTime)
	}
	if l.Remaining() <= 0 || l.RenewalLease() != "report-permit-42" {
		t.Errorf("Remaining %v, RenewalLease %q", l.Remaining(), l.RenewalLease())
	}

	// A second renewal starts from the version the first wrote.
	if err := l.renew(context.Background()); err != nil {
		t.Fatalf("second renew: %v", err)
	}

	// The lock's Lease no longer shows the permit: LOST, nothing renewed.
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(pl), &got)
	l.mu.Lock()
	l.ledger = semaphoreLease("9", map[int64]types.UID{41: "them"})
	l.mu.Unlock()
	if err := l.renew(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("renew with the entry gone: %v, want ErrLost", err)
	}
	var after coordinationv1.Lease
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(pl), &after)
	if !after.Spec.RenewTime.Equal(got.Spec.RenewTime) {
		t.Error("renewed a permit the lock's Lease no longer shows")
	}
}

// Right after the grant the permit's Lease may not exist yet: that is
// retried, not a loss, while the lock's Lease shows the permit.
func TestRenewPermitWaitsForItsLeaseToAppear(t *testing.T) {
	ledger := semaphoreLease("", map[int64]types.UID{42: "us"})
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(ledger).Build()
	l := permitHolder(c)
	go func() {
		time.Sleep(80 * time.Millisecond)
		_ = c.Create(context.Background(), permitLease(42, "W-us"))
	}()
	if err := l.renew(context.Background()); err != nil {
		t.Fatalf("renew: %v, want it to wait for the permit's Lease", err)
	}
	if l.Remaining() <= 0 {
		t.Fatal("no acknowledged renewal")
	}

	// Once seen, the permit's Lease gone is the permit's end.
	if err := c.Delete(context.Background(), permitLease(42, "W-us")); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.lease = nil
	l.mu.Unlock()
	if err := l.renew(context.Background()); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("renew with the permit's Lease deleted: %v, want ErrLost", err)
	}
}

// A permit whose Lease never appears is given up after RenewInterval (not
// a loss: the grant was never renewed); one whose entry disappears while
// it waits is LOST at once.
func TestRenewPermitGivesUpWaitingForItsLease(t *testing.T) {
	ledger := semaphoreLease("", map[int64]types.UID{42: "us"})
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(ledger).Build()
	l := permitHolder(c)
	start := time.Now()
	err := l.renew(context.Background())
	if err == nil || errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "was not created within") {
		t.Fatalf("renew with no permit Lease: %v", err)
	}
	if took := time.Since(start); took < l.opts.RenewInterval || took > l.opts.RenewInterval+time.Second {
		t.Fatalf("gave up after %v, want about RenewInterval (%v)", took, l.opts.RenewInterval)
	}

	// The entry is removed while the holder waits for the permit's Lease.
	var mu sync.Mutex
	reads := 0
	c2 := interceptor.NewClient(fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(semaphoreLease("", map[int64]types.UID{42: "us"})).Build(),
		interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if key.Name == "report" {
				mu.Lock()
				reads++
				if reads == 3 {
					cur := &coordinationv1.Lease{}
					_ = c.Get(ctx, key, cur)
					led := fkv1.ReadLedger(cur, "report")
					led.Permits = nil
					led.ApplyTo(cur, "report")
					_ = c.Update(ctx, cur)
				}
				mu.Unlock()
			}
			return c.Get(ctx, key, obj, opts...)
		}})
	l2 := permitHolder(c2)
	start = time.Now()
	if err := l2.renew(context.Background()); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "no longer shows permit 42") {
		t.Fatalf("renew with the entry removed while waiting: %v, want ErrLost", err)
	}
	if time.Since(start) > l2.opts.RenewInterval {
		t.Fatal("waited out the renew interval although the entry was gone")
	}
}

// A permit's renewal Lease that names another holder is not ours to renew.
func TestRenewPermitRefusesAnotherHoldersLease(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(semaphoreLease("", map[int64]types.UID{42: "us"}), permitLease(42, "W-them")).Build()
	if err := permitHolder(c).renew(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("renew: %v, want ErrLost", err)
	}
}

func TestMaxHoldersOption(t *testing.T) {
	for _, tt := range []struct {
		n    int32
		spec *int32
		err  bool
	}{{0, nil, false}, {1, nil, false}, {2, ptr.To[int32](2), false}, {100, ptr.To[int32](100), false}, {101, nil, true}, {-1, nil, true}} {
		o := Options{MaxHolders: tt.n}
		err := o.defaults()
		if (err != nil) != tt.err {
			t.Errorf("MaxHolders %d: error %v, want error %v", tt.n, err, tt.err)
			continue
		}
		if err != nil {
			if !strings.Contains(err.Error(), "want 1..100") {
				t.Errorf("MaxHolders %d: error %q does not say the range", tt.n, err)
			}
			continue
		}
		if got := maxHoldersSpec(o.MaxHolders); !ptr.Equal(got, tt.spec) {
			t.Errorf("MaxHolders %d: spec.maxHolders %v, want %v", tt.n, ptr.Deref(got, 0), ptr.Deref(tt.spec, 0))
		}
	}
}

// The claim asks for the capacity; a retry that finds a claim made with
// another capacity (immutable) is an error naming both.
func TestCreateClaimSetsMaxHolders(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(Scheme()).Build()
	cl := NewClientFrom(c, "ns")
	opts := Options{RequestID: "r1", MaxHolders: 3}
	if err := opts.defaults(); err != nil {
		t.Fatal(err)
	}
	claim, err := cl.createClaim(context.Background(), newLease(cl, "report", "W1", opts))
	if err != nil {
		t.Fatal(err)
	}
	if claim.MaxHolders() != 3 {
		t.Fatalf("spec.maxHolders %v, want 3", claim.Spec.MaxHolders)
	}
	again, err := cl.createClaim(context.Background(), newLease(cl, "report", "W1", opts))
	if err != nil || again.UID != claim.UID {
		t.Fatalf("retry with the same options: %v, %v", again, err)
	}
	mutex := opts
	mutex.MaxHolders = 0
	_, err = cl.createClaim(context.Background(), newLease(cl, "report", "W1", mutex))
	if err == nil || !strings.Contains(err.Error(), "exists with maxHolders 3, not 1") {
		t.Fatalf("retry asking for a mutex: %v", err)
	}
}

// A held permit is LOST the moment the lock's Lease stops showing its
// entry (released, expired or broken), not at its next renewal; versions
// that still show it keep it, and become what renewals check.
func TestWatchLeaseLosesAPermitWhoseEntryGoes(t *testing.T) {
	w := &watches{started: make(chan *watch.FakeWatcher, 2)}
	l := permitHolder(w.client())
	l.state, l.lastAckSent = Held, time.Now()
	l.ledger = semaphoreLease("5", map[int64]types.UID{42: "us"})
	l.wg.Add(1)
	go l.watchLease()
	defer func() { l.stopOnce(); l.cancel(); l.wg.Wait() }()
	fw := <-w.started
	fw.Modify(semaphoreLease("6", map[int64]types.UID{42: "us", 43: "them"}))
	time.Sleep(50 * time.Millisecond)
	if s := l.State(); s != Held {
		t.Fatalf("state %s after a version still showing the permit", s)
	}
	l.mu.Lock()
	rv := l.ledger.ResourceVersion
	l.mu.Unlock()
	if rv != "6" {
		t.Fatalf("renewals check version %s of the lock's Lease, want the last seen (6)", rv)
	}
	fw.Modify(semaphoreLease("7", map[int64]types.UID{43: "them"}))
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not LOST with the permit's entry gone")
	}
	if s := l.State(); s != Lost {
		t.Fatalf("state %s, want LOST", s)
	}
}

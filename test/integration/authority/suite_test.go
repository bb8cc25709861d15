// Package authority_test holds the lock authority's scenario tests: claims,
// Leases and pods against a real kube-apiserver and etcd (envtest), with
// one or more managers wired as cmd/manager wires them (internal/manager,
// through test/envtestutil) running in the test process.
package authority_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
	claimhistory "github.com/fencekeeper/fencekeeper/test/history"
)

var (
	suite   *envtestutil.Suite
	testEnv *envtest.Environment
	cfg     *rest.Config
	k8s     client.WithWatch
	scheme  = envtestutil.Scheme()
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Lock controller suite")
}

var _ = BeforeSuite(func() {
	// The claim-identity policy (config/policy) is in effect, as wherever
	// fencekeeper is installed: a claim that records no identity is never
	// granted (docs/design.md §2, rev. 3). The managers this suite starts
	// run as its own identity, which the policy's parameter names. Specs
	// that need a claim recording no identity make it inside
	// envtestutil.WithoutClaimIdentity.
	var err error
	suite, err = envtestutil.StartSuite(context.Background(), envtestutil.SuiteOptions{
		Log: GinkgoWriter, ClaimIdentity: true, Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	testEnv, cfg, k8s = suite.Env, suite.Config, suite.Client
})

var _ = AfterSuite(func() {
	if suite != nil {
		Expect(suite.Stop()).To(Succeed())
	}
})

// writeCounter counts the writes a manager sends to Leases and FencedLeases,
// at the HTTP layer, the way the apiserver's request metrics would.
type writeCounter struct {
	leases, claims, pods atomic.Int64
	// leaseWins counts Lease writes the apiserver accepted (grants, frees,
	// repairs): with two managers racing, each must win some.
	leaseWins atomic.Int64
	// leaseUpdateWins counts accepted Lease updates (PUT): ledger writes
	// only, not the create or delete of a semaphore permit's renewal Lease.
	leaseUpdateWins atomic.Int64
	// claimReads counts reads of one claim by name (live reads: the
	// cache lists and watches, it never gets one by name).
	claimReads atomic.Int64
	// namespace, when set, limits counting to one namespace: the shared
	// control plane still holds earlier specs' locks, which this manager
	// also reconciles (and may rightly expire).
	namespace atomic.Value
}

func (w *writeCounter) total() int64 { return w.leases.Load() + w.claims.Load() + w.pods.Load() }

type countingTransport struct {
	next http.RoundTripper
	w    *writeCounter
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if ns, _ := t.w.namespace.Load().(string); ns != "" && !strings.Contains(req.URL.Path, "/namespaces/"+ns+"/") {
		return t.next.RoundTrip(req)
	}
	lease := false
	if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/fencedleases/") {
		t.w.claimReads.Add(1)
	}
	if req.Method != http.MethodGet {
		switch {
		case strings.Contains(req.URL.Path, "/fencedleases"):
			t.w.claims.Add(1)
		case strings.Contains(req.URL.Path, "/leases"):
			t.w.leases.Add(1)
			lease = true
		case strings.Contains(req.URL.Path, "/pods"):
			t.w.pods.Add(1)
		}
	}
	resp, err := t.next.RoundTrip(req)
	if lease && err == nil && resp.StatusCode < 300 {
		t.w.leaseWins.Add(1)
		if req.Method == http.MethodPut {
			t.w.leaseUpdateWins.Add(1)
		}
	}
	return resp, err
}

// runningManager is one fencekeeper manager started in this process, with
// a counter of the writes it sends.
type runningManager struct {
	*envtestutil.Manager
	writes *writeCounter
	mgr    ctrl.Manager
}

func (m *runningManager) Stop() {
	ExpectWithOffset(1, m.Manager.Stop()).To(Succeed())
}

// startManager starts a manager without leader election, as a separate
// replica would run: its own cache, clock and memory.
func startManager(conflictRecheck time.Duration) *runningManager {
	return startManagerWith(envtestutil.ManagerOptions{ForeignLeaseRecheck: conflictRecheck})
}

func startManagerWith(o envtestutil.ManagerOptions) *runningManager {
	w := &writeCounter{}
	o.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, w: w} }
	m, err := envtestutil.StartManager(cfg, o)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return &runningManager{Manager: m, writes: w, mgr: m.Mgr}
}

func newNamespace() string {
	ns, err := envtestutil.NewNamespace(context.Background(), k8s, "locks")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return ns
}

func newClaim(ns, name, lock, holder string, ttl int32) *fkv1.FencedLease {
	return &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: holder, LeaseDurationSeconds: ptr.To(ttl)},
	}
}

func createClaim(ns, name, lock, holder string, ttl int32) *fkv1.FencedLease {
	c := newClaim(ns, name, lock, holder, ttl)
	ExpectWithOffset(1, k8s.Create(context.Background(), c)).To(Succeed())
	return c
}

func getClaim(ns, name string) *fkv1.FencedLease {
	var c fkv1.FencedLease
	ExpectWithOffset(1, k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &c)).To(Succeed())
	return &c
}

func getLease(ns, lock string) *coordinationv1.Lease {
	var l coordinationv1.Lease
	ExpectWithOffset(1, k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: lock}, &l)).To(Succeed())
	return &l
}

// eventuallyPhase waits until the claim has the phase and returns it.
func eventuallyPhase(ns, name string, phase fkv1.FencedLeasePhase) *fkv1.FencedLease {
	var c fkv1.FencedLease
	EventuallyWithOffset(1, func() fkv1.FencedLeasePhase {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &c); err != nil {
			return ""
		}
		return c.Status.Phase
	}, 30*time.Second, 20*time.Millisecond).Should(Equal(phase), "claim %s/%s", ns, name)
	return &c
}

func deleteClaim(c *fkv1.FencedLease) {
	ExpectWithOffset(1, client.IgnoreNotFound(k8s.Delete(context.Background(), c,
		client.Preconditions{UID: &c.UID}))).To(Succeed())
}

// renew advances the Lease's renewTime the way a holder does: guarded by
// resourceVersion and only while the Lease names the holder's claim.
func renew(ns, lock string, claimUID string) error {
	l := getLease(ns, lock)
	if l.Annotations[fkv1.AnnotationClaimUID] != claimUID {
		return fmt.Errorf("lease names %q, not %q", l.Annotations[fkv1.AnnotationClaimUID], claimUID)
	}
	now := metav1.NewMicroTime(time.Now())
	l.Spec.RenewTime = &now
	return k8s.Update(context.Background(), l)
}

// history records every state of every claim and Lease in a namespace, as
// delivered by watches (test/history), so tests check the sequence and not
// just the end.
type history struct{ *claimhistory.History }

// recordHistory records ns's history until the spec ends.
func recordHistory(ns string) *history {
	return &history{claimhistory.Record(k8s, ns)}
}

// grants returns, per lock, the (epoch -> claim UID) pairs seen in claim
// statuses, failing on any epoch held by two claims or any claim whose epoch
// changed or whose phase went backward.
func (h *history) verifyClaims() map[string]map[int64]string {
	byLock := map[string]map[int64]string{}
	epochOf := map[string]int64{}
	rank := map[fkv1.FencedLeasePhase]int{"": 0, fkv1.PhasePending: 1, fkv1.PhaseHeld: 2, fkv1.PhaseExpired: 3}
	phaseOf := map[string]fkv1.FencedLeasePhase{}
	for _, c := range h.Claims() {
		uid := string(c.UID)
		ExpectWithOffset(1, rank[c.Status.Phase]).To(BeNumerically(">=", rank[phaseOf[uid]]),
			"claim %s moved back from %s to %s", c.Name, phaseOf[uid], c.Status.Phase)
		phaseOf[uid] = c.Status.Phase
		if c.Status.Epoch == 0 {
			ExpectWithOffset(1, c.Status.Phase).NotTo(Equal(fkv1.PhaseHeld), "claim %s Held without an epoch", c.Name)
			continue
		}
		if prev, ok := epochOf[uid]; ok {
			ExpectWithOffset(1, c.Status.Epoch).To(Equal(prev), "claim %s changed epoch", c.Name)
		}
		epochOf[uid] = c.Status.Epoch
		if byLock[c.Spec.LockName] == nil {
			byLock[c.Spec.LockName] = map[int64]string{}
		}
		if other, ok := byLock[c.Spec.LockName][c.Status.Epoch]; ok {
			ExpectWithOffset(1, other).To(Equal(uid), "epoch %d of lock %s granted to two claims", c.Status.Epoch, c.Spec.LockName)
		}
		byLock[c.Spec.LockName][c.Status.Epoch] = uid
	}
	return byLock
}

// verifyLeases checks the Lease history: per lock the epoch never moves
// backward, and each epoch names at most one claim. Returns the epochs in
// grant order per lock.
func (h *history) verifyLeases() map[string][]int64 {
	last := map[string]int64{}
	holderOf := map[string]map[int64]string{}
	order := map[string][]int64{}
	for _, l := range h.Leases() {
		var e int64
		_, _ = fmt.Sscan(l.Annotations[fkv1.AnnotationEpoch], &e)
		if e == 0 {
			// A new ledger's Lease, created free before its first grant:
			// it issued no epoch.
			ExpectWithOffset(1, l.Annotations[fkv1.AnnotationClaimUID]).To(BeEmpty(), "lock %s names a holder with no epoch", l.Name)
			continue
		}
		ExpectWithOffset(1, e).To(BeNumerically(">=", last[l.Name]), "lock %s epoch moved back from %d to %d", l.Name, last[l.Name], e)
		if e > last[l.Name] {
			order[l.Name] = append(order[l.Name], e)
		}
		last[l.Name] = e
		uid := l.Annotations[fkv1.AnnotationClaimUID]
		if uid == "" {
			continue
		}
		if holderOf[l.Name] == nil {
			holderOf[l.Name] = map[int64]string{}
		}
		if prev, ok := holderOf[l.Name][e]; ok {
			ExpectWithOffset(1, prev).To(Equal(uid), "lock %s epoch %d named two claims", l.Name, e)
		}
		holderOf[l.Name][e] = uid
	}
	return order
}

func epochString(e int64) string { return strconv.FormatInt(e, 10) }

// storageRevision is the current storage revision of leases, as the
// authority reads it for a new ledger.
func storageRevision() int64 {
	var list coordinationv1.LeaseList
	ExpectWithOffset(1, k8s.List(context.Background(), &list, client.Limit(1))).To(Succeed())
	rev, err := strconv.ParseInt(list.ResourceVersion, 10, 64)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return rev
}

// firstLease is the first version of lock's Lease the history saw.
func (h *history) firstLease(lock string) *coordinationv1.Lease {
	for _, l := range h.Leases() {
		if l.Name == lock {
			return &l
		}
	}
	Fail("no Lease of lock " + lock + " was seen")
	return nil
}

// startFrozenClaimsManager starts a second manager B for namespace ns whose
// claim cache stops once it has synced (about a second): its Lease cache
// stays live, so B decides on Leases newer than the claims it shows.
func startFrozenClaimsManager(ns string) {
	claims := fault.NewWatchFreezer(func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/fencedleases") })
	b, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{Namespaces: []string{ns},
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return claims.Wrap(rt) }})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	DeferCleanup(func() { claims.Thaw(); Expect(b.Stop()).To(Succeed()) })
	time.Sleep(time.Second) // B's caches sync
	claims.Freeze()
}

// reasonOf is the reason of a claim's Held condition ("" without one).
func reasonOf(c *fkv1.FencedLease) string {
	if cond := meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld); cond != nil {
		return cond.Reason
	}
	return ""
}

package election_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/election"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

func newNamespace(t *testing.T) string {
	t.Helper()
	ns, err := envtestutil.NewNamespace(context.Background(), admin, "election")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// recorder keeps every version of the objects one watch shows.
type recorder[T client.Object] struct {
	mu   sync.Mutex
	seen []T
	stop func()
}

func watchAll[T client.Object](t *testing.T, list client.ObjectList, ns string) *recorder[T] {
	t.Helper()
	w, err := admin.Watch(context.Background(), list, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder[T]{stop: w.Stop}
	go func() {
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(T); ok && ev.Type != watch.Deleted {
				r.mu.Lock()
				r.seen = append(r.seen, o)
				r.mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return r
}

func (r *recorder[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.seen...)
}

func testOneLeaderAtATime(t *testing.T) {
	ns := newNamespace(t)
	leases := watchAll[*coordinationv1.Lease](t, &coordinationv1.LeaseList{}, ns)
	claims := watchAll[*fkv1.FencedLease](t, &fkv1.FencedLeaseList{}, ns)
	j := &journal{}
	// A TTL far above the waits below: a successor that had to wait for the
	// TTL instead of being granted on release would fail the wait.
	const ttl = 60 * time.Second
	a := startCandidate(t, ns, "operator", "replica-a", ttl, j)
	b := startCandidate(t, ns, "operator", "replica-b", ttl, j)

	var first, second *candidate
	select {
	case e := <-a.leads:
		a.leads <- e
		first, second = a, b
	case e := <-b.leads:
		b.leads <- e
		first, second = b, a
	case <-time.After(30 * time.Second):
		t.Fatal("nobody leads after 30s")
	}
	e1 := first.waitLeads(t, time.Second)
	if _, err := second.lock.Epoch(); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("%s leads with epoch %d, and %s says %v", first.name, e1, second.name, err)
	}

	stopped := time.Now()
	if err := first.stop(); err != nil {
		t.Fatalf("%s: a graceful stop returned %v", first.name, err)
	}
	e2 := second.waitLeads(t, 30*time.Second)
	t.Logf("graceful handoff %s -> %s: %v from the stop of the old leader's manager", first.name, second.name, time.Since(stopped))

	c := startCandidate(t, ns, "operator", "replica-c", ttl, j)
	if c.leading() {
		t.Fatalf("replica-c leads while %s does", second.name)
	}
	if err := second.stop(); err != nil {
		t.Fatalf("%s: a graceful stop returned %v", second.name, err)
	}
	e3 := c.waitLeads(t, 30*time.Second)
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}

	// One grant per term, each newer than the last.
	if e1 >= e2 || e2 >= e3 {
		t.Fatalf("terms' epochs %d, %d, %d: want strictly increasing", e1, e2, e3)
	}
	// The leaders' work never overlapped, by this process's clock.
	terms := j.snapshot()
	if len(terms) != 3 {
		t.Fatalf("want 3 terms of leadership, got %+v", terms)
	}
	sort.Slice(terms, func(i, k int) bool { return terms[i].start.Before(terms[k].start) })
	for i := 1; i < len(terms); i++ {
		if terms[i-1].end.IsZero() || terms[i].start.Before(terms[i-1].end) {
			t.Fatalf("%s (epoch %d) started leading before %s (epoch %d) stopped: %+v",
				terms[i].who, terms[i].epoch, terms[i-1].who, terms[i-1].epoch, terms)
		}
	}
	// Each term is the authority's: the Lease named that replica's claim
	// with that epoch, and the lock's holders follow one another.
	var holders []string
	for _, l := range leases.all() {
		led := fkv1.ReadLedger(l, "operator")
		if led.HolderIdentity != "" && (len(holders) == 0 || holders[len(holders)-1] != led.HolderIdentity) {
			holders = append(holders, led.HolderIdentity)
		}
		for _, term := range terms {
			if led.Epoch == term.epoch && led.HolderIdentity != "" && led.HolderIdentity != term.who {
				t.Fatalf("epoch %d: the Lease names %s, but %s led under it", term.epoch, led.HolderIdentity, term.who)
			}
		}
	}
	if want := []string{terms[0].who, terms[1].who, terms[2].who}; strings.Join(holders, ",") != strings.Join(want, ",") {
		t.Fatalf("the Lease's holders were %v; the replicas led in the order %v", holders, want)
	}
	// Handoffs were releases, not expiries: no claim ever turned Expired.
	for _, cl := range claims.all() {
		if cl.Status.Phase == fkv1.PhaseExpired {
			t.Fatalf("claim %s of %s expired: the handoff waited for the TTL instead of a release", cl.Name, cl.Spec.HolderIdentity)
		}
	}
}

func fencedConfigMap(ns, name, lock string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{fkv1.LabelLock: lock}}, Data: data}
}

func watermark(t *testing.T, o metav1.Object) int64 {
	t.Helper()
	e, err := fkv1.ParseEpoch(o.GetAnnotations()[fkv1.AnnotationFencedEpoch])
	if err != nil {
		t.Fatalf("%s: no fenced-epoch watermark: %v", o.GetName(), err)
	}
	return e
}

func testHungLeader(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	history := watchAll[*corev1.ConfigMap](t, &corev1.ConfigMapList{}, ns)
	j := &journal{}
	a := startCandidate(t, ns, "allocator", "replica-a", 3*time.Second, j)
	ea := a.waitLeads(t, 30*time.Second)
	b := startCandidate(t, ns, "allocator", "replica-b", 3*time.Second, j)

	gateA := a.mgr.GetClient()
	cm := fencedConfigMap(ns, "ranges", "allocator", map[string]string{"owner": "replica-a"})
	if err := gateA.Create(ctx, cm); err != nil {
		t.Fatalf("the leader's gated create: %v", err)
	}
	if got := watermark(t, cm); got != ea {
		t.Fatalf("created under epoch %d, want the leader's %d", got, ea)
	}

	// A's apiserver connection stops answering: renewals hang.
	a.faults.hang.Store(true)
	eb := b.waitLeads(t, 60*time.Second)
	// The moment B leads, A must already have stopped acting.
	if _, err := a.lock.Epoch(); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("replica-b leads with epoch %d while replica-a still holds epoch %d (%v)", eb, ea, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	stale := cm.DeepCopy()
	stale.Data["owner"] = "replica-a, hung"
	err := gateA.Update(wctx, stale)
	cancel()
	if !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("replica-a's write after B's grant: want ErrNotLeading before sending, got %v", err)
	}
	// And its manager stops, as controller-runtime does on a lost election.
	select {
	case err := <-a.done:
		a.done <- err
		if err == nil || !strings.Contains(err.Error(), "leader election lost") {
			t.Fatalf("replica-a's manager returned %v, want leader election lost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("replica-a's manager still runs 30s after losing its term")
	}

	// The connection heals: the stale leader's gate still refuses, without
	// sending anything.
	a.faults.hang.Store(false)
	before := a.faults.sent("/configmaps")
	stale = cm.DeepCopy()
	stale.Data["owner"] = "replica-a, resumed"
	if err := gateA.Update(ctx, stale); !errors.Is(err, election.ErrNotLeading) || !errors.Is(err, lease.ErrLost) {
		t.Fatalf("the resumed stale leader's gated update: want ErrNotLeading and ErrLost, got %v", err)
	}
	if err := gateA.Delete(ctx, stale); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("the resumed stale leader's gated delete: want ErrNotLeading, got %v", err)
	}
	if n := a.faults.sent("/configmaps"); n != before {
		t.Fatalf("the gate sent %d configmap writes after loss", n-before)
	}
	// Past the client side (the same identity, straight to the server, with
	// the stale epoch): the object refuses it.
	raw, err := client.New(env.Admin, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	stale = cm.DeepCopy()
	stale.Data["owner"] = "replica-a, past the gate"
	lease.Stamp(stale, "allocator", ea)
	if err := raw.Update(ctx, stale); !lease.IsStaleEpoch(err) {
		t.Fatalf("a write presenting the old term's epoch %d straight to the server: want a stale-epoch denial, got %v", ea, err)
	}
	stale = cm.DeepCopy()
	delete(stale.Annotations, fkv1.AnnotationEpoch)
	stale.Data["owner"] = "replica-a, merge patch"
	if err := raw.Patch(ctx, stale, client.MergeFrom(cm)); err == nil {
		t.Fatal("a merge patch presenting no epoch was accepted")
	}

	// The new leader writes through its own gate.
	gateB := b.mgr.GetClient()
	var cur corev1.ConfigMap
	if err := admin.Get(ctx, client.ObjectKeyFromObject(cm), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Data["owner"] = "replica-b"
	if err := gateB.Update(ctx, &cur); err != nil {
		t.Fatalf("the new leader's gated update: %v", err)
	}

	// The object's history: replica-a's content only under its epoch, then
	// replica-b's under its own; no stale write ever landed.
	time.Sleep(500 * time.Millisecond) // let the watch deliver the last version
	var owners []string
	for _, v := range history.all() {
		if v.Name != "ranges" {
			continue
		}
		owner, w := v.Data["owner"], watermark(t, v)
		if (owner == "replica-a" && w != ea) || (owner == "replica-b" && w != eb) || (owner != "replica-a" && owner != "replica-b") {
			t.Fatalf("version %s: owner %q under watermark %d (A's epoch %d, B's %d)", v.ResourceVersion, owner, w, ea, eb)
		}
		if len(owners) == 0 || owners[len(owners)-1] != owner {
			owners = append(owners, owner)
		}
	}
	if strings.Join(owners, ",") != "replica-a,replica-b" {
		t.Fatalf("the object's owners over time: %v", owners)
	}
}

func testGateWritePaths(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	l := startCandidate(t, ns, "writer", "replica", 15*time.Second, &journal{})
	e := l.waitLeads(t, 30*time.Second)
	g := l.mgr.GetClient()

	cm := fencedConfigMap(ns, "table", "writer", map[string]string{"a": "1"})
	if err := g.Create(ctx, cm); err != nil {
		t.Fatalf("create: %v", err)
	}
	cm.Data["a"] = "2"
	if err := g.Update(ctx, cm); err != nil {
		t.Fatalf("update of a copy read back (no epoch of its own): %v", err)
	}
	base := cm.DeepCopy()
	cm.Data["b"] = "3"
	if err := g.Patch(ctx, cm, client.MergeFrom(base)); err != nil {
		t.Fatalf("client.MergeFrom patch: %v", err)
	}
	ac := corev1ac.ConfigMap("table", ns).WithLabels(map[string]string{fkv1.LabelLock: "writer"}).WithData(map[string]string{"a": "2", "b": "3", "c": "4"})
	if err := g.Apply(ctx, ac, client.FieldOwner("replica"), client.ForceOwnership); err != nil {
		t.Fatalf("server-side apply: %v", err)
	}
	var got corev1.ConfigMap
	if err := admin.Get(ctx, client.ObjectKeyFromObject(cm), &got); err != nil {
		t.Fatal(err)
	}
	if got.Data["c"] != "4" || watermark(t, &got) != e {
		t.Fatalf("after the gated writes: data %v watermark %s, want c=4 under epoch %d", got.Data, got.Annotations[fkv1.AnnotationFencedEpoch], e)
	}
	if _, set := got.Annotations[fkv1.AnnotationEpoch]; set {
		t.Fatal("the per-request epoch token was stored")
	}

	// An object the lock does not fence is written as given.
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}, Data: map[string]string{"x": "1"}}
	if err := g.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	plain.Data["x"] = "2"
	if err := g.Update(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(plain), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Annotations) != 0 || len(got.Labels) != 0 {
		t.Fatalf("the gate touched an unfenced object: labels %v annotations %v", got.Labels, got.Annotations)
	}

	// A delete by name: the gate learns the object is fenced, marks it with
	// the epoch, then deletes it. Without the gate the object refuses.
	raw, err := client.New(env.Admin, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	byName := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "table"}}
	if err := raw.Delete(ctx, byName); err == nil {
		t.Fatal("an unmarked delete of a fenced object was accepted")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := g.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "table"}})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gated delete by name: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the manager's cache may not show the object yet
	}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(cm), &got); !apierrors.IsNotFound(err) {
		t.Fatalf("after the gated delete: %v", err)
	}
}

func testTransportGate(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	l := startCandidate(t, ns, "clientgo", "replica", 15*time.Second, &journal{})
	e := l.waitLeads(t, 30*time.Second)
	cs, err := kubernetes.NewForConfig(l.lock.WrapConfig(env.Admin))
	if err != nil {
		t.Fatal(err)
	}
	cms := cs.CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(ctx, fencedConfigMap(ns, "table", "clientgo", map[string]string{"a": "1"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("clientset create: %v", err)
	}
	if watermark(t, cm) != e {
		t.Fatalf("created under %s, want epoch %d", cm.Annotations[fkv1.AnnotationFencedEpoch], e)
	}
	cm.Data["a"] = "2"
	if _, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("clientset update: %v", err)
	}
	withLabel := []byte(`{"metadata":{"labels":{"fencekeeper.io/lock":"clientgo"}},"data":{"b":"3"}}`)
	if _, err = cms.Patch(ctx, "table", types.MergePatchType, withLabel, metav1.PatchOptions{}); err != nil {
		t.Fatalf("clientset merge patch naming the label: %v", err)
	}
	// The documented limit: a patch that does not show the label is not
	// stamped, and the object refuses it.
	if _, err = cms.Patch(ctx, "table", types.MergePatchType, []byte(`{"data":{"b":"4"}}`), metav1.PatchOptions{}); err == nil {
		t.Fatal("a merge patch without the label (so without an epoch) was accepted")
	}
	plain, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Data: map[string]string{"x": "1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Annotations) != 0 {
		t.Fatalf("the transport gate touched an unfenced object: %v", plain.Annotations)
	}

	if err := l.stop(); err != nil {
		t.Fatal(err)
	}
	if cm, err = cms.Get(ctx, "table", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	cm.Data["a"] = "after release"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("clientset update after the term was released: want ErrNotLeading, got %v", err)
	}
	if _, err := cms.Update(ctx, plain, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("an unfenced write after release: %v", err)
	}
}

// claimsOf lists the claims of holder in ns.
func claimsOf(t *testing.T, ns, holder string) []fkv1.FencedLease {
	t.Helper()
	var list fkv1.FencedLeaseList
	if err := admin.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []fkv1.FencedLease
	for _, c := range list.Items {
		if c.Spec.HolderIdentity == holder && c.DeletionTimestamp == nil {
			out = append(out, c)
		}
	}
	return out
}

func waitClaim(t *testing.T, ns, holder string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(claimsOf(t, ns, holder)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s queued no claim within 30s", holder)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func testWaitingReplicaLeavesQueue(t *testing.T) {
	ns := newNamespace(t)
	j := &journal{}
	a := startCandidate(t, ns, "op", "replica-a", 60*time.Second, j)
	a.waitLeads(t, 30*time.Second)
	b := startCandidate(t, ns, "op", "replica-b", 60*time.Second, j)
	waitClaim(t, ns, "replica-b")
	if err := b.stop(); err != nil {
		t.Fatalf("replica-b's manager: %v", err)
	}
	// Its claim is gone when its manager's Start returns (the process may
	// exit right then): a dead replica must not be granted the lock.
	if left := claimsOf(t, ns, "replica-b"); len(left) != 0 {
		t.Fatalf("replica-b stopped, but its claim %s is still queued", left[0].Name)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
}

func testReleaseBeforeGrant(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	a := startCandidate(t, ns, "op", "replica-a", 60*time.Second, &journal{})
	a.waitLeads(t, 30*time.Second)
	c, err := election.New(env.Admin, election.Config{Namespace: ns, Name: "op", Identity: "replica-c", TTL: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Get(ctx); err != nil { // starts queueing, as client-go's first poll does
		t.Fatal(err)
	}
	waitClaim(t, ns, "replica-c")
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if left := claimsOf(t, ns, "replica-c"); len(left) != 0 {
		t.Fatalf("Release returned, but replica-c's claim %s is still queued", left[0].Name)
	}
	// The lock frees up: replica-c, released, must not be granted it.
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	d := startCandidate(t, ns, "op", "replica-d", 60*time.Second, &journal{})
	d.waitLeads(t, 30*time.Second)
	if rec, _, _ := c.Get(ctx); c.Term() != nil || rec.HolderIdentity == "replica-c" {
		t.Fatalf("replica-c leads after its Release (term %v)", c.Term())
	}
}

func testStatusByName(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	l := startCandidate(t, ns, "reporter", "replica", 15*time.Second, &journal{})
	l.waitLeads(t, 30*time.Second)
	g := l.mgr.GetClient()
	report := fencedReport(ns, "reporter")
	if err := unstructured.SetNestedField(report.Object, "v1 by the leader", "spec", "body"); err != nil {
		t.Fatal(err)
	}
	if err := g.Create(ctx, report); err != nil {
		t.Fatalf("the leader's gated create: %v", err)
	}
	status := func(phase string) error {
		// A copy by name, without labels: the gate must look the object up.
		byName := &unstructured.Unstructured{}
		byName.SetGroupVersionKind(report.GroupVersionKind())
		byName.SetNamespace(ns)
		byName.SetName(report.GetName())
		if err := admin.Get(ctx, client.ObjectKeyFromObject(byName), byName); err != nil {
			return err
		}
		byName.SetLabels(nil)
		if err := unstructured.SetNestedField(byName.Object, phase, "status", "phase"); err != nil {
			return err
		}
		return g.Status().Update(ctx, byName)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := status("Published")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader's status update: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the cache may not show the report yet (or a conflict)
	}
	if err := l.stop(); err != nil {
		t.Fatal(err)
	}
	if err := status("Stale"); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a status update by name after the term ended: want ErrNotLeading, got %v", err)
	}
}

// A gated status write (no check at the object) that cannot get out (the
// client holds it: rate limiter, a slow connection) ends at the term's safe
// time, with the caller's context unbounded: it is never sent late.
func testWriteDeadline(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	l := startCandidate(t, ns, "reporter", "replica", 3*time.Second, &journal{})
	l.waitLeads(t, 30*time.Second)
	g := l.mgr.GetClient()
	report := fencedReport(ns, "reporter")
	if err := g.Create(ctx, report); err != nil {
		t.Fatal(err)
	}
	l.faults.hangPath.Store("/reports/")
	if err := unstructured.SetNestedField(report.Object, "Late", "status", "phase"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.Status().Update(ctx, report) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the held-up status write: want the gate's deadline, got %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a gated write held up in the client is still waiting a minute later (no safe-time deadline)")
	}
	// Renewals were not held up: the term is still live, so it was the
	// write's own deadline that ended it.
	if _, err := l.lock.Epoch(); err != nil {
		t.Fatalf("the term: %v", err)
	}
}

// fencedReport is a test Report (test/crds) fenced by lock, with a status.
func fencedReport(ns, lock string) *unstructured.Unstructured {
	report := envtestutil.Report(ns, "report-2026-07")
	report.SetLabels(map[string]string{fkv1.LabelLock: lock})
	return report
}

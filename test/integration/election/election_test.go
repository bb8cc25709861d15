package election_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
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

func newNamespace() string {
	GinkgoHelper()
	ns, err := envtestutil.NewNamespace(context.Background(), admin, "election")
	Expect(err).NotTo(HaveOccurred())
	return ns
}

// recorder keeps every version of the objects one watch shows.
type recorder[T client.Object] struct {
	mu   sync.Mutex
	seen []T
	stop func()
}

// watchAll records what a watch of list in ns shows, until the spec ends.
func watchAll[T client.Object](list client.ObjectList, ns string) *recorder[T] {
	GinkgoHelper()
	w, err := admin.Watch(context.Background(), list, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
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
	DeferCleanup(w.Stop)
	return r
}

func (r *recorder[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.seen...)
}

func fencedConfigMap(ns, name, lock string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{fkv1.LabelLock: lock}}, Data: data}
}

func watermark(o metav1.Object) int64 {
	GinkgoHelper()
	e, err := fkv1.ParseEpoch(o.GetAnnotations()[fkv1.AnnotationFencedEpoch])
	Expect(err).NotTo(HaveOccurred(), "%s: no fenced-epoch watermark", o.GetName())
	return e
}

// claimsOf lists the claims of holder in ns.
func claimsOf(ns, holder string) []fkv1.FencedLease {
	GinkgoHelper()
	var list fkv1.FencedLeaseList
	Expect(admin.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
	var out []fkv1.FencedLease
	for _, c := range list.Items {
		if c.Spec.HolderIdentity == holder && c.DeletionTimestamp == nil {
			out = append(out, c)
		}
	}
	return out
}

func waitClaim(ns, holder string) {
	GinkgoHelper()
	deadline := time.Now().Add(30 * time.Second)
	for len(claimsOf(ns, holder)) == 0 {
		if time.Now().After(deadline) {
			Fail(fmt.Sprintf("%s queued no claim within 30s", holder))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fencedReport is a test Report (test/crds) fenced by lock, with a status.
func fencedReport(ns, lock string) *unstructured.Unstructured {
	report := envtestutil.Report(ns, "report-2026-07")
	report.SetLabels(map[string]string{fkv1.LabelLock: lock})
	return report
}

var _ = Describe("Fenced leader election", func() {
	It("one leader at a time by the authority's history, graceful handoff", func() {
		ns := newNamespace()
		leases := watchAll[*coordinationv1.Lease](&coordinationv1.LeaseList{}, ns)
		claims := watchAll[*fkv1.FencedLease](&fkv1.FencedLeaseList{}, ns)
		j := &journal{}
		// A TTL far above the waits below: a successor that had to wait for the
		// TTL instead of being granted on release would fail the wait.
		const ttl = 60 * time.Second
		a := startCandidate(ns, "operator", "replica-a", ttl, j)
		b := startCandidate(ns, "operator", "replica-b", ttl, j)

		var first, second *candidate
		select {
		case e := <-a.leads:
			a.leads <- e
			first, second = a, b
		case e := <-b.leads:
			b.leads <- e
			first, second = b, a
		case <-time.After(30 * time.Second):
			Fail("nobody leads after 30s")
		}
		e1 := first.waitLeads(time.Second)
		_, err := second.lock.Epoch()
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "%s leads with epoch %d, and %s says %v", first.name, e1, second.name, err)

		stopped := time.Now()
		Expect(first.stop()).To(Succeed(), "%s: a graceful stop", first.name)
		e2 := second.waitLeads(30 * time.Second)
		GinkgoWriter.Printf("graceful handoff %s -> %s: %v from the stop of the old leader's manager\n", first.name, second.name, time.Since(stopped))

		c := startCandidate(ns, "operator", "replica-c", ttl, j)
		Expect(c.leading()).To(BeFalse(), "replica-c leads while %s does", second.name)
		Expect(second.stop()).To(Succeed(), "%s: a graceful stop", second.name)
		e3 := c.waitLeads(30 * time.Second)
		Expect(c.stop()).To(Succeed())

		By("one grant per term, each newer than the last")
		if e1 >= e2 || e2 >= e3 {
			Fail(fmt.Sprintf("terms' epochs %d, %d, %d: want strictly increasing", e1, e2, e3))
		}
		By("the leaders' work never overlapped, by this process's clock")
		terms := j.snapshot()
		Expect(terms).To(HaveLen(3), "want 3 terms of leadership")
		sort.Slice(terms, func(i, k int) bool { return terms[i].start.Before(terms[k].start) })
		for i := 1; i < len(terms); i++ {
			if terms[i-1].end.IsZero() || terms[i].start.Before(terms[i-1].end) {
				Fail(fmt.Sprintf("%s (epoch %d) started leading before %s (epoch %d) stopped: %+v",
					terms[i].who, terms[i].epoch, terms[i-1].who, terms[i-1].epoch, terms))
			}
		}
		By("each term is the authority's: the Lease named that replica's claim with that epoch, " +
			"and the lock's holders follow one another")
		var holders []string
		for _, l := range leases.all() {
			led := fkv1.ReadLedger(l, "operator")
			if led.HolderIdentity != "" && (len(holders) == 0 || holders[len(holders)-1] != led.HolderIdentity) {
				holders = append(holders, led.HolderIdentity)
			}
			for _, term := range terms {
				if led.Epoch == term.epoch && led.HolderIdentity != "" && led.HolderIdentity != term.who {
					Fail(fmt.Sprintf("epoch %d: the Lease names %s, but %s led under it", term.epoch, led.HolderIdentity, term.who))
				}
			}
		}
		want := []string{terms[0].who, terms[1].who, terms[2].who}
		Expect(strings.Join(holders, ",")).To(Equal(strings.Join(want, ",")), "the Lease's holders were %v; the replicas led in the order %v", holders, want)
		By("handoffs were releases, not expiries: no claim ever turned Expired")
		for _, cl := range claims.all() {
			Expect(cl.Status.Phase).NotTo(Equal(fkv1.PhaseExpired),
				"claim %s of %s expired: the handoff waited for the TTL instead of a release", cl.Name, cl.Spec.HolderIdentity)
		}
	})

	It("a leader whose apiserver hangs stops acting before the next is granted", func() {
		ctx := context.Background()
		ns := newNamespace()
		history := watchAll[*corev1.ConfigMap](&corev1.ConfigMapList{}, ns)
		j := &journal{}
		a := startCandidate(ns, "allocator", "replica-a", 3*time.Second, j)
		ea := a.waitLeads(30 * time.Second)
		b := startCandidate(ns, "allocator", "replica-b", 3*time.Second, j)

		gateA := a.mgr.GetClient()
		cm := fencedConfigMap(ns, "ranges", "allocator", map[string]string{"owner": "replica-a"})
		Expect(gateA.Create(ctx, cm)).To(Succeed(), "the leader's gated create")
		got := watermark(cm)
		Expect(got).To(Equal(ea), "created under epoch %d, want the leader's %d", got, ea)

		By("A's apiserver connection stops answering: renewals hang")
		a.faults.hang.Store(true)
		eb := b.waitLeads(60 * time.Second)
		// The moment B leads, A must already have stopped acting.
		_, err := a.lock.Epoch()
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "replica-b leads with epoch %d while replica-a still holds epoch %d (%v)", eb, ea, err)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		stale := cm.DeepCopy()
		stale.Data["owner"] = "replica-a, hung"
		err = gateA.Update(wctx, stale)
		cancel()
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "replica-a's write after B's grant: want ErrNotLeading before sending, got %v", err)
		// And its manager stops, as controller-runtime does on a lost election.
		select {
		case err := <-a.done:
			a.done <- err
			if err == nil || !strings.Contains(err.Error(), "leader election lost") {
				Fail(fmt.Sprintf("replica-a's manager returned %v, want leader election lost", err))
			}
		case <-time.After(30 * time.Second):
			Fail("replica-a's manager still runs 30s after losing its term")
		}

		By("the connection heals: the stale leader's gate still refuses, without sending anything")
		a.faults.hang.Store(false)
		before := a.faults.sent("/configmaps")
		stale = cm.DeepCopy()
		stale.Data["owner"] = "replica-a, resumed"
		if err := gateA.Update(ctx, stale); !errors.Is(err, election.ErrNotLeading) || !errors.Is(err, lease.ErrLost) {
			Fail(fmt.Sprintf("the resumed stale leader's gated update: want ErrNotLeading and ErrLost, got %v", err))
		}
		err = gateA.Delete(ctx, stale)
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "the resumed stale leader's gated delete: want ErrNotLeading, got %v", err)
		n := a.faults.sent("/configmaps")
		Expect(n).To(Equal(before), "the gate sent %d configmap writes after loss", n-before)
		By("past the client side (the same identity, straight to the server, with the stale epoch): the object refuses it")
		raw, err := client.New(env.Admin, client.Options{Scheme: lease.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		stale = cm.DeepCopy()
		stale.Data["owner"] = "replica-a, past the gate"
		lease.Stamp(stale, "allocator", ea)
		err = raw.Update(ctx, stale)
		Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "a write presenting the old term's epoch %d straight to the server: want a stale-epoch denial, got %v", ea, err)
		stale = cm.DeepCopy()
		delete(stale.Annotations, fkv1.AnnotationEpoch)
		stale.Data["owner"] = "replica-a, merge patch"
		Expect(raw.Patch(ctx, stale, client.MergeFrom(cm))).NotTo(Succeed(), "a merge patch presenting no epoch was accepted")

		By("the new leader writes through its own gate")
		gateB := b.mgr.GetClient()
		var cur corev1.ConfigMap
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(cm), &cur)).To(Succeed())
		cur.Data["owner"] = "replica-b"
		Expect(gateB.Update(ctx, &cur)).To(Succeed(), "the new leader's gated update")

		By("the object's history: replica-a's content only under its epoch, then replica-b's under its own; no stale write ever landed")
		time.Sleep(500 * time.Millisecond) // let the watch deliver the last version
		var owners []string
		for _, v := range history.all() {
			if v.Name != "ranges" {
				continue
			}
			owner, w := v.Data["owner"], watermark(v)
			if (owner == "replica-a" && w != ea) || (owner == "replica-b" && w != eb) || (owner != "replica-a" && owner != "replica-b") {
				Fail(fmt.Sprintf("version %s: owner %q under watermark %d (A's epoch %d, B's %d)", v.ResourceVersion, owner, w, ea, eb))
			}
			if len(owners) == 0 || owners[len(owners)-1] != owner {
				owners = append(owners, owner)
			}
		}
		Expect(strings.Join(owners, ",")).To(Equal("replica-a,replica-b"), "the object's owners over time: %v", owners)
	})

	It("the gate stamps every write path and leaves unfenced objects alone", func() {
		ctx := context.Background()
		ns := newNamespace()
		l := startCandidate(ns, "writer", "replica", 15*time.Second, &journal{})
		e := l.waitLeads(30 * time.Second)
		g := l.mgr.GetClient()

		cm := fencedConfigMap(ns, "table", "writer", map[string]string{"a": "1"})
		Expect(g.Create(ctx, cm)).To(Succeed(), "create")
		cm.Data["a"] = "2"
		Expect(g.Update(ctx, cm)).To(Succeed(), "update of a copy read back (no epoch of its own)")
		base := cm.DeepCopy()
		cm.Data["b"] = "3"
		Expect(g.Patch(ctx, cm, client.MergeFrom(base))).To(Succeed(), "client.MergeFrom patch")
		ac := corev1ac.ConfigMap("table", ns).WithLabels(map[string]string{fkv1.LabelLock: "writer"}).WithData(map[string]string{"a": "2", "b": "3", "c": "4"})
		Expect(g.Apply(ctx, ac, client.FieldOwner("replica"), client.ForceOwnership)).To(Succeed(), "server-side apply")
		var got corev1.ConfigMap
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(cm), &got)).To(Succeed())
		if got.Data["c"] != "4" || watermark(&got) != e {
			Fail(fmt.Sprintf("after the gated writes: data %v watermark %s, want c=4 under epoch %d", got.Data, got.Annotations[fkv1.AnnotationFencedEpoch], e))
		}
		Expect(got.Annotations).NotTo(HaveKey(fkv1.AnnotationEpoch), "the per-request epoch token was stored")

		By("an object the lock does not fence is written as given")
		plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}, Data: map[string]string{"x": "1"}}
		Expect(g.Create(ctx, plain)).To(Succeed())
		plain.Data["x"] = "2"
		Expect(g.Update(ctx, plain)).To(Succeed())
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(plain), &got)).To(Succeed())
		if len(got.Annotations) != 0 || len(got.Labels) != 0 {
			Fail(fmt.Sprintf("the gate touched an unfenced object: labels %v annotations %v", got.Labels, got.Annotations))
		}

		By("a delete by name: the gate learns the object is fenced, marks it with the epoch, " +
			"then deletes it; without the gate the object refuses")
		raw, err := client.New(env.Admin, client.Options{Scheme: lease.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		byName := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "table"}}
		Expect(raw.Delete(ctx, byName)).NotTo(Succeed(), "an unmarked delete of a fenced object was accepted")
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := g.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "table"}})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				Fail(fmt.Sprintf("gated delete by name: %v", err))
			}
			time.Sleep(100 * time.Millisecond) // the manager's cache may not show the object yet
		}
		err = admin.Get(ctx, client.ObjectKeyFromObject(cm), &got)
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "after the gated delete: %v", err)
	})

	It("the transport gate for client-go clients", func() {
		ctx := context.Background()
		ns := newNamespace()
		l := startCandidate(ns, "clientgo", "replica", 15*time.Second, &journal{})
		e := l.waitLeads(30 * time.Second)
		cs, err := kubernetes.NewForConfig(l.lock.WrapConfig(env.Admin))
		Expect(err).NotTo(HaveOccurred())
		cms := cs.CoreV1().ConfigMaps(ns)
		cm, err := cms.Create(ctx, fencedConfigMap(ns, "table", "clientgo", map[string]string{"a": "1"}), metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred(), "clientset create")
		Expect(watermark(cm)).To(Equal(e), "created under %s, want epoch %d", cm.Annotations[fkv1.AnnotationFencedEpoch], e)
		cm.Data["a"] = "2"
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred(), "clientset update")
		withLabel := []byte(`{"metadata":{"labels":{"fencekeeper.io/lock":"clientgo"}},"data":{"b":"3"}}`)
		_, err = cms.Patch(ctx, "table", types.MergePatchType, withLabel, metav1.PatchOptions{})
		Expect(err).NotTo(HaveOccurred(), "clientset merge patch naming the label")
		// The documented limit: a patch that does not show the label is not
		// stamped, and the object refuses it.
		_, err = cms.Patch(ctx, "table", types.MergePatchType, []byte(`{"data":{"b":"4"}}`), metav1.PatchOptions{})
		Expect(err).To(HaveOccurred(), "a merge patch without the label (so without an epoch) was accepted")
		plain, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Data: map[string]string{"x": "1"}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(plain.Annotations).To(BeEmpty(), "the transport gate touched an unfenced object")

		Expect(l.stop()).To(Succeed())
		cm, err = cms.Get(ctx, "table", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		cm.Data["a"] = "after release"
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "clientset update after the term was released: want ErrNotLeading, got %v", err)
		_, err = cms.Update(ctx, plain, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred(), "an unfenced write after release")
	})

	It("a waiting replica leaves the queue when its manager stops", func() {
		ns := newNamespace()
		j := &journal{}
		a := startCandidate(ns, "op", "replica-a", 60*time.Second, j)
		a.waitLeads(30 * time.Second)
		b := startCandidate(ns, "op", "replica-b", 60*time.Second, j)
		waitClaim(ns, "replica-b")
		Expect(b.stop()).To(Succeed(), "replica-b's manager")
		// Its claim is gone when its manager's Start returns (the process may
		// exit right then): a dead replica must not be granted the lock.
		if left := claimsOf(ns, "replica-b"); len(left) != 0 {
			Fail(fmt.Sprintf("replica-b stopped, but its claim %s is still queued", left[0].Name))
		}
		Expect(a.stop()).To(Succeed())
	})

	It("Release before the grant ends the election", func() {
		ctx := context.Background()
		ns := newNamespace()
		a := startCandidate(ns, "op", "replica-a", 60*time.Second, &journal{})
		a.waitLeads(30 * time.Second)
		c, err := election.New(env.Admin, election.Config{Namespace: ns, Name: "op", Identity: "replica-c", TTL: 60 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		_, _, err = c.Get(ctx) // starts queueing, as client-go's first poll does
		Expect(err).NotTo(HaveOccurred())
		waitClaim(ns, "replica-c")
		Expect(c.Release(ctx)).To(Succeed())
		if left := claimsOf(ns, "replica-c"); len(left) != 0 {
			Fail(fmt.Sprintf("Release returned, but replica-c's claim %s is still queued", left[0].Name))
		}
		By("the lock frees up: replica-c, released, must not be granted it")
		Expect(a.stop()).To(Succeed())
		d := startCandidate(ns, "op", "replica-d", 60*time.Second, &journal{})
		d.waitLeads(30 * time.Second)
		if rec, _, _ := c.Get(ctx); c.Term() != nil || rec.HolderIdentity == "replica-c" {
			Fail(fmt.Sprintf("replica-c leads after its Release (term %v)", c.Term()))
		}
	})

	It("status writes of a fenced object by name are refused after the term", func() {
		ctx := context.Background()
		ns := newNamespace()
		l := startCandidate(ns, "reporter", "replica", 15*time.Second, &journal{})
		l.waitLeads(30 * time.Second)
		g := l.mgr.GetClient()
		report := fencedReport(ns, "reporter")
		Expect(unstructured.SetNestedField(report.Object, "v1 by the leader", "spec", "body")).To(Succeed())
		Expect(g.Create(ctx, report)).To(Succeed(), "the leader's gated create")
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
				Fail(fmt.Sprintf("the leader's status update: %v", err))
			}
			time.Sleep(100 * time.Millisecond) // the cache may not show the report yet (or a conflict)
		}
		Expect(l.stop()).To(Succeed())
		err := status("Stale")
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a status update by name after the term ended: want ErrNotLeading, got %v", err)
	})

	// A gated status write (no check at the object) that cannot get out (the
	// client holds it: rate limiter, a slow connection) ends at the term's safe
	// time, with the caller's context unbounded: it is never sent late.
	It("a gated write held up in the client is not sent after the safe time", func() {
		ctx := context.Background()
		ns := newNamespace()
		l := startCandidate(ns, "reporter", "replica", 3*time.Second, &journal{})
		l.waitLeads(30 * time.Second)
		g := l.mgr.GetClient()
		report := fencedReport(ns, "reporter")
		Expect(g.Create(ctx, report)).To(Succeed())
		l.faults.hangPath.Store("/reports/")
		Expect(unstructured.SetNestedField(report.Object, "Late", "status", "phase")).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- g.Status().Update(ctx, report) }()
		select {
		case err := <-done:
			Expect(errors.Is(err, context.DeadlineExceeded)).To(BeTrue(), "the held-up status write: want the gate's deadline, got %v", err)
		case <-time.After(60 * time.Second):
			Fail("a gated write held up in the client is still waiting a minute later (no safe-time deadline)")
		}
		// Renewals were not held up: the term is still live, so it was the
		// write's own deadline that ended it.
		_, err := l.lock.Epoch()
		Expect(err).NotTo(HaveOccurred(), "the term")
	})
})

package webhook_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// watchFreezer stalls every watch stream of the client it wraps while
// frozen (its informers see nothing new), while other requests, and calls
// to its webhook, still work: a replica whose watches stalled or whose
// route to the apiserver half failed.
type watchFreezer struct {
	mu   sync.Mutex
	open chan struct{} // closed while not frozen
}

// wrap is a WrapTransport: every transport the manager makes is frozen
// together.
func (f *watchFreezer) wrap(rt http.RoundTripper) http.RoundTripper { return freezing{next: rt, f: f} }

type freezing struct {
	next http.RoundTripper
	f    *watchFreezer
}

func newWatchFreezer() *watchFreezer {
	f := &watchFreezer{open: make(chan struct{})}
	close(f.open)
	return f
}

func (f *watchFreezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = make(chan struct{})
}

func (f *watchFreezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.open:
	default:
		close(f.open)
	}
}

func (f *watchFreezer) gate() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open
}

func (t freezing) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || req.URL.Query().Get("watch") != "true" {
		return resp, err
	}
	resp.Body = &frozenBody{ReadCloser: resp.Body, f: t.f, ctx: req.Context()}
	return resp, nil
}

type frozenBody struct {
	io.ReadCloser
	f   *watchFreezer
	ctx context.Context
}

func (b *frozenBody) Read(p []byte) (int, error) {
	select {
	case <-b.f.gate():
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
	return b.ReadCloser.Read(p)
}

// Several authorities without leader election: the replica serving the
// webhook stops seeing the apiserver's watch events, another replica breaks
// the lock (kubectl fence break) and grants the next holder. The broken
// holder's writes must be refused at once, not only once the stalled
// replica's view of it lapses a TTL later: a replica that is not the only
// authority reads the Lease live.
var _ = Describe("A webhook-serving replica whose watches stalled", func() {
	It("refuses the broken holder's write after another replica broke the lock", func() {
		ns := newNamespace()
		lock := "report-2026-07"

		By("manager A serves the webhook and is an authority; manager B is another authority; no leader election")
		freezer := newWatchFreezer()
		a, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{Webhook: &testEnv.WebhookInstallOptions,
			WrapTransport: freezer.wrap})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { freezer.thaw(); Expect(a.Stop()).To(Succeed()) })
		b, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(b.Stop()).To(Succeed()) })

		w1 := acquire(ns, "w1", lock, "W1", 300)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 by W1", nil))).To(Succeed())
		By("W1 renews, and both authorities see it: each now vouches for W1 for a TTL")
		var l coordinationv1.Lease
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: lock}, &l)).To(Succeed())
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		Expect(k8s.Update(ctx, &l)).To(Succeed())
		Eventually(func() bool {
			var seen coordinationv1.Lease
			return a.Mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(&l), &seen) == nil && seen.ResourceVersion == l.ResourceVersion
		}, 10*time.Second, 20*time.Millisecond).Should(BeTrue())
		time.Sleep(300 * time.Millisecond) // A's reconcile of that renewal

		By("A's watches stall; W2 queues; an operator breaks W1's hold; B grants W2")
		freezer.freeze()
		time.Sleep(300 * time.Millisecond) // an event already being read gets through
		w2 := newClaimObj(ns, "w2", lock, "W2", 300)
		Expect(k8s.Create(ctx, w2)).To(Succeed())
		Expect(k8s.Patch(ctx, &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: w1.Name}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+fkv1.AnnotationBreakReason+`":"W1 hung"}}}`)))).To(Succeed())
		granted := waitPhase(w2, fkv1.PhaseHeld)
		Expect(granted.Status.Epoch).To(BeNumerically(">", w1.Status.Epoch))
		var cached coordinationv1.Lease
		Expect(a.Mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(&l), &cached)).To(Succeed())
		Expect(fkv1.ReadLedger(&cached, lock).HeldEpoch()).To(Equal(w1.Status.Epoch), "A's cache must still show W1: the watches did not stall")

		By("the broken W1 writes with its epoch; A's webhook must refuse it")
		err = publish(ns, lock, w1.Status.Epoch, "v11' by the broken W1")
		Expect(err).To(HaveOccurred(), "the broken holder's write was admitted on a stalled cache")
		Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "refused as stale: %v", err)
		Expect(configMapData(ns, lock)).To(Equal("v11 by W1"))
	})
})

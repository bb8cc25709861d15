package lock

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

type leadership bool

func (l leadership) Current() bool { return bool(l) }

// A leader whose term is not certain (resumed from a pause past its
// lease) writes no Lease: its successor may already act on it. The
// reconciler here has no client, so a write would panic.
func TestNoLeaseWriteOutsideTheTerm(t *testing.T) {
	g := NewWithT(t)
	r := NewReconciler(nil, nil, nil, Options{Leadership: leadership(false)})
	lock := types.NamespacedName{Namespace: "ns", Name: "x"}
	for _, kind := range []actionKind{actGrant, actFree, actRepair} {
		r.memory.publishView(lock, View{HeldEpoch: 41, deadline: time.Now().Add(time.Hour)})
		w := claim("w2", 2, fkv1.PhasePending, 0)
		res, err := actOn(r, lock, gathered{}, action{kind: kind, holder: w, epoch: 42})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.RequeueAfter).To(BeNumerically(">", 0))
		_, vouched := r.memory.view(lock)
		g.Expect(vouched).To(BeFalse(), "a view outlived the term")
	}
}

// liveLease is an API reader holding one Lease.
type liveLease struct{ l *coordinationv1.Lease }

func (o liveLease) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	o.l.DeepCopyInto(obj.(*coordinationv1.Lease))
	return nil
}

func (o liveLease) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// A Lease the cache no longer shows because it lost fencekeeper's label is
// not waited for (that would read it live every retry, forever): the
// expectation goes, and the foreign-Lease path takes over.
func TestExpectedLeaseThatLostItsLabel(t *testing.T) {
	g := NewWithT(t)
	lock := types.NamespacedName{Namespace: "ns", Name: "x"}
	unmanaged := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", UID: "lease-1", ResourceVersion: "30"}}
	r := NewReconciler(nil, liveLease{unmanaged}, nil, Options{})
	var mem lockMemory
	mem.wroteLease(leaseVersion{uid: "lease-1", rv: "20"})
	behind, err := r.cacheBehindOwnWrites(context.Background(), lock, &mem, nil, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(behind).To(BeFalse())
	g.Expect(mem.leaseExpect).To(BeZero())

	managed := unmanaged.DeepCopy()
	managed.Labels = map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue}
	r = NewReconciler(nil, liveLease{managed}, nil, Options{})
	mem = lockMemory{}
	mem.wroteLease(leaseVersion{uid: "lease-1", rv: "20"})
	behind, err = r.cacheBehindOwnWrites(context.Background(), lock, &mem, nil, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(behind).To(BeTrue(), "a cache that has not shown our Lease yet passed for one that caught up")
	g.Expect(mem.leaseExpect.rv).To(Equal("30"), "the live version is what the cache must reach")
}

// updates is a client whose only call is Update, which it records.
type updates struct {
	client.Client
	n int
}

func (u *updates) Update(context.Context, client.Object, ...client.UpdateOption) error {
	u.n++
	return nil
}

// Releasing the finalizer of a Lease that goes (its namespace terminating,
// its claims gone) withdraws the view first: the webhook must not vouch
// from the cached copy of a Lease that no longer exists.
func TestReleasingTheFinalizerWithdrawsTheView(t *testing.T) {
	g := NewWithT(t)
	c := &updates{}
	r := NewReconciler(c, nil, nil, Options{})
	lock := types.NamespacedName{Namespace: "ns", Name: "x"}
	r.memory.publishView(lock, View{HeldEpoch: 41, deadline: time.Now().Add(time.Hour)})
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", Finalizers: []string{fkv1.LeaseFinalizer}}}
	_, err := actOn(r, lock, gathered{lease: l}, action{kind: actReleaseFinalizer})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.n).To(Equal(1), "the finalizer was not released")
	_, vouched := r.memory.view(lock)
	g.Expect(vouched).To(BeFalse())
}

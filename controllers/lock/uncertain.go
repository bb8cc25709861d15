package lock

import (
	"context"
	"fmt"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// uncertainWrites remembers the locks whose last Lease write failed without
// a refusal (a timeout, a lost reply): it may have committed. Until a live
// read settles it, the cache may show the Lease as it was before that write
// (the old holder, with its old epoch) while the apiserver already stores
// the new grant, and a reconcile deciding on that cache could vouch for the
// old holder to the webhook again (a pod holder that turned ready again
// looks alive). The value is the resourceVersion the write replaced ("" for
// a create).
type uncertainWrites struct {
	mu sync.Mutex
	m  map[types.NamespacedName]string
}

func newUncertainWrites() *uncertainWrites {
	return &uncertainWrites{m: map[types.NamespacedName]string{}}
}

func (u *uncertainWrites) mark(lock types.NamespacedName, replaced string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.m[lock] = replaced
}

func (u *uncertainWrites) get(lock types.NamespacedName) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	rv, ok := u.m[lock]
	return rv, ok
}

func (u *uncertainWrites) forget(lock types.NamespacedName) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.m, lock)
}

// settleUncertainWrite reads the Lease live after a write whose outcome is
// unknown. When it changed since the version that write replaced, the
// cache must show at least the live version before anything is decided (or
// vouched for) again, and the doubt is over. When it did not, the write may
// still commit (a request that timed out here can still be processed
// there): the doubt stays, and with it no view is vouched for, until this
// process's next Lease write succeeds or the Lease is seen to change.
func (r *Reconciler) settleUncertainWrite(ctx context.Context, lock types.NamespacedName) error {
	replaced, ok := r.uncertain.get(lock)
	if !ok {
		return nil
	}
	var live coordinationv1.Lease
	err := r.apiReader.Get(ctx, lock, &live)
	switch {
	case apierrors.IsNotFound(err):
		if replaced != "" {
			r.uncertain.forget(lock) // the Lease is gone: nothing to wait for
		}
	case err != nil:
		return fmt.Errorf("reading Lease %s after a write whose outcome is unknown: %w", lock, err)
	case live.ResourceVersion != replaced:
		r.expect.wroteLease(lock, live.UID, live.ResourceVersion)
		r.uncertain.forget(lock)
	}
	return nil
}

// doubtful reports whether lock's last Lease write is still of unknown
// outcome.
func (r *Reconciler) doubtful(lock types.NamespacedName) bool {
	_, ok := r.uncertain.get(lock)
	return ok
}

// CatchUp is called when this process starts acting as the authority (a
// new leader's term): its cache has been running, but may trail the
// writes of the leader before it. It reads the managed Leases live and
// expects the cache to show at least those versions before any lock is
// decided on, or vouched for, again.
func (r *Reconciler) CatchUp(ctx context.Context) error {
	var live coordinationv1.LeaseList
	if err := r.apiReader.List(ctx, &live, client.MatchingLabels{fkv1.LabelManagedBy: fkv1.ManagedByValue}); err != nil {
		return fmt.Errorf("reading the managed Leases at the start of this authority's term: %w", err)
	}
	for i := range live.Items {
		l := &live.Items[i]
		r.expect.wroteLease(types.NamespacedName{Namespace: l.Namespace, Name: l.Name}, l.UID, l.ResourceVersion)
	}
	// Only reconciles that start from here on, and so see these
	// expectations, may vouch.
	r.caughtUp.Store(true)
	return nil
}

// CaughtUp reports whether this term's CatchUp has run: from then on the
// authority may vouch for holders it decides on.
func (r *Reconciler) CaughtUp() bool { return r.caughtUp.Load() }

// EndTerm is called when this process stops acting as the authority (it
// stopped leading, or is stopping): nothing it decided is vouched for from
// then on, while the next leader grants.
func (r *Reconciler) EndTerm() { r.caughtUp.Store(false) }

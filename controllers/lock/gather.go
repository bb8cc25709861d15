package lock

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers/internal/pods"
)

// gathered is what one reconcile read: the snapshot decide works on, and the
// objects act writes.
type gathered struct {
	snapshot
	// lease is the lock's managed Lease as read (nil: none).
	lease *coordinationv1.Lease
	// cacheBehind is true when the cache has not yet seen a write this
	// process made to the Lease or a claim: deciding now would only lose a
	// resourceVersion race, so the reconcile waits for the cache.
	cacheBehind bool
	// renewWatched is true when this process watched the holder's current
	// renewal signal appear (not merely found it on its first look): only
	// then can it vouch to the webhook that the holder is alive.
	renewWatched bool
	// caughtUp: this authority's term had read the Leases live when the
	// reconcile started (CatchUp); only then may it vouch for a holder.
	caughtUp bool
	// uncertain: this process's last Lease write is still of unknown
	// outcome; nothing is vouched for until it is settled.
	uncertain bool
	// term is the term whose floor this reconcile read: its Lease writes
	// are sent only while that term lasts.
	term uint64
	// permitLeases are the lock's permit renewal Leases in the cache, by
	// epoch (semaphore.go); permitsWatched is true when this process
	// watched every live permit's current renewal signal appear.
	permitLeases   map[int64]*coordinationv1.Lease
	permitsWatched bool
}

// gather reads the lock's claims and Lease from the informer cache, reading
// live only on the rare paths: a lock known to be blocked by a foreign Lease
// (outside the cache), a Lease write of unknown outcome, a Lease the cache
// has not shown yet, and a holder claim or pod missing from the cache. What
// it learns for later reconciles it writes into mem, this reconcile's copy
// of the lock's memory; it changes nothing else.
func (r *Reconciler) gather(ctx context.Context, lock types.NamespacedName, mem *lockMemory) (gathered, error) {
	var g gathered
	claims, err := r.listClaims(ctx, lock)
	if err != nil {
		return g, err
	}
	known := mem.queue
	g.claims, mem.queue = mem.queue.order(claims)
	g.now = r.clock.Now()
	g.firstSeen = maps.Clone(mem.observeWaiters(g.claims, g.now))
	if g.lease, g.foreign, err = r.leaseOf(ctx, lock, mem); err != nil || g.foreign != "" {
		return g, err
	}
	if err := r.settleUncertainWrite(ctx, lock, mem); err != nil {
		return g, err
	}
	g.ledger = fkv1.ReadLedger(g.lease, lock.Name)
	g.hasLease = g.lease != nil
	g.leaseDeleting = g.lease != nil && g.lease.DeletionTimestamp != nil
	g.foreignOwners = g.lease != nil && len(g.lease.OwnerReferences) > 0
	if g.cacheBehind, err = r.cacheBehindOwnWrites(ctx, lock, mem, g.lease, g.claims); err != nil {
		return g, err
	}
	if g.claims, err = r.confirmHolder(ctx, lock, g.ledger, g.claims, known); err != nil {
		return g, err
	}
	holder := findClaim(g.claims, g.ledger.HolderUID)
	var notReadySince string
	if g.holderPod, notReadySince, err = r.holderPod(ctx, lock.Namespace, holder, true); err != nil {
		return g, err
	}
	if g.lease != nil {
		g.renewSeenAt, g.renewWatched = mem.observe(renewalOf(g.lease, g.ledger.HolderUID, g.holderPod, notReadySince), r.clock.Now())
	}
	if err := r.gatherPermits(ctx, lock, mem, &g, known); err != nil {
		return g, err
	}
	epochs := []int64{g.ledger.Epoch}
	for _, c := range g.claims {
		epochs = append(epochs, c.Status.Epoch)
	}
	for _, p := range g.ledger.Permits {
		epochs = append(epochs, p.Epoch)
	}
	g.floor = mem.raiseFloor(epochs...)
	need := 1
	if semaphoreLock(g.snapshot) {
		need = fkv1.MaxMaxHolders
	}
	if g.waiterPods, err = r.waiterPods(ctx, lock.Namespace, g.claims, g.ledger, need); err != nil {
		return g, err
	}
	var behind bool
	if g.timedOutGone, behind, err = r.timedOutGone(ctx, lock.Namespace, g.ledger, g.claims); err != nil {
		return g, err
	}
	g.cacheBehind = g.cacheBehind || behind
	g.uncertain = mem.uncertain
	return g, nil
}

// timedOutGone reads live the claims the Lease lists as timed out that the
// cache does not show (the rare path: a claim deleted after its timeout, or
// one this cache has not seen yet), and returns those that ended or are
// gone, which a Lease write may stop listing. One that exists and still
// waits means the cache is behind: nothing is decided until it catches up.
func (r *Reconciler) timedOutGone(ctx context.Context, ns string, led fkv1.Ledger, claims []*fkv1.FencedLease) (map[types.UID]bool, bool, error) {
	var gone map[types.UID]bool
	for _, ref := range led.TimedOut {
		if findClaim(claims, ref.UID) != nil {
			continue
		}
		ended, err := r.claimEnded(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, ref.UID)
		if err != nil {
			return nil, false, err
		}
		if !ended {
			return nil, true, nil
		}
		if gone == nil {
			gone = map[types.UID]bool{}
		}
		gone[ref.UID] = true
	}
	return gone, false, nil
}

// claimEnded reads claim key live: true when it is gone (or re-created with
// another UID than uid) or Expired, so it can never be granted.
func (r *Reconciler) claimEnded(ctx context.Context, key types.NamespacedName, uid types.UID) (bool, error) {
	var c fkv1.FencedLease
	switch err := r.apiReader.Get(ctx, key, &c); {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading claim %s: %w", key, err)
	}
	return c.UID != uid || c.DeletionTimestamp != nil || c.Status.Phase == fkv1.PhaseExpired, nil
}

// renewalOf is the renewal signal of lease's holder: the holder, and its
// pod's liveness and pods.NotReadySince for a pod holder, its Lease's
// renewTime otherwise.
func renewalOf(lease *coordinationv1.Lease, holderUID types.UID, pod pods.Liveness, notReadySince string) renewal {
	signal := renewal{holderUID: holderUID, pod: pod, podNotReadySince: notReadySince}
	if pod == pods.NotAPod && lease.Spec.RenewTime != nil {
		signal.renewTime = lease.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	return signal
}

// waiterPods reads, from the pod cache, the liveness of the pods waiting pod
// claims were made for, in queue order, up to the need-th waiter that could
// be granted (so a long queue costs a read only for its head: one for a
// mutex, up to a semaphore's capacity). A claim that records no identity is
// never granted (nextReadyWaiter): it is passed over.
func (r *Reconciler) waiterPods(ctx context.Context, ns string, claims []*fkv1.FencedLease, led fkv1.Ledger, need int) (map[types.UID]pods.Liveness, error) {
	var out map[types.UID]pods.Liveness
	for _, c := range waitingInOrder(claims, led) {
		if fkv1.RecordsNoIdentity(c) {
			continue
		}
		live, _, err := r.holderPod(ctx, ns, c, false)
		if err != nil {
			return nil, err
		}
		if live == pods.NotAPod || live == pods.Live {
			if need--; need <= 0 {
				break
			}
			continue
		}
		if out == nil {
			out = map[types.UID]pods.Liveness{}
		}
		out[c.UID] = live
	}
	return out, nil
}

// cacheBehindOwnWrites reports whether the cache has not yet seen a write
// this process made to the Lease or a claim, or the Lease version a new
// term read live. When the cache shows no Lease, or another one, than the
// one expected, a live read tells a cache that has not seen the Lease yet
// (behind) from a Lease that is gone (the expectation is dropped).
func (r *Reconciler) cacheBehindOwnWrites(ctx context.Context, lock types.NamespacedName, mem *lockMemory, lease *coordinationv1.Lease, claims []*fkv1.FencedLease) (bool, error) {
	live := make(map[types.UID]bool, len(claims))
	var cached leaseVersion
	if lease != nil {
		cached = leaseVersion{uid: lease.UID, rv: lease.ResourceVersion}
	}
	behind, missing := mem.leaseBehind(cached)
	if missing {
		var err error
		if behind, err = r.expectedLeaseExists(ctx, lock, mem); err != nil {
			return false, err
		}
	}
	for _, c := range claims {
		live[c.UID] = true
		behind = mem.claimBehind(c.UID, c.ResourceVersion) || behind
	}
	mem.retainClaims(live)
	return behind, nil
}

// expectedLeaseExists reads the lock's Lease live (the rare path: the cache
// does not show the Lease version expected): if that Lease, or a newer
// managed one, exists, the cache is behind it; if it is gone, so is the
// expectation.
func (r *Reconciler) expectedLeaseExists(ctx context.Context, lock types.NamespacedName, mem *lockMemory) (bool, error) {
	if mem.leaseExpect.uid == "" {
		return false, nil
	}
	var current coordinationv1.Lease
	err := r.apiReader.Get(ctx, lock, &current)
	switch {
	case apierrors.IsNotFound(err):
		mem.leaseExpect = leaseVersion{}
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading Lease %s, which the cache has not shown yet: %w", lock, err)
	case fkv1.IsManagedLease(&current):
		mem.wroteLease(leaseVersion{uid: current.UID, rv: current.ResourceVersion})
		return true, nil
	default:
		mem.leaseExpect = leaseVersion{} // not ours: leaseOf's foreign path handles it
		return false, nil
	}
}

// settleUncertainWrite reads the Lease live after a write whose outcome is
// unknown. When it changed since the version that write replaced, the
// cache must show at least the live version before anything is decided (or
// vouched for) again, and the doubt is over. When it did not, the write may
// still commit (a request that timed out here can still be processed
// there): the doubt stays, and with it no view is vouched for, until this
// process's next Lease write succeeds or the Lease is seen to change.
func (r *Reconciler) settleUncertainWrite(ctx context.Context, lock types.NamespacedName, mem *lockMemory) error {
	if !mem.uncertain {
		return nil
	}
	var live coordinationv1.Lease
	err := r.apiReader.Get(ctx, lock, &live)
	switch {
	case apierrors.IsNotFound(err):
		if mem.uncertainReplaced != "" {
			mem.settle() // the Lease is gone: nothing to wait for
		}
	case err != nil:
		return fmt.Errorf("reading Lease %s after a write whose outcome is unknown: %w", lock, err)
	case live.ResourceVersion != mem.uncertainReplaced:
		mem.wroteLease(leaseVersion{uid: live.UID, rv: live.ResourceVersion})
		mem.settle()
	}
	return nil
}

func (r *Reconciler) listClaims(ctx context.Context, lock types.NamespacedName) ([]*fkv1.FencedLease, error) {
	var list fkv1.FencedLeaseList
	// Shallow copies of the cache's objects, sharing their maps, slices and
	// pointers: deep-copying every claim of a long queue in every reconcile
	// was a third of the lock controller's CPU in a handoff with 1,000
	// waiters. Nothing here writes into what they share; syncStatuses gives
	// a claim its own copy before a reply is decoded into it.
	if err := r.client.List(ctx, &list, client.InNamespace(lock.Namespace),
		client.MatchingFields{IndexLockName: lock.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing claims of lock %s: %w", lock, err)
	}
	claims := make([]*fkv1.FencedLease, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			claims = append(claims, &list.Items[i])
		}
	}
	return claims, nil
}

// leaseOf returns the lock's managed Lease from the cache (which holds
// managed Leases only), or nil. A same-named Lease fencekeeper does not
// manage is found when creating ours fails (see act); from then on the lock
// is known as blocked and read live until that Lease is gone, so a new lock
// costs no extra read.
func (r *Reconciler) leaseOf(ctx context.Context, lock types.NamespacedName, mem *lockMemory) (*coordinationv1.Lease, string, error) {
	var lease coordinationv1.Lease
	err := r.client.Get(ctx, lock, &lease)
	switch {
	case err == nil:
		if of, ok := fkv1.IsPermitLease(&lease); ok {
			// Never taken for this lock's ledger: it renews a permit.
			return nil, fmt.Sprintf("Lease %s is the renewal Lease of a permit of lock %s; use another lock name", lock, of), nil
		}
		return &lease, "", nil
	case !apierrors.IsNotFound(err):
		return nil, "", err
	}
	if !mem.foreign {
		return nil, "", nil
	}
	foreign, err := r.readForeignLease(ctx, lock, mem)
	return nil, foreign, err
}

// readForeignLease reads the lock's Lease live and explains why it blocks
// the lock when it exists without fencekeeper's label ("" otherwise). It
// keeps the set of locks known to be blocked.
func (r *Reconciler) readForeignLease(ctx context.Context, lock types.NamespacedName, mem *lockMemory) (string, error) {
	var lease coordinationv1.Lease
	if err := r.apiReader.Get(ctx, lock, &lease); err != nil {
		if apierrors.IsNotFound(err) {
			mem.foreign = false
			return "", nil
		}
		return "", err
	}
	if fkv1.IsManagedLease(&lease) {
		mem.foreign = false
		// Ours, and the cache has not shown it yet (a create refused as
		// AlreadyExists): decide nothing until it does.
		mem.wroteLease(leaseVersion{uid: lease.UID, rv: lease.ResourceVersion})
		return "", nil
	}
	mem.foreign = true
	return fmt.Sprintf("Lease %s exists and is not managed by fencekeeper (no label %s=%s); "+
		"fencekeeper will not overwrite it: delete it or use another lock name",
		lock, fkv1.LabelManagedBy, fkv1.ManagedByValue), nil
}

// confirmHolder makes sure a holder missing from the claim cache is really
// gone (a live read) before it is treated as released: the cache may simply
// not have seen a claim another controller just granted. A holder the
// cache showed at this lock's last reconcile (known, the queue it left)
// needs no read: an informer drops an object only when the apiserver says
// it was deleted (a watch event or a relist without it), and a UID never
// comes back, so its absence now is its deletion. That is a holder's
// release by delete, the common path, which thus costs no request.
func (r *Reconciler) confirmHolder(ctx context.Context, lock types.NamespacedName, led fkv1.Ledger, claims []*fkv1.FencedLease, known fifo) ([]*fkv1.FencedLease, error) {
	if !led.Held() {
		return claims, nil
	}
	return r.confirmClaim(ctx, lock, led.HolderClaim, led.HolderUID, claims, known)
}

// confirmClaim is confirmHolder for one claim the Lease names (the holder,
// or a permit's): claims, plus that claim when the cache misses it and a
// live read shows it exists.
func (r *Reconciler) confirmClaim(ctx context.Context, lock types.NamespacedName, name string, uid types.UID, claims []*fkv1.FencedLease, known fifo) ([]*fkv1.FencedLease, error) {
	if findClaim(claims, uid) != nil || name == "" || slices.Contains(known, uid) {
		return claims, nil
	}
	var c fkv1.FencedLease
	err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: name}, &c)
	switch {
	case apierrors.IsNotFound(err):
		return claims, nil
	case err != nil:
		return nil, fmt.Errorf("confirming claim %s/%s: %w", lock.Namespace, name, err)
	case c.UID == uid && c.DeletionTimestamp == nil && c.Spec.LockName == lock.Name:
		return append(claims, &c), nil
	}
	return claims, nil
}

// holderPod reads the liveness of the pod a claim (the holder, or a waiter)
// was made for, from the (stripped) pod and node caches, and when its
// containers last stopped being ready (pods.NotReadySince).
//
// Only a claim the pod bridge made for its pod is a pod's (pods.BridgeRef,
// from what admission recorded about its creator): any other claim is
// pods.NotAPod whatever pod its ownerReference names, so a hand-made claim
// never borrows a ready pod's liveness to outlive its TTL unrenewed, nor
// waits for a pod to be ready.
//
// With confirm (the holder's pod), a cache that shows no pod of that name,
// or another pod, is checked against the apiserver before the hold ends at
// once: the claim's pod may be newer than the cache (another replica made
// its claim, after a re-creation this cache has not seen yet). A pod the
// cache shows deleting or finished is gone for good; that needs no read.
func (r *Reconciler) holderPod(ctx context.Context, ns string, holder *fkv1.FencedLease, confirm bool) (pods.Liveness, string, error) {
	ref := bridgeRef(holder)
	if ref == nil {
		return podLiveness(holder, nil, nil)
	}
	var pod corev1.Pod
	key := types.NamespacedName{Namespace: ns, Name: ref.Name}
	err := r.client.Get(ctx, key, &pod)
	if confirm && (apierrors.IsNotFound(err) || err == nil && pod.UID != ref.UID) {
		pod = corev1.Pod{}
		err = r.apiReader.Get(ctx, key, &pod)
	}
	if apierrors.IsNotFound(err) {
		return podLiveness(holder, nil, nil)
	}
	if err != nil {
		return pods.NotLive, "", err
	}
	if pods.LivenessOf(&pod, string(ref.UID)) == pods.Gone || pod.Spec.NodeName == "" {
		return podLiveness(holder, &pod, nil)
	}
	var node corev1.Node
	switch err := r.client.Get(ctx, types.NamespacedName{Name: pod.Spec.NodeName}, &node); {
	case apierrors.IsNotFound(err):
		return podLiveness(holder, &pod, nil)
	case err != nil:
		return pods.NotLive, "", err
	}
	return podLiveness(holder, &pod, &node)
}

// bridgeRef is pods.BridgeRef of a claim that may be nil.
func bridgeRef(c *fkv1.FencedLease) *metav1.OwnerReference {
	if c == nil {
		return nil
	}
	return pods.BridgeRef(c)
}

// podLiveness is holderPod's decision, a pure function of what it read: the
// liveness of the pod the bridge made claim c for, as pod (nil: no such
// pod) and its node (nil: not known) show it, and pods.NotReadySince. A
// claim the bridge did not make is pods.NotAPod whatever pod is passed: it
// renews the Lease itself or expires.
func podLiveness(c *fkv1.FencedLease, pod *corev1.Pod, node *corev1.Node) (pods.Liveness, string, error) {
	ref := bridgeRef(c)
	switch {
	case ref == nil:
		return pods.NotAPod, "", nil
	case pod == nil:
		return pods.Gone, "", nil
	}
	live := pods.LivenessOf(pod, string(ref.UID))
	if live == pods.Gone {
		return live, pods.NotReadySince(pod, nil), nil
	}
	return live.OnNode(node), pods.NotReadySince(pod, node), nil
}

// setLease makes lease, which this reconcile created, the lock's Lease.
func (g *gathered) setLease(lease *coordinationv1.Lease, lock types.NamespacedName) {
	g.lease, g.hasLease, g.leaseDeleting, g.foreignOwners = lease, true, false, false
	g.ledger = fkv1.ReadLedger(lease, lock.Name)
}

// revisionOf is lease's resourceVersion as a storage revision (0: no Lease,
// or not a number).
func revisionOf(lease *coordinationv1.Lease) int64 {
	if lease == nil {
		return 0
	}
	rv, err := strconv.ParseInt(lease.ResourceVersion, 10, 64)
	if err != nil || rv < 1 {
		return 0
	}
	return rv
}

package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Permits of a semaphore lock (docs/design.md §9). A claim asking for
// maxHolders N > 1 is granted a permit: the authority adds an entry to the
// lock's Lease (fencekeeper.io/permit-EPOCH: the claim, its UID, its
// holder, identity and TTL), giving it the lock's next epoch, and creates
// the permit's own renewal Lease, v1alpha1.PermitLeaseName(lock, epoch),
// right after. The grant is the pair (claim UID, epoch) as that entry
// shows it; the holder renews the permit's Lease, never the lock's (one
// Lease per permit, so the holders of one semaphore do not contend on one
// object), and is LOST when the lock's Lease no longer shows the entry,
// shows its claim with another epoch, or its permit's Lease is gone once it
// existed.

// permitLeaseRetry bounds the backoff between reads of a permit's renewal
// Lease that does not exist yet.
const (
	minPermitLeaseRetry = 10 * time.Millisecond
	maxPermitLeaseRetry = 200 * time.Millisecond
)

// errPermitLeaseNotYet: the permit's renewal Lease does not exist (yet),
// while the lock's Lease still shows the permit; the authority creates it
// right after the grant.
var errPermitLeaseNotYet = errors.New("the permit's renewal Lease does not exist yet")

// renewPermit renews this permit: it advances renewTime on the permit's
// own Lease, resourceVersion-guarded, only while the lock's Lease shows
// the permit (our claim's UID with our epoch) and the permit's Lease is
// the one of this permit. The permit's Lease may appear a moment after the
// lock's Lease showed the grant: until it has been seen once, its absence
// is retried (every 10 ms, backing off to 200 ms) for up to RenewInterval
// while the lock's Lease, read again each time, still shows the permit;
// once seen, its absence is the permit's end (ErrLost).
func (l *Lease) renewPermit(ctx context.Context) error {
	deadline := time.Now().Add(l.opts.RenewInterval)
	backoff := minPermitLeaseRetry
	for {
		err := l.renewPermitOnce(ctx)
		if !errors.Is(err, errPermitLeaseNotYet) {
			return err
		}
		wait := min(backoff, time.Until(deadline))
		if wait <= 0 {
			return fmt.Errorf("renewing permit %d of lock %s/%s: the Lease %s was not created within %v of the first try: %w",
				l.Epoch, l.Namespace, l.Lock, fkv1.PermitLeaseName(l.Lock, l.Epoch), l.opts.RenewInterval, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("renewing permit %d of lock %s/%s: %w", l.Epoch, l.Namespace, l.Lock, errors.Join(ctx.Err(), err))
		case <-time.After(wait):
		}
		backoff = min(2*backoff, maxPermitLeaseRetry)
	}
}

// renewPermitOnce checks the permit on the lock's Lease and renews its
// Lease once (re-reading it once after a conflict).
func (l *Lease) renewPermitOnce(ctx context.Context) error {
	if err := l.checkLedger(ctx, false); err != nil {
		return err
	}
	name := fkv1.PermitLeaseName(l.Lock, l.Epoch)
	l.mu.Lock()
	cur := l.lease
	l.mu.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		if cur == nil {
			var fresh coordinationv1.Lease
			err := l.cl.withTimeout(ctx, l.opts.RequestTimeout, func(ctx context.Context) error {
				return l.cl.c.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: name}, &fresh)
			})
			if apierrors.IsNotFound(err) {
				return l.permitLeaseMissing(ctx, name)
			}
			if err != nil {
				return err
			}
			cur = &fresh
		}
		if err := l.showsPermitLease(cur); err != nil {
			return err
		}
		l.mu.Lock()
		l.permitLeaseSeen = true
		l.mu.Unlock()
		err := l.advanceRenewTime(ctx, cur)
		if err == nil {
			return nil
		}
		if apierrors.IsNotFound(err) {
			return l.permitLeaseMissing(ctx, name)
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		cur = nil // someone moved first: read and decide again
	}
	return fmt.Errorf("renewing permit %d of lock %s/%s: the Lease %s kept changing", l.Epoch, l.Namespace, l.Lock, name)
}

// permitLeaseMissing decides what the permit's renewal Lease not being
// found means: the permit's end once that Lease was seen (the authority
// deletes it when the permit ends); before, a Lease not created yet, as
// long as the lock's Lease, read again now, still shows the permit.
func (l *Lease) permitLeaseMissing(ctx context.Context, name string) error {
	l.mu.Lock()
	seen := l.permitLeaseSeen
	l.mu.Unlock()
	if seen {
		return fmt.Errorf("the Lease %s of permit %d of lock %s/%s is gone: %w", name, l.Epoch, l.Namespace, l.Lock, ErrLost)
	}
	if err := l.checkLedger(ctx, true); err != nil {
		return err
	}
	return errPermitLeaseNotYet
}

// checkLedger checks that the lock's Lease shows this permit: the last
// version seen (by the grant, the Lease watch, or a read), or, with fresh,
// while the Lease is not watched, or before any version was seen, one read
// now.
func (l *Lease) checkLedger(ctx context.Context, fresh bool) error {
	l.mu.Lock()
	cur := l.ledger
	if l.ledgerUnwatched {
		cur = nil
	}
	l.mu.Unlock()
	if cur == nil || fresh {
		got, err := l.readLockLease(ctx)
		if err != nil {
			return err
		}
		cur = got
		l.mu.Lock()
		if l.ledger == nil || l.ledger.ResourceVersion != got.ResourceVersion {
			l.ledger = cur
		}
		l.mu.Unlock()
	}
	return l.showsPermit(cur)
}

// showsPermit returns an error wrapping ErrLost unless the lock's Lease
// shows this holder's permit: an entry with our epoch naming our claim's
// UID, and no entry naming our claim with another epoch (a grant is the
// pair). Entries that cannot be read are no grant (admission accepts none
// of them either).
func (l *Lease) showsPermit(cur *coordinationv1.Lease) error {
	if !fkv1.IsManagedLease(cur) {
		return fmt.Errorf("the Lease of lock %s/%s is not managed by fencekeeper: %w", l.Namespace, l.Lock, ErrLost)
	}
	led := fkv1.ReadLedger(cur, l.Lock)
	if led.PermitsInvalid {
		return fmt.Errorf("the Lease of lock %s/%s has permit entries that cannot be read: %w", l.Namespace, l.Lock, ErrLost)
	}
	for _, p := range led.Permits {
		if p.UID == l.UID && p.Epoch != l.Epoch {
			return fmt.Errorf("the Lease of lock %s/%s shows our claim with permit epoch %d, not the epoch %d we were granted: %w",
				l.Namespace, l.Lock, p.Epoch, l.Epoch, ErrLost)
		}
	}
	p, ok := led.PermitOf(l.Epoch)
	switch {
	case !ok:
		return fmt.Errorf("the Lease of lock %s/%s no longer shows permit %d (released, expired or broken): %w", l.Namespace, l.Lock, l.Epoch, ErrLost)
	case p.UID != l.UID:
		return fmt.Errorf("the Lease of lock %s/%s shows permit %d held by claim %q, not ours (%s): %w", l.Namespace, l.Lock, l.Epoch, p.UID, l.UID, ErrLost)
	}
	return nil
}

// showsPermitLease returns an error wrapping ErrLost unless cur is this
// permit's renewal Lease as the authority made it: fencekeeper-managed,
// labelled with our lock and our epoch, naming our holder.
func (l *Lease) showsPermitLease(cur *coordinationv1.Lease) error {
	name := fkv1.PermitLeaseName(l.Lock, l.Epoch)
	lock, ok := fkv1.IsPermitLease(cur)
	switch {
	case !ok || lock != l.Lock:
		return fmt.Errorf("the Lease %s/%s is not the renewal Lease of a permit of lock %s: %w", l.Namespace, name, l.Lock, ErrLost)
	case cur.Labels[fkv1.LabelPermitEpoch] != fkv1.FormatEpoch(l.Epoch):
		return fmt.Errorf("the Lease %s/%s is labelled for permit %q, not %d: %w", l.Namespace, name, cur.Labels[fkv1.LabelPermitEpoch], l.Epoch, ErrLost)
	case cur.Spec.HolderIdentity == nil || *cur.Spec.HolderIdentity != l.Holder:
		holder := "nobody"
		if cur.Spec.HolderIdentity != nil {
			holder = fmt.Sprintf("%q", *cur.Spec.HolderIdentity)
		}
		return fmt.Errorf("the Lease %s/%s of permit %d names %s, not our holder %q: %w", l.Namespace, name, l.Epoch, holder, l.Holder, ErrLost)
	}
	return nil
}

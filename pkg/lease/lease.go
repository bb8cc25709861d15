package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/elapsed"
)

// Lease is one acquired lease: its identity (the claim UID), its epoch and
// TTL, and a background renewal that keeps it or reports its loss.
type Lease struct {
	Lock, Holder, Namespace string
	// ClaimName and UID identify the FencedLease; UID is the lease identity.
	ClaimName string
	UID       types.UID
	// Epoch is the fencing token to stamp on every write.
	Epoch int64
	// TTL is the lease duration the authority enforces.
	TTL time.Duration
	// MaxHolders is the capacity of the lock the claim asked for (its
	// spec.maxHolders): 1, a mutex, or more, a semaphore, of which this
	// lease holds one permit (Epoch is the permit's; RenewalLease names
	// the Lease it renews).
	MaxHolders int32

	cl   *Client
	opts Options

	ctx     context.Context
	cancel  context.CancelFunc
	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup

	// grantedAt is when this process saw the grant (the first renewal's
	// acknowledgement): a FutureEpoch refusal is retried for a while after.
	grantedAt time.Time

	mu          sync.Mutex
	state       State
	lastAckSent time.Time             // send time of the last acknowledged renewal
	lease       *coordinationv1.Lease // last Lease we read or wrote (the one we renew)
	// A permit's: ledger is the last version of the lock's Lease seen (its
	// permit entries are the grant); ledgerUnwatched, set when the lock's
	// Lease cannot be watched, makes every renewal read it instead;
	// permitLeaseSeen: the permit's renewal Lease has existed, so its
	// absence now is the permit's end, not a Lease not created yet.
	ledger          *coordinationv1.Lease
	ledgerUnwatched bool
	permitLeaseSeen bool
	// watches are the wait's follows the loss watches go on with; set
	// before they start, read once by each.
	watches heldWatches
	// since is elapsed.Since (tests play a suspend with another).
	since func(time.Time) time.Duration
}

func newLease(c *Client, lock, holder string, opts Options) *Lease {
	ctx, cancel := context.WithCancel(context.Background())
	return &Lease{Lock: lock, Holder: holder, Namespace: c.namespace, cl: c, opts: opts,
		ctx: ctx, cancel: cancel, stop: make(chan struct{}), state: Idle, since: elapsed.Since}
}

// isPermit reports whether this lease is a permit of a semaphore lock.
func (l *Lease) isPermit() bool { return l.MaxHolders > 1 }

// RenewalLease is the name of the coordination.k8s.io Lease this lease
// renews: the lock's own for a mutex, the permit's
// (v1alpha1.PermitLeaseName: LOCK-permit-EPOCH) for a semaphore's permit.
func (l *Lease) RenewalLease() string {
	if l.isPermit() {
		return fkv1.PermitLeaseName(l.Lock, l.Epoch)
	}
	return l.Lock
}

// Context is cancelled when the lease is lost or released: derive the work's
// context from it.
func (l *Lease) Context() context.Context { return l.ctx }

// Done is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// State is the current state. A lease whose safe time has run out reads
// LOST at once, even before its timers make the transition (they run late
// after the machine was suspended, by up to elapsed.Poll). State only
// reads: a transition here would run OnTransition inside the caller's
// locks.
func (l *Lease) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.state == Held || l.state == Suspect) && l.remainingLocked() <= 0 {
		return Lost
	}
	return l.state
}

// Remaining is the safe time left by this client's own clock: TTL after the
// send time of the last acknowledged renewal.
func (l *Lease) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.remainingLocked()
}

func (l *Lease) remainingLocked() time.Duration {
	if l.lastAckSent.IsZero() {
		return 0
	}
	// By the longer of the monotonic and the wall clock: the monotonic one
	// stands still while the machine is suspended.
	return l.TTL - l.since(l.lastAckSent)
}

// transition moves to a new state (final states stay final) and reports it.
func (l *Lease) transition(to State, reason string) {
	l.mu.Lock()
	from := l.state
	if from == to || from == Lost || from == Released || (from == Releasing && to != Released && to != Lost) {
		l.mu.Unlock()
		return
	}
	l.state = to
	l.mu.Unlock()
	transitions.WithLabelValues(string(to)).Inc()
	l.cl.log.Info("lease state", "lock", l.Lock, "claim", l.ClaimName, "epoch", l.Epoch, "from", from, "to", to, "reason", reason)
	if to == Lost || to == Released {
		if cancelsHeldWork(from, to) && l.ctx.Err() == nil {
			workCancelled.Inc()
		}
		l.cancel()
	}
	if l.opts.OnTransition != nil {
		l.opts.OnTransition(Transition{Lock: l.Lock, From: from, To: to, Reason: reason})
	}
}

// start renews once (anchoring the safe time, and checking a grant seen on
// the claim against the Lease), then renews and watches the claim and the
// Lease in the background. source is where the grant was seen first.
func (l *Lease) start(ctx context.Context, source string) error {
	if err := l.renew(ctx); err != nil {
		l.transition(Lost, "first renewal failed: "+err.Error())
		return fmt.Errorf("lock %s/%s: epoch %d was granted but could not be renewed: %w", l.Namespace, l.Lock, l.Epoch, errors.Join(ErrLost, err))
	}
	l.grantedAt = time.Now()
	l.transition(Held, fmt.Sprintf("granted epoch %d (seen first on the %s)", l.Epoch, source))
	l.wg.Add(4)
	go l.renewLoop()
	go l.watchClaim()
	go l.watchLease()
	go l.lossTimer()
	return nil
}

// lossTimer declares LOST the moment the safe time runs out (a TTL after the
// send time of the last acknowledged renewal), on this process's clock,
// whatever call is in flight: a renewal that hangs must not delay it.
func (l *Lease) lossTimer() {
	defer l.wg.Done()
	for {
		rem := l.Remaining()
		if rem <= 0 {
			l.transition(Lost, fmt.Sprintf("no renewal acknowledged for a TTL (%v)", l.TTL))
			return
		}
		t := time.NewTimer(min(rem, elapsed.Poll)) // late after a suspend: look again
		select {
		case <-l.stop:
			t.Stop()
			return
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// renewLoop renews every RenewInterval and re-evaluates the state whenever
// the safe time crosses the margin or runs out.
func (l *Lease) renewLoop() {
	defer l.wg.Done()
	nextRenew := time.Now().Add(l.opts.RenewInterval)
	for {
		wait := time.Until(nextRenew)
		rem := l.Remaining()
		if d := rem - l.opts.SuspectMargin; d > 0 && d < wait {
			wait = d
		}
		if rem > 0 && rem < wait {
			wait = rem
		}
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-time.After(max(wait, time.Millisecond)):
		}
		if !time.Now().Before(nextRenew) {
			// A renewal is worth nothing once the safe time is gone: it is
			// cut off there, so the loop goes on to evaluate in time.
			rctx, cancel := context.WithTimeout(l.ctx, max(l.Remaining(), time.Millisecond))
			err := l.renew(rctx)
			cancel()
			switch {
			case errors.Is(err, ErrLost):
				l.transition(Lost, err.Error())
				return
			case err != nil:
				renewals.WithLabelValues("error").Inc()
				l.cl.log.V(1).Info("renewal failed", "lock", l.Lock, "error", err.Error())
				nextRenew = time.Now().Add(l.opts.RenewInterval / 4) // retry sooner
			default:
				nextRenew = time.Now().Add(l.opts.RenewInterval)
			}
		}
		l.evaluate()
	}
}

// evaluate derives HELD/SUSPECT/LOST from the safe time left.
func (l *Lease) evaluate() {
	rem := l.Remaining()
	switch {
	case rem <= 0:
		l.transition(Lost, fmt.Sprintf("no renewal acknowledged for a TTL (%v)", l.TTL))
	case rem < l.opts.SuspectMargin:
		l.transition(Suspect, fmt.Sprintf("%v of safe time left, below the %v margin", rem.Round(time.Millisecond), l.opts.SuspectMargin))
	default:
		l.transition(Held, "renewed")
	}
}

// renew advances renewTime on the backing Lease, guarded by resourceVersion
// and only while the Lease names this claim with the epoch it was granted.
// It returns an error wrapping ErrLost when the Lease names someone else, or
// this claim with another epoch (or an unreadable one): a grant is the pair
// (claim UID, epoch), and once the Lease no longer shows that pair, the
// epoch this holder stamps is not the lock's current one, so renewing would
// only keep a lock whose writes are refused, or outlive an authority that
// ended the hold.
func (l *Lease) renew(ctx context.Context) error {
	if l.isPermit() {
		return l.renewPermit(ctx)
	}
	l.mu.Lock()
	cur := l.lease
	l.mu.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		if cur == nil {
			var err error
			if cur, err = l.readLockLease(ctx); err != nil {
				return err
			}
		}
		if err := l.showsGrant(cur); err != nil {
			return err
		}
		err := l.advanceRenewTime(ctx, cur)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		cur = nil // someone moved first: read and decide again
	}
	return fmt.Errorf("renewing lock %s/%s: the Lease kept changing", l.Namespace, l.Lock)
}

// showsGrant returns an error wrapping ErrLost unless the Lease shows this
// holder's grant: our claim's UID with the epoch we were granted.
func (l *Lease) showsGrant(cur *coordinationv1.Lease) error {
	led := fkv1.ReadLedger(cur, l.Lock)
	if led.HolderUID != l.UID {
		return fmt.Errorf("the Lease of lock %s/%s names claim %q, not ours (%s): %w", l.Namespace, l.Lock, led.HolderUID, l.UID, ErrLost)
	}
	if !led.EpochValid || led.Epoch != l.Epoch {
		return fmt.Errorf("the Lease of lock %s/%s names our claim with epoch %q, not the epoch %d we were granted: %w",
			l.Namespace, l.Lock, cur.Annotations[fkv1.AnnotationEpoch], l.Epoch, ErrLost)
	}
	return nil
}

// watchLease watches the lock's Lease (by name) while the lease is held
// and reports LOST the moment it no longer shows this holder's grant: it
// names another claim, or ours with another epoch, or it is deleted (for a
// permit: its entry is gone or names our claim with another epoch; each
// version seen is what the next renewal checks). The
// renewals check the same at every renewal; this hears it at once. It
// starts from the version the first renewal wrote.
func (l *Lease) watchLease() {
	defer l.wg.Done()
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	l.mu.Lock()
	rv := ""
	if ref := l.lease; ref != nil && !l.isPermit() {
		rv = ref.ResourceVersion
	} else if ref := l.ledger; ref != nil && l.isPermit() {
		rv = ref.ResourceVersion
	}
	l.mu.Unlock()
	leases := l.watches.leases
	if leases != nil {
		defer l.watches.stopLeases()
	} else {
		leases = follow(ctx, l.cl.c, client.ObjectKey{Namespace: l.Namespace, Name: l.Lock}, leaseKind, reading(true), rv)
	}
	for {
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			return
		case s, open := <-leases:
			if !open {
				return
			}
			select {
			case <-l.stop:
				return // released: the Lease is about to name nobody
			default:
			}
			var err error
			switch {
			case s.err != nil:
				l.cl.log.Info("cannot watch the lock's Lease: learning of a loss from the renewals and the claim only",
					"lock", l.Lock, "claim", l.ClaimName, "error", s.err.Error())
				l.mu.Lock()
				l.ledgerUnwatched = true // a permit's renewals read it from now on
				l.mu.Unlock()
				return
			case s.gone:
				err = fmt.Errorf("the Lease of lock %s/%s is gone: %w", l.Namespace, l.Lock, ErrLost)
			case l.isPermit():
				l.mu.Lock()
				l.ledger = s.obj
				l.mu.Unlock()
				err = l.showsPermit(s.obj)
			default:
				err = l.showsGrant(s.obj)
			}
			if err != nil && l.State() != Releasing {
				l.transition(Lost, err.Error())
				return
			}
		}
	}
}

// watchClaim watches only our claim and reports LOST when it turns Expired,
// is deleted by someone else, or shows Held with an epoch other than the
// one we hold (the grant's two records disagree: trust neither).
func (l *Lease) watchClaim() {
	defer l.wg.Done()
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	// The wait's follow, which has seen every version since the claim's
	// create; else read first, then watch from that version: nothing
	// between is missed.
	claims := l.watches.claims
	if claims != nil {
		defer l.watches.stopClaims()
	} else {
		claims = follow(ctx, l.cl.c, client.ObjectKey{Namespace: l.Namespace, Name: l.ClaimName}, claimKind, reading(true), "")
	}
	for {
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			return
		case s, open := <-claims:
			if !open {
				return
			}
			select {
			case <-l.stop:
				return // released: the claim is about to be deleted
			default:
			}
			reason := ""
			switch {
			case s.err != nil:
				l.cl.log.Info("cannot watch the claim: learning of a loss from the renewals and the Lease only",
					"lock", l.Lock, "claim", l.ClaimName, "error", s.err.Error())
				return
			case s.gone && (s.obj == nil || s.obj.UID == l.UID), !s.gone && s.obj.UID != l.UID:
				reason = "the claim was deleted by someone else"
			case s.gone:
				continue // an older claim of that name
			case s.obj.Status.Phase == fkv1.PhaseExpired:
				reason = "the authority marked the claim Expired"
			case s.obj.Status.Phase == fkv1.PhaseHeld && s.obj.Status.Epoch != l.Epoch:
				reason = fmt.Sprintf("the claim's status shows it Held with epoch %d, the Lease showed it epoch %d: the grant's records disagree", s.obj.Status.Epoch, l.Epoch)
			}
			if reason != "" && l.State() != Releasing {
				l.transition(Lost, reason)
				return
			}
		}
	}
}

// Release gives the lock up: it deletes the claim with a UID precondition,
// so a delayed or repeated release can never delete a newer claim of the
// same name. A lost reply returns ErrReleaseUncertain (the claim is gone or
// will expire); repeating Release is harmless.
func (l *Lease) Release(ctx context.Context) error {
	l.transition(Releasing, "release requested")
	l.stopOnce()
	claim := &fkv1.FencedLease{}
	claim.Namespace, claim.Name, claim.UID = l.Namespace, l.ClaimName, l.UID
	err := l.cl.withTimeout(ctx, l.opts.RequestTimeout, func(ctx context.Context) error {
		return l.cl.c.Delete(ctx, claim, client.Preconditions{UID: &l.UID})
	})
	switch {
	case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Deleted now, deleted before, or the name now belongs to a newer claim.
		l.transition(Released, "claim deleted")
		l.cancel()
		return nil
	case retriable(err):
		l.cancel()
		return fmt.Errorf("releasing claim %s/%s: %w", l.Namespace, l.ClaimName, errors.Join(ErrReleaseUncertain, err))
	}
	l.cancel()
	return fmt.Errorf("releasing claim %s/%s: %w", l.Namespace, l.ClaimName, err)
}

func (l *Lease) stopOnce() { l.stopped.Do(func() { close(l.stop) }) }

// Stamp sets the fencing label and this lease's epoch on obj.
func (l *Lease) Stamp(obj metav1.Object) { Stamp(obj, l.Lock, l.Epoch) }

// Stamp sets the fencekeeper.io/lock label and the fencekeeper.io/epoch
// annotation on any object (typed, unstructured, any client.Object).
func Stamp(obj metav1.Object, lock string, epoch int64) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[fkv1.LabelLock] = lock
	obj.SetLabels(labels)
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[fkv1.AnnotationEpoch] = strconv.FormatInt(epoch, 10)
	obj.SetAnnotations(ann)
}

// Update stamps obj with this lease's epoch and updates it. It always sends
// the write — the object, not this process's view of time, decides — and
// returns an error matching ErrStaleEpoch when the object refused it because
// a newer holder's epoch is current. A FutureEpoch refusal soon after the
// grant is sent again (see FutureEpochWait).
func (l *Lease) Update(ctx context.Context, c client.Client, obj client.Object, opts ...client.UpdateOption) error {
	l.Stamp(obj)
	return l.send(ctx, func() error { return c.Update(ctx, obj, opts...) })
}

// Create stamps obj with this lease's epoch and creates it.
func (l *Lease) Create(ctx context.Context, c client.Client, obj client.Object, opts ...client.CreateOption) error {
	l.Stamp(obj)
	return l.send(ctx, func() error { return c.Create(ctx, obj, opts...) })
}

// FutureEpochWait is how long after its grant a holder's write that the
// object refused as FutureEpoch (it does not know the epoch yet) is sent
// again, every 10 ms to 200 ms. In CEL mode the apiserver checks a write
// against its parameter cache, which may show the grant a moment after
// the holder learned of it; the webhook reads the Lease live and does not
// refuse so. A FutureEpoch refusal later than this is returned: it then
// means the epoch was never issued.
const FutureEpochWait = 2 * time.Second

// send sends a write presenting this lease's epoch and returns its outcome
// (Fenced), sending it again after a FutureEpoch refusal for
// FutureEpochWait after the grant, while ctx and the lease last. Resending
// a refused write is safe: the object decides again.
func (l *Lease) send(ctx context.Context, write func() error) error {
	var last error
	backoff := wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Cap: 200 * time.Millisecond, Steps: math.MaxInt32}
	err := wait.ExponentialBackoffWithContext(ctx, backoff, func(context.Context) (bool, error) {
		last = Fenced(write())
		retry := FencingReason(last) == fkv1.AdmissionFutureEpoch && !l.grantedAt.IsZero() &&
			l.since(l.grantedAt) < FutureEpochWait && l.ctx.Err() == nil
		return !retry, nil
	})
	if last == nil && err != nil {
		return err // ctx ended before anything was sent
	}
	return last
}

// Fenced turns the fencing admission's stale-epoch denial into an error
// matching ErrStaleEpoch (and counts it); other errors pass unchanged.
func Fenced(err error) error {
	if err != nil && IsStaleEpoch(err) {
		staleWrites.Inc()
		return staleError{err: err}
	}
	return err
}

// Patch stamps obj with this lease's epoch and patches it. The epoch is
// always presented in the patch itself, even when the patch's base already
// carried the same stamp (a client.MergeFrom diff would drop it): the object
// refuses a content write that presents no epoch of its own. JSON patches
// need the object to have annotations already (every fenced object does:
// its fenced-epoch watermark).
func (l *Lease) Patch(ctx context.Context, c client.Client, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	l.Stamp(obj)
	return l.send(ctx, func() error { return c.Patch(ctx, obj, presenting{Patch: patch, epoch: l.Epoch}, opts...) })
}

// PresentIn sets the epoch token in the annotations of a decoded object or
// merge patch.
func PresentIn(obj map[string]any, epoch int64) {
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		obj["metadata"] = meta
	}
	ann, _ := meta["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
		meta["annotations"] = ann
	}
	ann[fkv1.AnnotationEpoch] = fkv1.FormatEpoch(epoch)
}

// presenting adds the epoch token to whatever patch it wraps.
type presenting struct {
	client.Patch
	epoch int64
}

func (p presenting) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	token := strconv.FormatInt(p.epoch, 10)
	switch p.Type() {
	case types.MergePatchType, types.StrategicMergePatchType:
		var m map[string]any
		if err := DecodeJSON(data, &m); err != nil {
			return nil, fmt.Errorf("adding the epoch to the patch: %w", err)
		}
		if m == nil {
			m = map[string]any{}
		}
		PresentIn(m, p.epoch)
		return json.Marshal(m)
	case types.JSONPatchType:
		var ops []map[string]any
		if err := DecodeJSON(data, &ops); err != nil {
			return nil, fmt.Errorf("adding the epoch to the patch: %w", err)
		}
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/" + strings.ReplaceAll(fkv1.AnnotationEpoch, "/", "~1"), "value": token})
		return json.Marshal(ops)
	}
	// Apply patches send the whole (stamped) object.
	return data, nil
}

// DecodeJSON decodes JSON keeping numbers as written (json.Number): a
// round trip through float64 would change integers above 2^53 in the
// objects whose writes are re-encoded to carry the epoch.
func DecodeJSON(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}

// advanceRenewTime sends one renewal of cur (the Lease this holder
// renews, as last read): its renewTime advanced to now, guarded by its
// resourceVersion. On success the renewed Lease is kept for the next one;
// on any error it is forgotten (read again next time).
func (l *Lease) advanceRenewTime(ctx context.Context, cur *coordinationv1.Lease) error {
	upd := cur.DeepCopy()
	now := time.Now().Truncate(time.Microsecond)
	if upd.Spec.RenewTime != nil && !now.After(upd.Spec.RenewTime.Time) {
		now = upd.Spec.RenewTime.Add(time.Microsecond) // renewTime must advance
	}
	upd.Spec.RenewTime = &metav1.MicroTime{Time: now}
	sent := time.Now()
	err := l.cl.withTimeout(ctx, l.opts.RequestTimeout, func(ctx context.Context) error { return l.cl.c.Update(ctx, upd) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.lease = nil
		return err
	}
	renewals.WithLabelValues("ok").Inc()
	observeRenewalAck(l.lastAckSent, sent, time.Now(), l.TTL)
	l.lease, l.lastAckSent = upd, sent
	return nil
}

// readLockLease reads the lock's Lease live; its absence is a loss.
func (l *Lease) readLockLease(ctx context.Context) (*coordinationv1.Lease, error) {
	var got coordinationv1.Lease
	err := l.cl.withTimeout(ctx, l.opts.RequestTimeout, func(ctx context.Context) error {
		return l.cl.c.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: l.Lock}, &got)
	})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("the Lease of lock %s/%s is gone: %w", l.Namespace, l.Lock, ErrLost)
	}
	if err != nil {
		return nil, err
	}
	return &got, nil
}

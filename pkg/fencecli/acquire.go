package fencecli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

type acquireFlags struct {
	holder, requestID string
	ttl, wait         time.Duration
	noWait            bool
	maxHolders        int32
}

func (f *acquireFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.holder, "holder", defaultHolder(), "Holder identity. "+holderDefault)
	cmd.Flags().DurationVar(&f.ttl, "ttl", 15*time.Second, "Lease duration: whole seconds from 1s to 24h.")
	cmd.Flags().DurationVar(&f.wait, "wait", 0, fmt.Sprintf("How long to wait in the queue: 0 (the default) waits until granted; "+
		"else up to 24h, rounded up to whole seconds and set as the claim's acquireTimeoutSeconds, so the authority ends the claim then "+
		"even if this process is gone. Not granted in time: exit code %d.", ExitNotAcquired))
	cmd.Flags().BoolVar(&f.noWait, "no-wait", false, fmt.Sprintf("Try once: granted at the authority's first decision, or exit code %d at once "+
		"(the lock is held or others wait first), leaving no claim behind. Not with --wait.", ExitNotAcquired))
	cmd.Flags().StringVar(&f.requestID, "request-id", "", "Request ID; the same ID finds the same claim after a lost reply.")
	cmd.Flags().Int32Var(&f.maxHolders, "max-holders", 1, "The lock's capacity (the claim's maxHolders): 1 is a mutex; 2 to 100 make it a semaphore "+
		"whose holders each hold a permit with an epoch of its own. Every claim of a lock must ask for the same: "+
		"one asking for another waits (CapacityMismatch) until the lock has no holder.")
}

// validMaxHolders checks --max-holders: the CRD's maxHolders, 1..100.
func validMaxHolders(n int32) error {
	if n < 1 || n > fkv1.MaxMaxHolders {
		return fmt.Errorf("--max-holders %d: want 1 (a mutex, the default) to %d (a semaphore of up to that many holders at once)", n, fkv1.MaxMaxHolders)
	}
	return nil
}

// validate checks the flags acquire and run share, before any API call.
func (f *acquireFlags) validate(cmd *cobra.Command) error {
	if err := validTTL(f.ttl); err != nil {
		return err
	}
	if f.noWait && cmd.Flags().Changed("wait") {
		return usageError(cmd, "--no-wait and --wait %v: pass one (--no-wait tries once; --wait bounds the wait)", f.wait)
	}
	if err := validWait(f.wait); err != nil {
		return err
	}
	if err := validMaxHolders(f.maxHolders); err != nil {
		return err
	}
	return validHolder(f.holder)
}

// decisionGrace is how long after the claim's own deadline (--wait, or at
// once with --no-wait) the command waits for the authority's decision
// before it gives up on its own clock: the authority counts from when it
// first observes the claim, and a grant that won the race against the
// deadline is reported as a grant. Only an authority that does not answer
// (the manager is down) makes the command wait this long.
const decisionGrace = 10 * time.Second

// acquireTimeout is lease.Options.AcquireTimeout for the flags: 0 with
// --no-wait, --wait when set, nil (wait until granted) otherwise.
func (f *acquireFlags) acquireTimeout() *time.Duration {
	switch {
	case f.noWait:
		return ptr.To(time.Duration(0))
	case f.wait > 0:
		return ptr.To(f.wait)
	}
	return nil
}

// context bounds the wait on this process's clock: decisionGrace after the
// claim's deadline, so the authority's decision comes first.
func (f *acquireFlags) context(parent context.Context) (context.Context, context.CancelFunc) {
	if d := f.acquireTimeout(); d != nil {
		deadline := (*d + time.Second - 1).Truncate(time.Second) // the claim's acquireTimeoutSeconds
		return context.WithTimeout(parent, deadline+decisionGrace)
	}
	return context.WithCancel(parent)
}

// options are the lease.Options of the flags.
func (f *acquireFlags) options() lease.Options {
	return lease.Options{RequestID: f.requestID, TTL: f.ttl, AcquireTimeout: f.acquireTimeout(), MaxHolders: f.maxHolders}
}

// waitFailed turns Acquire's error into what the command reports: exit code
// ExitNotAcquired when the authority ended the claim without a grant (the
// library deleted it), a message saying so when this process gave up first.
func (f *acquireFlags) waitFailed(ctx context.Context, c client.Client, ns, lock string, err error) error {
	switch {
	case errors.Is(err, lease.ErrAcquireTimeout):
		why := fmt.Sprintf("lock %s/%s not granted within --wait %v", ns, lock, f.wait)
		if f.noWait {
			why = fmt.Sprintf("lock %s/%s not granted at once (--no-wait)", ns, lock)
		}
		return notAcquired{fmt.Errorf("%s: %s; the claim left the queue", why, heldBy(c, ns, lock, f.maxHolders))}
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && f.acquireTimeout() != nil:
		return fmt.Errorf("no decision on lock %s/%s from the authority %v after the claim's deadline: is the fencekeeper manager running? (left the queue)",
			ns, lock, decisionGrace)
	case ctx.Err() != nil:
		return fmt.Errorf("gave up waiting for lock %s/%s (left the queue): %w", ns, lock, ctx.Err())
	}
	return err
}

// heldBy says who holds the lock now, as well as one quick read tells:
// "held by W1 with epoch 42", "free now", or "holder unknown"; for a
// semaphore, its permits ("3 of 3 permits held: W1 with epoch 41, ...").
// When the lock records another capacity than maxHolders (what the claim
// asked for), it says so: such a claim waits until the lock is free.
func heldBy(c client.Client, ns, lock string, maxHolders int32) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var cur coordinationv1.Lease
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		return "free now"
	case err != nil || !fkv1.IsManagedLease(&cur):
		return "holder unknown"
	}
	led := fkv1.ReadLedger(&cur, lock)
	mismatch := ""
	if capacity := ledgerCapacity(led); maxHolders > 0 && capacity != maxHolders && (led.Held() || len(led.Permits) > 0) {
		mismatch = fmt.Sprintf(" (the lock's capacity is %d, this claim asked for --max-holders %d: it waits until the lock has no holder)", capacity, maxHolders)
	}
	switch {
	case len(led.Permits) > 0:
		return fmt.Sprintf("%d of %d permits held: %s%s", len(led.Permits), ledgerCapacity(led), permitList(led.Permits), mismatch)
	case !led.Held():
		return "free now"
	case led.HolderIdentity != "":
		return fmt.Sprintf("held by %s with epoch %d%s", led.HolderIdentity, led.Epoch, mismatch)
	}
	return fmt.Sprintf("held by claim %s with epoch %d%s", led.HolderClaim, led.Epoch, mismatch)
}

// ledgerCapacity is the lock's capacity as its Lease records it (1: a
// mutex).
func ledgerCapacity(led fkv1.Ledger) int32 { return max(led.Capacity, 1) }

// permitList names each permit's holder and epoch: "W1 with epoch 41, W2
// with epoch 42".
func permitList(ps []fkv1.Permit) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = fmt.Sprintf("%s with epoch %d (claim %s)", p.Holder, p.Epoch, p.Claim)
	}
	return strings.Join(out, ", ")
}

// result is what acquire prints with -o json|yaml (and what -o jsonpath
// and go-template see).
type result struct {
	Namespace string `json:"namespace"`
	Lock      string `json:"lock"`
	Holder    string `json:"holder"`
	Claim     string `json:"claim"`
	UID       string `json:"uid"`
	Epoch     int64  `json:"epoch"`
	TTL       string `json:"ttl"`
	// MaxHolders is the lock's capacity the claim asked for (1: a mutex).
	MaxHolders int32 `json:"maxHolders"`
}

func newAcquireCommand(o *options) *cobra.Command {
	f := &acquireFlags{}
	pf := newPrintFlags(false)
	cmd := &cobra.Command{
		Use:   "acquire LOCK [--holder ID] [--ttl 15s] [--max-holders N] [--wait 30s | --no-wait] [-o json|yaml|name|jsonpath=...]",
		Short: "Wait for the lock and print the epoch and the claim name",
		Long: `acquire queues for LOCK, waits until it holds it and prints the epoch and
the claim name on one line: "EPOCH CLAIM" (the epoch stays the first word;
-o json|yaml prints the whole result, -o jsonpath='{.epoch}' one field of
it, -o name the claim as fencedlease.fencekeeper.io/CLAIM).

The lease is not renewed after this command exits: it expires after --ttl
unless your process renews the backing Lease (or use 'kubectl fence run').
Release it early with 'kubectl fence release CLAIM' or
'kubectl fence release --lock LOCK --holder ID'.

--max-holders N (2 to 100) asks for a permit of a semaphore: up to N
holders hold the lock at once, each with its own epoch (printed as above),
and each renews a Lease of its own (LOCK-permit-EPOCH). Every claim of a
lock must ask for the same N; one asking for another waits (reason
CapacityMismatch) until the lock has no holder.

--wait D bounds the wait on the server too: the claim's acquireTimeoutSeconds
is D rounded up to whole seconds, so the authority ends the claim if it is
still waiting then (counted from when it first saw it), even if this
command was killed meanwhile. --no-wait tries once. The authority decides
between the grant and the deadline, never both: a grant that came just in
time is a grant.

Exit codes:
  0    acquired: the epoch and the claim are printed
  73   not acquired: --no-wait found the lock taken, or --wait ran out (the
       authority ended the claim; this command deleted it, nothing waits)
  1    acquire failed itself: bad flags, no cluster, no decision from the
       authority ` + decisionGrace.String() + ` after the deadline (is the manager running?)`,
		Example: `  kubectl fence acquire -n reports report-2026-07 --holder W1 --ttl 60s --wait 30s
  kubectl fence acquire -n reports report-2026-07 --holder W1 --no-wait || echo "busy: exit $?"
  kubectl fence acquire -n reports warehouse --holder W1 --max-holders 3
  read -r EPOCH CLAIM < <(kubectl fence acquire -n reports report-2026-07 --holder W1)
  EPOCH=$(kubectl fence acquire -n reports report-2026-07 --holder W1 -o jsonpath='{.epoch}')`,
		Args: oneLock,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(cmd); err != nil {
				return err
			}
			return pf.validate()
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, c, ns, err := o.clients()
			if err != nil {
				return err
			}
			ctx, cancel := f.context(cmd.Context())
			defer cancel()
			l, err := lc.Acquire(ctx, args[0], f.holder, f.options())
			if err != nil {
				return f.waitFailed(ctx, c, ns, args[0], err)
			}
			r := result{Namespace: ns, Lock: l.Lock, Holder: l.Holder, Claim: l.ClaimName, UID: string(l.UID), Epoch: l.Epoch, TTL: l.TTL.String(), MaxHolders: l.MaxHolders}
			// The epoch stays the first word: scripts that read it keep working.
			err = pf.print(o.streams.Out, printed{data: r, names: []runtime.Object{claimObject(ns, l.ClaimName)},
				text: func(bool) { out(o.streams.Out, "%d %s\n", l.Epoch, l.ClaimName) }})
			if err != nil {
				// Nobody learned the epoch (a template that failed on the
				// result): give the lock back rather than leave it held.
				relCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if rerr := l.Release(relCtx); rerr != nil {
					return fmt.Errorf("%w (and releasing the lock failed: %v)", err, rerr) //nolint:errorlint // the print error is the cause; explain() and exit codes must not classify by the release failure
				}
				return fmt.Errorf("%w (lock %s/%s released)", err, ns, l.Lock)
			}
			return nil
		},
	}
	f.bind(cmd)
	pf.addFlags(cmd, `one line, "EPOCH CLAIM"`)
	return cmd
}

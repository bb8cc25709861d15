package fencecli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

type acquireFlags struct {
	holder, requestID string
	ttl, wait         time.Duration
}

func (f *acquireFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.holder, "holder", defaultHolder(), "Holder identity. "+holderDefault)
	cmd.Flags().DurationVar(&f.ttl, "ttl", 15*time.Second, "Lease duration: whole seconds from 1s to 24h.")
	cmd.Flags().DurationVar(&f.wait, "wait", 0, "How long to wait in the queue before giving up (0: forever; not negative).")
	cmd.Flags().StringVar(&f.requestID, "request-id", "", "Request ID; the same ID finds the same claim after a lost reply.")
}

// validate checks the flags acquire and run share, before any API call.
func (f *acquireFlags) validate() error {
	if err := validTTL(f.ttl); err != nil {
		return err
	}
	if err := validWait(f.wait); err != nil {
		return err
	}
	return validHolder(f.holder)
}

func (f *acquireFlags) context(parent context.Context) (context.Context, context.CancelFunc) {
	if f.wait > 0 {
		return context.WithTimeout(parent, f.wait)
	}
	return context.WithCancel(parent)
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
}

func newAcquireCommand(o *options) *cobra.Command {
	f := &acquireFlags{}
	pf := newPrintFlags(false)
	cmd := &cobra.Command{
		Use:   "acquire LOCK [--holder ID] [--ttl 15s] [--wait 30s] [-o json|yaml|name|jsonpath=...]",
		Short: "Wait for the lock and print the epoch and the claim name",
		Long: `acquire queues for LOCK, waits until it holds it and prints the epoch and
the claim name on one line: "EPOCH CLAIM" (the epoch stays the first word;
-o json|yaml prints the whole result, -o jsonpath='{.epoch}' one field of
it, -o name the claim as fencedlease.fencekeeper.io/CLAIM).

The lease is not renewed after this command exits: it expires after --ttl
unless your process renews the backing Lease (or use 'kubectl fence run').
Release it early with 'kubectl fence release CLAIM' or
'kubectl fence release --lock LOCK --holder ID'.`,
		Example: `  kubectl fence acquire -n reports report-2026-07 --holder W1 --ttl 60s --wait 30s
  read -r EPOCH CLAIM < <(kubectl fence acquire -n reports report-2026-07 --holder W1)
  EPOCH=$(kubectl fence acquire -n reports report-2026-07 --holder W1 -o jsonpath='{.epoch}')`,
		Args: oneLock,
		PreRunE: func(*cobra.Command, []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			return pf.validate()
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, _, ns, err := o.clients()
			if err != nil {
				return err
			}
			ctx, cancel := f.context(cmd.Context())
			defer cancel()
			l, err := lc.Acquire(ctx, args[0], f.holder, lease.Options{RequestID: f.requestID, TTL: f.ttl})
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("timed out after %v waiting for lock %s/%s (left the queue)", f.wait, ns, args[0])
				}
				return err
			}
			r := result{Namespace: ns, Lock: l.Lock, Holder: l.Holder, Claim: l.ClaimName, UID: string(l.UID), Epoch: l.Epoch, TTL: l.TTL.String()}
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

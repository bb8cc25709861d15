package fencecli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

type releaseFlags struct {
	lock, holder   string
	ignoreNotFound bool
}

// notFound: there is no claim to release (none by that name, or none of
// that lock by that holder); it says what was looked for.
type notFound string

func (e notFound) Error() string { return string(e) + " (already released?)" }

// released is what release prints with -o json|yaml (and what -o jsonpath
// and go-template see).
type released struct {
	Namespace string `json:"namespace"`
	Lock      string `json:"lock"`
	Holder    string `json:"holder"`
	Claim     string `json:"claim"`
	UID       string `json:"uid"`
	// Epoch is the epoch the claim was granted (0: it never was).
	Epoch int64 `json:"epoch"`
}

func newReleaseCommand(o *options) *cobra.Command {
	f := &releaseFlags{}
	pf := newPrintFlags(false)
	cmd := &cobra.Command{
		Use:   "release (CLAIM | --lock LOCK [--holder ID]) [--ignore-not-found]",
		Short: "Release a lock by deleting its claim (the exact one: UID precondition)",
		Long: `release deletes a claim: the one named CLAIM (what acquire printed), or the
claim of LOCK by --holder (default: the same stable default acquire and run
use, so 'release --lock LOCK' undoes an 'acquire LOCK' from the same pod or
machine). The delete carries the claim's UID, so it never deletes a newer
claim of the same name.

A claim that does not exist is an error (exit 1) unless --ignore-not-found
(then nothing is printed). -o json|yaml print what was released, -o name
the claim (fencedlease.fencekeeper.io/CLAIM), as kubectl delete -o name.`,
		Example: `  kubectl fence release -n reports report-2026-07-1c287f6ecb8b
  kubectl fence release -n reports --lock report-2026-07 --holder W1 --ignore-not-found`,
		Args:    f.args,
		PreRunE: func(*cobra.Command, []string) error { return pf.validate() },
		RunE: func(cmd *cobra.Command, args []string) error {
			_, c, ns, err := o.clients()
			if err != nil {
				return err
			}
			cl, err := f.find(cmd.Context(), c, ns, args)
			if err == nil {
				err = deleteClaim(cmd.Context(), c, cl)
			}
			var nf notFound
			switch {
			case errors.As(err, &nf) && f.ignoreNotFound:
				return nil // like kubectl delete --ignore-not-found: nothing to say
			case errors.As(err, &nf):
				return fmt.Errorf("%w; pass --ignore-not-found to treat that as success", err)
			case err != nil:
				return err
			}
			r := released{Namespace: ns, Lock: cl.Spec.LockName, Holder: cl.Spec.HolderIdentity, Claim: cl.Name, UID: string(cl.UID), Epoch: cl.Status.Epoch}
			return pf.print(o.streams.Out, printed{data: r, names: []runtime.Object{claimObject(ns, cl.Name)}, text: func(bool) {
				out(o.streams.Out, "released %s/%s (lock %s, epoch %d)\n", ns, cl.Name, cl.Spec.LockName, cl.Status.Epoch)
			}})
		},
	}
	cmd.Flags().StringVar(&f.lock, "lock", "", "Release the claim of this lock by --holder instead of naming the claim.")
	cmd.Flags().StringVar(&f.holder, "holder", defaultHolder(), "With --lock: whose claim. "+holderDefault)
	cmd.Flags().BoolVar(&f.ignoreNotFound, "ignore-not-found", false, "Exit 0 when there is no such claim (already released).")
	pf.addFlags(cmd, `one line, "released NAMESPACE/CLAIM (lock LOCK, epoch EPOCH)"`)
	return cmd
}

// args wants either CLAIM or --lock, not both.
func (f *releaseFlags) args(cmd *cobra.Command, args []string) error {
	byLock := cmd.Flags().Changed("lock")
	switch {
	case byLock && len(args) > 0:
		return usageError(cmd, "either CLAIM or --lock, not both (got CLAIM %q and --lock %q)", args[0], f.lock)
	case byLock:
		if err := validLock(f.lock); err != nil {
			return err
		}
		return validHolder(f.holder)
	case cmd.Flags().Changed("holder"):
		return usageError(cmd, "--holder needs --lock (a CLAIM names one claim already)")
	case len(args) == 0:
		return usageError(cmd, "missing CLAIM (the name acquire printed) or --lock LOCK")
	case len(args) > 1:
		return usageError(cmd, "one CLAIM only, got %d arguments: %q", len(args), args)
	}
	return nil
}

// find reads the claim to release: by name, or the holder's claim of the lock.
func (f *releaseFlags) find(ctx context.Context, c client.Client, ns string, args []string) (*fkv1.FencedLease, error) {
	if f.lock == "" {
		var cl fkv1.FencedLease
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: args[0]}, &cl)
		if apierrors.IsNotFound(err) {
			return nil, notFound(fmt.Sprintf("no claim %s/%s", ns, args[0]))
		}
		return &cl, err
	}
	return claimOf(ctx, c, ns, f.lock, f.holder)
}

// claimOf finds the holder's claim of the lock. Its name is lease.ClaimName
// of the lock, the holder and a request ID the caller may not know (acquire
// picks a random one without --request-id), so it lists the lock's claims
// and matches spec.holderIdentity.
func claimOf(ctx context.Context, c client.Client, ns, lock, holder string) (*fkv1.FencedLease, error) {
	var list fkv1.FencedLeaseList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var found []*fkv1.FencedLease
	for i := range list.Items {
		cl := &list.Items[i]
		if cl.Spec.LockName == lock && cl.Spec.HolderIdentity == holder && cl.DeletionTimestamp == nil {
			found = append(found, cl)
		}
	}
	switch len(found) {
	case 0:
		return nil, notFound(fmt.Sprintf("no claim of lock %s/%s by holder %q", ns, lock, holder))
	case 1:
		return found[0], nil
	}
	// Releasing all of them could end a hold the caller did not mean.
	names := make([]string, len(found))
	for i, cl := range found {
		names[i] = cl.Name
	}
	return nil, fmt.Errorf("holder %q has %d claims of lock %s/%s (%s): release one by name",
		holder, len(found), ns, lock, strings.Join(names, ", "))
}

// deleteClaim deletes exactly this claim (UID precondition): a claim
// recreated under the same name since we read it is someone else's.
func deleteClaim(ctx context.Context, c client.Client, cl *fkv1.FencedLease) error {
	err := c.Delete(ctx, cl, client.Preconditions{UID: &cl.UID})
	if apierrors.IsNotFound(err) {
		return nil // gone between our read and the delete: released all the same
	}
	return err
}

package fencecli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

type breakFlags struct {
	reason string
	wait   time.Duration
	print  *printFlags
}

// broken is what break prints with -o json|yaml (and what -o jsonpath and
// go-template see).
type broken struct {
	Namespace string `json:"namespace"`
	Lock      string `json:"lock"`
	// Claim, Holder and Epoch: the hold that was broken.
	Claim  string `json:"claim"`
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch"`
	// Reason is --reason.
	Reason string `json:"reason"`
	// Ended: the hold is over (false with --wait 0: asked to end, not
	// waited for).
	Ended bool `json:"ended"`
	// EndReason and EndMessage are the claim's Held condition once ended
	// (empty when the claim is gone).
	EndReason  string `json:"endReason,omitempty"`
	EndMessage string `json:"endMessage,omitempty"`
}

func newBreakCommand(o *options) *cobra.Command {
	f := &breakFlags{print: newPrintFlags(false)}
	cmd := &cobra.Command{
		Use:   "break LOCK --reason TEXT",
		Short: "Force-release a lock: end the current hold at once (needs the verb 'break', an admin's)",
		Long: `break ends the current hold of LOCK at once: the holder's claim turns Expired
with reason ForcedRelease and the next waiter is granted a higher epoch, so
any write the broken holder still makes is refused by the fence.

Who broke it is recorded by the apiserver from your credentials (annotation
fencekeeper.io/broken-by on the claim), with your --reason, in a Warning
Event on the claim and in fencekeeper_forced_releases_total. It needs the
verb "break" on fencedleases (ClusterRole fencekeeper-breaker, aggregated to
admin; holders do not have it).

-o json|yaml print the broken hold and how it ended, -o name its claim
(fencedlease.fencekeeper.io/CLAIM).`,
		Example: `  kubectl fence break -n reports report-2026-07 --reason "W1 hung for an hour; INC-4711"`,
		Args:    oneLock,
		PreRunE: func(*cobra.Command, []string) error {
			if strings.TrimSpace(f.reason) == "" {
				return fmt.Errorf("--reason is required: say why the lock is broken (it is recorded on the claim and in an Event)")
			}
			if len(f.reason) > fkv1.MaxBreakReason {
				return fmt.Errorf("--reason is %d characters long; at most %d are recorded", len(f.reason), fkv1.MaxBreakReason)
			}
			if err := validWait(f.wait); err != nil {
				return err
			}
			return f.print.validate()
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			_, c, ns, err := o.clients()
			if err != nil {
				return err
			}
			return f.run(cmd.Context(), o, c, ns, args[0])
		},
	}
	cmd.Flags().StringVar(&f.reason, "reason", "", "Why the lock is broken (required; recorded on the claim and in an Event).")
	cmd.Flags().DurationVar(&f.wait, "wait", 30*time.Second, "How long to wait for the authority to end the hold (0: do not wait).")
	f.print.addFlags(cmd, "a line saying what was broken")
	return cmd
}

func (f *breakFlags) run(ctx context.Context, o *options, c client.Client, ns, lock string) error {
	var lease coordinationv1.Lease
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: lock}, &lease); apierrors.IsNotFound(err) {
		return fmt.Errorf("lock %s/%s has no Lease: nobody holds it, nothing to break", ns, lock)
	} else if err != nil {
		return err
	}
	led := fkv1.ReadLedger(&lease, lock)
	if lease.Labels[fkv1.LabelManagedBy] != fkv1.ManagedByValue {
		return fmt.Errorf("the Lease %s/%s is not managed by fencekeeper: nothing to break", ns, lock)
	}
	if !led.Held() {
		return fmt.Errorf("lock %s/%s is free (last epoch %d): nothing to break", ns, lock, led.Epoch)
	}
	// The UID in the patch is a precondition: if the holder's claim was
	// replaced meanwhile (same name, new claim), the patch fails instead of
	// breaking a hold nobody asked to break.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         string(led.HolderUID),
		"annotations": map[string]string{fkv1.AnnotationBreakReason: f.reason},
	}})
	if err != nil {
		return err
	}
	claim := &fkv1.FencedLease{}
	claim.Namespace, claim.Name = ns, led.HolderClaim
	if err := c.Patch(ctx, claim, client.RawPatch(types.MergePatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) || (apierrors.IsInvalid(err) && strings.Contains(err.Error(), "metadata.uid")) {
			return fmt.Errorf("the holder claim %s of lock %s/%s is gone or was replaced: the hold already ended", led.HolderClaim, ns, lock)
		}
		return err
	}
	r := broken{Namespace: ns, Lock: lock, Claim: claim.Name, Holder: claim.Spec.HolderIdentity, Epoch: claim.Status.Epoch, Reason: f.reason}
	show := func(text string, a ...any) error {
		return f.print.print(o.streams.Out, printed{data: r, names: []runtime.Object{claimObject(ns, claim.Name)},
			text: func(bool) { out(o.streams.Out, text, a...) }})
	}
	if f.wait == 0 {
		return show("breaking lock %s/%s: claim %s (holder %s, epoch %d) asked to end\n", ns, lock, claim.Name, claim.Spec.HolderIdentity, claim.Status.Epoch)
	}
	var ended *metav1.Condition
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, f.wait, true, func(ctx context.Context) (bool, error) {
		var cur fkv1.FencedLease
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &cur); err != nil {
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		}
		if cur.UID != claim.UID {
			return true, nil // gone and made again (a pod's claim): the broken hold ended
		}
		if cur.Status.Phase != fkv1.PhaseExpired {
			return false, nil
		}
		if h := meta.FindStatusCondition(cur.Status.Conditions, fkv1.ConditionHeld); h != nil {
			ended = h
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("asked to break lock %s/%s (claim %s), but the hold did not end within %v: is the manager running, and is the claim-break policy installed (it records who broke the lock; without it the authority ignores the request)?",
			ns, lock, claim.Name, f.wait)
	}
	r.Ended = true
	if ended == nil {
		return show("broke lock %s/%s: claim %s is gone\n", ns, lock, claim.Name)
	}
	r.EndReason, r.EndMessage = ended.Reason, ended.Message
	return show("broke lock %s/%s: claim %s (holder %s, epoch %d) ended: %s: %s\n",
		ns, lock, claim.Name, claim.Spec.HolderIdentity, claim.Status.Epoch, ended.Reason, ended.Message)
}

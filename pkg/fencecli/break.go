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
	// epoch and claim name the hold to break: required on a semaphore lock
	// (which permit), a check on a mutex (the hold must still be that one).
	epoch int64
	claim string
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
		Use:   "break LOCK --reason TEXT [--epoch E | --claim NAME]",
		Short: "Force-release a lock: end the current hold at once (needs the verb 'break', an admin's)",
		Long: `break ends the current hold of LOCK at once: the holder's claim turns Expired
with reason ForcedRelease and the next waiter is granted a higher epoch, so
any write the broken holder still makes is refused by the fence.

Who broke it is recorded by the apiserver from your credentials (annotation
fencekeeper.io/broken-by on the claim), with your --reason, in a Warning
Event on the claim and in fencekeeper_forced_releases_total. It needs the
verb "break" on fencedleases (ClusterRole fencekeeper-breaker, aggregated to
admin; holders do not have it).

A semaphore lock (capacity above 1) has several holders at once: say which
permit to end, by its epoch (--epoch E) or its claim (--claim NAME), as
'kubectl fence status LOCK' lists them; without one, break refuses and lists
the live permits. On a mutex lock --epoch and --claim are optional checks:
break refuses if the current hold is another.

-o json|yaml print the broken hold and how it ended, -o name its claim
(fencedlease.fencekeeper.io/CLAIM).`,
		Example: `  kubectl fence break -n reports report-2026-07 --reason "W1 hung for an hour; INC-4711"
  kubectl fence break -n reports warehouse --epoch 4712 --reason "picker-2 stuck; INC-4712"`,
		Args: oneLock,
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
			if f.epoch < 0 {
				return fmt.Errorf("--epoch %d: want the positive epoch of the hold to break (see 'kubectl fence status LOCK')", f.epoch)
			}
			if f.epoch > 0 && f.claim != "" {
				return fmt.Errorf("--epoch and --claim both name the hold to break: pass one")
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
	cmd.Flags().Int64Var(&f.epoch, "epoch", 0, "The epoch of the hold to break: required on a semaphore lock (which permit) unless --claim; "+
		"on a mutex lock, break refuses if the current hold has another.")
	cmd.Flags().StringVar(&f.claim, "claim", "", "The claim of the hold to break: required on a semaphore lock (which permit) unless --epoch; "+
		"on a mutex lock, break refuses if the current holder's claim is another.")
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
	name, uid, err := f.pick(ns, lock, led)
	if err != nil {
		return err
	}
	// The UID in the patch is a precondition: if the holder's claim was
	// replaced meanwhile (same name, new claim), the patch fails instead of
	// breaking a hold nobody asked to break.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         string(uid),
		"annotations": map[string]string{fkv1.AnnotationBreakReason: f.reason},
	}})
	if err != nil {
		return err
	}
	claim := &fkv1.FencedLease{}
	claim.Namespace, claim.Name = ns, name
	if err := c.Patch(ctx, claim, client.RawPatch(types.MergePatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) || (apierrors.IsInvalid(err) && strings.Contains(err.Error(), "metadata.uid")) {
			return fmt.Errorf("the holder claim %s of lock %s/%s is gone or was replaced: the hold already ended", name, ns, lock)
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

// pick is the claim (name and UID) of the hold to break, as the lock's
// Lease records it. A mutex has one holder: --epoch and --claim, when
// given, must name it. A semaphore has one per permit: --epoch or --claim
// must say which, and without one the live permits are listed.
func (f *breakFlags) pick(ns, lock string, led fkv1.Ledger) (string, types.UID, error) {
	if !led.IsSemaphore() && len(led.Permits) == 0 {
		if !led.Held() {
			return "", "", fmt.Errorf("lock %s/%s is free (last epoch %d): nothing to break", ns, lock, led.Epoch)
		}
		if (f.epoch > 0 && f.epoch != led.Epoch) || (f.claim != "" && f.claim != led.HolderClaim) {
			return "", "", fmt.Errorf("lock %s/%s is held by claim %s with epoch %d, not the hold named by %s: nothing broken (the hold you meant ended?)",
				ns, lock, led.HolderClaim, led.Epoch, f.named())
		}
		return led.HolderClaim, led.HolderUID, nil
	}
	if len(led.Permits) == 0 {
		return "", "", fmt.Errorf("semaphore lock %s/%s (capacity %d) has no live permit: nothing to break", ns, lock, ledgerCapacity(led))
	}
	if f.epoch == 0 && f.claim == "" {
		return "", "", fmt.Errorf("lock %s/%s is a semaphore (capacity %d) with %d live permits: say which to break with --epoch E or --claim NAME; live permits:\n%s",
			ns, lock, ledgerCapacity(led), len(led.Permits), permitLines(led.Permits))
	}
	for _, p := range led.Permits {
		if (f.epoch > 0 && p.Epoch == f.epoch) || (f.claim != "" && p.Claim == f.claim) {
			return p.Claim, p.UID, nil
		}
	}
	return "", "", fmt.Errorf("semaphore lock %s/%s has no live permit with %s (ended already?); live permits:\n%s",
		ns, lock, f.named(), permitLines(led.Permits))
}

// named says how the flags name the hold: "epoch 42" or "claim w1-...".
func (f *breakFlags) named() string {
	if f.epoch > 0 {
		return fmt.Sprintf("--epoch %d", f.epoch)
	}
	return fmt.Sprintf("--claim %s", f.claim)
}

// permitLines lists permits one a line: epoch, holder, claim.
func permitLines(ps []fkv1.Permit) string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = fmt.Sprintf("  epoch %d  holder %s  claim %s", p.Epoch, p.Holder, p.Claim)
	}
	return strings.Join(lines, "\n")
}

package fencecli

import (
	"context"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// lockStatus is what status prints for one lock.
type lockStatus struct {
	Namespace string `json:"namespace"`
	Lock      string `json:"lock"`
	Holder    string `json:"holder,omitempty"`
	Claim     string `json:"claim,omitempty"`
	// HolderUser is the user the hold is bound to (the Lease's
	// fencekeeper.io/holder-user), when it is.
	HolderUser string `json:"holderUser,omitempty"`
	Epoch      int64  `json:"epoch"`
	// TTL is the holder's lease duration; TTLLeft an estimate of what is left.
	TTL     string `json:"ttl,omitempty"`
	TTLLeft string `json:"ttlLeft,omitempty"`
	// HeldFor is how long the holder has held the lock (since the Lease's
	// acquireTime; a wall-clock estimate).
	HeldFor string   `json:"heldFor,omitempty"`
	Queue   []string `json:"queue"`
	// QueueLength and OldestWait: how many wait, and how long the first
	// has waited (since its claim was created).
	QueueLength int    `json:"queueLength"`
	OldestWait  string `json:"oldestWait,omitempty"`
	// Conflict is set while a same-named Lease that fencekeeper does not
	// manage blocks the lock: why (the claims' LockConflict message).
	Conflict string `json:"conflict,omitempty"`
	// MaxHolders is the lock's capacity as its Lease records it (1: a
	// mutex). Permits are a semaphore's live permits, by epoch; Holder,
	// Claim and the times above are then empty (each permit has its own).
	MaxHolders int32          `json:"maxHolders,omitempty"`
	Permits    []permitStatus `json:"permits,omitempty"`
}

// permitStatus is one live permit of a semaphore lock: the lock's Lease's
// entry, and the times of the permit's own renewal Lease (LOCK-permit-EPOCH).
type permitStatus struct {
	Epoch  int64  `json:"epoch"`
	Holder string `json:"holder"`
	Claim  string `json:"claim"`
	// HolderUser is the user the permit is bound to, when it is.
	HolderUser string `json:"holderUser,omitempty"`
	TTL        string `json:"ttl,omitempty"`
	// RenewTime is the permit Lease's last renewal; HeldFor and TTLLeft
	// wall-clock estimates (empty while that Lease does not exist yet).
	RenewTime string `json:"renewTime,omitempty"`
	HeldFor   string `json:"heldFor,omitempty"`
	TTLLeft   string `json:"ttlLeft,omitempty"`
}

// conflictHolder is what the HOLDER column shows for a blocked lock.
const conflictHolder = "<conflict: Lease not managed by fencekeeper>"

func newStatusCommand(o *options) *cobra.Command {
	pf := newPrintFlags(true)
	var allNamespaces bool
	cmd := &cobra.Command{
		Use:   "status [LOCK]",
		Short: "Show holder, epoch, time left and the queue of one lock or all locks in the namespace",
		Long: `status shows who holds each lock of the namespace (or LOCK only, or, with
-A, the locks of every namespace), since when, the time left, and who waits.

A semaphore lock (capacity above 1) shows "<N of M permits>" as its holder
and, below the table, every live permit: its epoch, holder, claim, how long
it has been held, the time left and when its own Lease (LOCK-permit-EPOCH)
was last renewed. -o json|yaml have them as maxHolders and permits.

-o wide adds the holder's claim, the lease's TTL and the user the hold is
bound to. -o json|yaml print the locks as a list; jsonpath and go-template
see them as kubectl get's do, a List with the locks as items. -o name prints
each lock's Lease (lease.coordination.k8s.io/LOCK). When there is no lock,
status says so on stderr, as kubectl get does.`,
		Example: `  kubectl fence status -n reports
  kubectl fence status -A -o wide
  kubectl fence status -n reports report-2026-07 -o json
  kubectl fence status -n reports report-2026-07 -o jsonpath='{.items[0].epoch}'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageError(cmd, "at most one LOCK, got %d arguments: %q", len(args), args)
			}
			if len(args) == 1 {
				if allNamespaces {
					return usageError(cmd, "a LOCK cannot be looked up across all namespaces: drop -A and pass -n NAMESPACE")
				}
				return validLock(args[0])
			}
			return nil
		},
		PreRunE: func(*cobra.Command, []string) error { return pf.validate() },
		RunE: func(cmd *cobra.Command, args []string) error {
			_, c, ns, err := o.clients()
			if err != nil {
				return err
			}
			if allNamespaces {
				ns = "" // kubectl: -A ignores -n
			}
			only := ""
			if len(args) == 1 {
				only = args[0]
			}
			locks, err := collectStatus(cmd.Context(), c, ns, only)
			if err != nil {
				return err
			}
			if only != "" && len(locks) == 0 {
				return fmt.Errorf("no such lock %s/%s: no FencedLease names it and no Lease records it", ns, only)
			}
			names := make([]runtime.Object, len(locks))
			for i, l := range locks {
				names[i] = lockObject(l.Namespace, l.Lock)
			}
			return pf.print(o.streams.Out, printed{data: locks, names: names, text: func(wide bool) {
				if len(locks) == 0 {
					// As kubectl get: nothing on stdout, and on stderr where it looked.
					if allNamespaces {
						out(o.streams.ErrOut, "No locks found\n")
					} else {
						out(o.streams.ErrOut, "No locks found in %s namespace.\n", ns)
					}
					return
				}
				printTable(o, locks, allNamespaces, wide)
			}})
		},
	}
	cmd.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false,
		"List the locks of every namespace (the namespace of -n or of the current context is ignored).")
	pf.addFlags(cmd, "a table")
	return cmd
}

// printTable prints the locks as a table: with a NAMESPACE column for -A,
// and with wide, the holder's claim, the lease's TTL and the user the hold
// is bound to.
func printTable(o *options, locks []lockStatus, withNamespace, wide bool) {
	tw := tabwriter.NewWriter(o.streams.Out, 0, 4, 2, ' ', 0)
	header := "LOCK\tHOLDER\tEPOCH\tHELD FOR\tTTL LEFT\tQUEUE\tOLDEST WAIT"
	if withNamespace {
		header = "NAMESPACE\t" + header
	}
	if wide {
		header += "\tCLAIM\tTTL\tUSER"
	}
	fmt.Fprintln(tw, header)
	for _, l := range locks {
		holder, held, left, oldest := l.Holder, orDash(l.HeldFor), orDash(l.TTLLeft), orDash(l.OldestWait)
		claim, ttl, user := orDash(l.Claim), orDash(l.TTL), orDash(l.HolderUser)
		switch {
		case l.Conflict != "":
			holder, held, left = conflictHolder, "-", "-"
		case l.MaxHolders > 1:
			holder, held, left = fmt.Sprintf("<%d of %d permits>", len(l.Permits), l.MaxHolders), "-", "-"
		case holder == "":
			holder, held, left = "<free>", "-", "-"
		}
		if withNamespace {
			fmt.Fprintf(tw, "%s\t", l.Namespace)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d waiting %v\t%s", l.Lock, holder, l.Epoch, held, left, l.QueueLength, l.Queue, oldest)
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s", claim, ttl, user)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	// A semaphore's permits, each with its holder and epoch: below the
	// table, one block per lock.
	for _, l := range locks {
		if l.MaxHolders <= 1 || l.Conflict != "" {
			continue
		}
		lock := l.Lock
		if withNamespace {
			lock = l.Namespace + "/" + l.Lock
		}
		out(o.streams.Out, "\n%s: %d of %d permits held\n", lock, len(l.Permits), l.MaxHolders)
		if len(l.Permits) == 0 {
			continue
		}
		pw := tabwriter.NewWriter(o.streams.Out, 0, 4, 2, ' ', 0)
		header := "  EPOCH\tHOLDER\tCLAIM\tHELD FOR\tTTL LEFT\tRENEWED"
		if wide {
			header += "\tTTL\tUSER"
		}
		fmt.Fprintln(pw, header)
		for _, p := range l.Permits {
			fmt.Fprintf(pw, "  %d\t%s\t%s\t%s\t%s\t%s", p.Epoch, p.Holder, p.Claim, orDash(p.HeldFor), orDash(p.TTLLeft), orDash(p.RenewTime))
			if wide {
				fmt.Fprintf(pw, "\t%s\t%s", orDash(p.TTL), orDash(p.HolderUser))
			}
			fmt.Fprintln(pw)
		}
		_ = pw.Flush()
	}
	// The reasons are long: below the table, so its columns stay readable.
	for _, l := range locks {
		if l.Conflict != "" {
			lock := l.Lock
			if withNamespace {
				lock = l.Namespace + "/" + l.Lock
			}
			out(o.streams.Out, "\n%s: %s: %s\n", lock, fkv1.ReasonLockConflict, l.Conflict)
		}
	}
}

// collectStatus reads the locks of namespace ns (all namespaces: ""), or
// lock only.
func collectStatus(ctx context.Context, c client.Client, ns, only string) ([]lockStatus, error) {
	var claims fkv1.FencedLeaseList
	if err := c.List(ctx, &claims, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	byLock := map[types.NamespacedName][]fkv1.FencedLease{}
	for _, cl := range claims.Items {
		if only == "" || cl.Spec.LockName == only {
			key := types.NamespacedName{Namespace: cl.Namespace, Name: cl.Spec.LockName}
			byLock[key] = append(byLock[key], cl)
		}
	}
	if key := (types.NamespacedName{Namespace: ns, Name: only}); only != "" && byLock[key] == nil {
		byLock[key] = nil // a lock may exist with no claims left
	}
	out := []lockStatus{} // -o json prints [] for none, not null
	for key, cls := range byLock {
		ns, lock := key.Namespace, key.Name
		st := lockStatus{Namespace: ns, Lock: lock, Queue: []string{}}
		var l coordinationv1.Lease
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &l)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		led := fkv1.ReadLedger(&l, lock)
		switch {
		case err == nil && led.Exists && (led.IsSemaphore() || len(led.Permits) > 0):
			st.Epoch, st.MaxHolders = led.Epoch, ledgerCapacity(led)
			if st.Permits, err = permitsOf(ctx, c, ns, lock, led.Permits); err != nil {
				return nil, err
			}
		case err == nil && led.Exists:
			st.Epoch, st.MaxHolders = led.Epoch, ledgerCapacity(led)
			if led.Held() && led.HolderIdentity != "" {
				st.Holder, st.Claim, st.HolderUser = led.HolderIdentity, led.HolderClaim, led.HolderUser
				if led.LeaseDurationSeconds > 0 {
					st.TTL = (time.Duration(led.LeaseDurationSeconds) * time.Second).String()
				}
				if l.Spec.RenewTime != nil && led.LeaseDurationSeconds > 0 {
					// A wall-clock estimate; the authority decides on its own clock.
					left := time.Until(l.Spec.RenewTime.Add(time.Duration(led.LeaseDurationSeconds) * time.Second))
					st.TTLLeft = fmt.Sprintf("~%s", left.Round(time.Second))
				}
				if l.Spec.AcquireTime != nil {
					st.HeldFor = fmt.Sprintf("~%s", time.Since(l.Spec.AcquireTime.Time).Round(time.Second))
				}
			}
		case err == nil:
			// A Lease fencekeeper does not manage holds the lock's name: the
			// controller grants nobody while it exists.
			st.Conflict = conflictReason(ns, lock, cls)
		case len(cls) == 0:
			continue
		}
		sort.Slice(cls, func(i, j int) bool {
			if !cls[i].CreationTimestamp.Equal(&cls[j].CreationTimestamp) {
				return cls[i].CreationTimestamp.Before(&cls[j].CreationTimestamp)
			}
			return cls[i].Name < cls[j].Name
		})
		for _, cl := range cls {
			if cl.Status.Phase == fkv1.PhasePending || cl.Status.Phase == "" {
				if len(st.Queue) == 0 {
					st.OldestWait = fmt.Sprintf("~%s", time.Since(cl.CreationTimestamp.Time).Round(time.Second))
				}
				st.Queue = append(st.Queue, cl.Spec.HolderIdentity)
			}
		}
		st.QueueLength = len(st.Queue)
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Lock < out[j].Lock
	})
	return out, nil
}

// permitsOf is the status of each permit: its entry, and the times its
// renewal Lease shows (one read per permit; at most 100).
func permitsOf(ctx context.Context, c client.Client, ns, lock string, ps []fkv1.Permit) ([]permitStatus, error) {
	out := make([]permitStatus, 0, len(ps))
	for _, p := range ps {
		st := permitStatus{Epoch: p.Epoch, Holder: p.Holder, Claim: p.Claim, HolderUser: p.User}
		if p.TTL > 0 {
			st.TTL = (time.Duration(p.TTL) * time.Second).String()
		}
		var pl coordinationv1.Lease
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: fkv1.PermitLeaseName(lock, p.Epoch)}, &pl)
		switch {
		case apierrors.IsNotFound(err):
			// Created right after the grant: not yet.
		case err != nil:
			return nil, err
		default:
			ttl := time.Duration(p.TTL) * time.Second
			if pl.Spec.LeaseDurationSeconds != nil && *pl.Spec.LeaseDurationSeconds > 0 {
				ttl = time.Duration(*pl.Spec.LeaseDurationSeconds) * time.Second
			}
			if pl.Spec.RenewTime != nil {
				st.RenewTime = pl.Spec.RenewTime.UTC().Format(time.RFC3339)
				if ttl > 0 {
					st.TTLLeft = fmt.Sprintf("~%s", time.Until(pl.Spec.RenewTime.Add(ttl)).Round(time.Second))
				}
			}
			if pl.Spec.AcquireTime != nil {
				st.HeldFor = fmt.Sprintf("~%s", time.Since(pl.Spec.AcquireTime.Time).Round(time.Second))
			}
		}
		out = append(out, st)
	}
	return out, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// conflictReason is the controller's LockConflict message on a waiting
// claim, or, before the controller has written one, the same facts.
func conflictReason(ns, lock string, cls []fkv1.FencedLease) string {
	for _, cl := range cls {
		if c := meta.FindStatusCondition(cl.Status.Conditions, fkv1.ConditionLockConflict); c != nil && c.Status == metav1.ConditionTrue {
			return c.Message
		}
	}
	return fmt.Sprintf("Lease %s/%s exists and is not managed by fencekeeper (no label %s=%s); "+
		"fencekeeper will not overwrite it: delete it or use another lock name",
		ns, lock, fkv1.LabelManagedBy, fkv1.ManagedByValue)
}

package fencecli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// ExitLeaseLost is run's exit code when the lease was lost while COMMAND
// ran (75, EX_TEMPFAIL of sysexits.h: the work did not finish, try again),
// whatever COMMAND exited with after the signal.
const ExitLeaseLost = 75

var signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP,
	"SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGQUIT": syscall.SIGQUIT,
}

func newRunCommand(o *options) *cobra.Command {
	f := &acquireFlags{}
	var sigName string
	var grace time.Duration
	var sig syscall.Signal
	cmd := &cobra.Command{
		Use:   "run LOCK[,LOCK...] [flags] -- COMMAND [ARGS...]",
		Short: "Hold the lock (or several) while COMMAND runs",
		Long: `run waits for LOCK, then runs COMMAND while renewing the lease. COMMAND sees
FENCEKEEPER_EPOCH, FENCEKEEPER_LOCK, FENCEKEEPER_HOLDER, FENCEKEEPER_CLAIM,
FENCEKEEPER_NAMESPACE and FENCEKEEPER_EPOCH_<LOCK> (below); it must stamp
FENCEKEEPER_EPOCH on its writes to fenced objects. If the lease is lost,
COMMAND and the processes below it get --signal, then SIGKILL after --grace
(run waits for them), and run says who holds the lock now. When COMMAND
exits the lock is released.

Several locks, LOCK1,LOCK2,... (comma-separated, no spaces): run takes them
one at a time in one order that every caller shares, sorted by name
whatever order they are given in, so two runs that ask for a,b and b,a
cannot deadlock. COMMAND runs once it holds all of them; the loss of any
one is the loss of all (COMMAND is signalled as above, exit 75), and all
are released when COMMAND exits, in reverse order. If one is not granted,
those taken before it are released and COMMAND does not run. The flags
--wait and --no-wait apply to the whole set: --wait D is one deadline for
all the locks (each claim gets what is left of it); with --no-wait each
lock is asked for once.

--max-holders N (2 to 100) holds a permit of a semaphore instead: up to N
holders run at once, each with its own epoch in FENCEKEEPER_EPOCH; every
claim of a lock must ask for the same N. With several locks it applies to
each of them.

Each lock's epoch is in FENCEKEEPER_EPOCH_<LOCK>: the lock name upper-cased
with '-' and '.' as '_' (report-2026-07 is FENCEKEEPER_EPOCH_REPORT_2026_07);
two locks whose names map to one variable (a-b and a.b) cannot be run
together. FENCEKEEPER_EPOCH, FENCEKEEPER_LOCK and FENCEKEEPER_CLAIM name one
lock and are set only when there is one; FENCEKEEPER_HOLDER and
FENCEKEEPER_NAMESPACE always are.

Exit codes:
  COMMAND's own   COMMAND exited while the lease was held (128+N when signal N ended it)
  75              the lease was lost while COMMAND ran (EX_TEMPFAIL), whatever COMMAND then exited with
  73              not acquired, COMMAND not run: --no-wait found the lock taken, or --wait ran out
  1               run failed itself: bad flags, no cluster, no decision from the authority

--wait D bounds the wait on the server too: the claim's acquireTimeoutSeconds
is D rounded up to whole seconds, so the authority ends the claim if it is
still waiting then, even if run was killed meanwhile (a killed run never
gets the lock, and the waiters behind it do not wait for it). --no-wait
tries once: the lock at the authority's first decision, or exit 73.`,
		Example: `  kubectl fence run -n reports report-2026-07 --holder W1 --ttl 30s -- ./publish-report.sh
  kubectl fence run -n reports report-2026-07 -- sh -c 'echo "epoch $FENCEKEEPER_EPOCH"'
  kubectl fence run -n reports report-2026-07 --no-wait -- ./publish-report.sh
  kubectl fence run -n reports warehouse --max-holders 3 -- ./pick-orders.sh
  kubectl fence run -n reports report-2026-07,ledger-2026-07 --wait 1m -- \
    sh -c 'echo "report $FENCEKEEPER_EPOCH_REPORT_2026_07, ledger $FENCEKEEPER_EPOCH_LEDGER_2026_07"'`,
		Args: runArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			var ok bool
			if sig, ok = signals[sigName]; !ok {
				return fmt.Errorf("unknown --signal %q: use one of %v", sigName, sets.List(sets.KeySet(signals)))
			}
			if grace < 0 {
				return fmt.Errorf("--grace %v: want 0 (SIGKILL at once) or a positive duration such as 10s", grace)
			}
			return f.validate(cmd)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			locks := splitLocks(args[0])
			lc, c, ns, err := o.clients()
			if err != nil {
				return err
			}
			sigCtx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := f.context(sigCtx)
			defer cancel()
			set, err := lc.AcquireAll(ctx, locks, f.holder, f.options())
			if err != nil {
				return f.setWaitFailed(ctx, c, ns, locks, err)
			}
			stop() // from here on, signals go to the child
			return runHeld(o, c, set, ns, args[1:], sigName, sig, grace)
		},
	}
	f.bind(cmd)
	cmd.Flags().StringVar(&sigName, "signal", "SIGTERM", "Signal sent to COMMAND when the lease is lost.")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "After --signal, how long before SIGKILL (not negative).")
	return cmd
}

// runArgs wants exactly LOCK (or LOCK1,LOCK2,...) before "--" and a
// COMMAND after it. The "--" keeps COMMAND's own flags away from ours.
func runArgs(cmd *cobra.Command, args []string) error {
	dash := cmd.ArgsLenAtDash()
	switch {
	case len(args) == 0:
		return usageError(cmd, "missing LOCK and COMMAND")
	case dash < 0:
		return usageError(cmd, "missing \"--\" before COMMAND (got %q)", args)
	case dash == 0:
		return usageError(cmd, "missing LOCK before \"--\"")
	case dash > 1:
		return usageError(cmd, "one LOCK only before \"--\", got %q; to hold several locks, join them with commas: %s",
			args[:dash], strings.Join(args[:dash], ","))
	case len(args) == 1:
		return usageError(cmd, "missing COMMAND after \"--\"")
	}
	return validLocks(args[0])
}

// splitLocks is the locks of run's LOCK argument: LOCK1,LOCK2,...
func splitLocks(arg string) []string { return strings.Split(arg, ",") }

// validLocks checks run's LOCK argument before any request: every name
// valid (the bad one named), none twice, and no two that export one
// FENCEKEEPER_EPOCH_<LOCK>.
func validLocks(arg string) error {
	locks := splitLocks(arg)
	if len(locks) == 1 {
		return validLock(locks[0]) // as before several locks could be given
	}
	for i, lock := range locks {
		if lock == "" {
			return fmt.Errorf("invalid LOCK %q: lock %d of %d is empty (separate lock names with single commas, no spaces)", arg, i+1, len(locks))
		}
	}
	order, err := lease.AcquisitionOrder(locks)
	if err != nil {
		return fmt.Errorf("invalid LOCK %q: %w", arg, err)
	}
	byVar := map[string]string{}
	for _, lock := range order {
		v := EpochVar(lock)
		if other, ok := byVar[v]; ok {
			return fmt.Errorf("invalid LOCK %q: locks %q and %q would both export %s (the variable name has '_' for '-' and '.'): run them apart", arg, other, lock, v)
		}
		byVar[v] = lock
	}
	return nil
}

// EpochVar is the environment variable in which `run` passes lock's epoch
// to COMMAND: FENCEKEEPER_EPOCH_ and the lock name upper-cased, with the
// characters a lock name may have and an environment variable name may
// not, '-' and '.', as '_': report-2026-07 is
// FENCEKEEPER_EPOCH_REPORT_2026_07, ledger.v2 FENCEKEEPER_EPOCH_LEDGER_V2.
// (Lock names are lowercase letters, digits, '-' and '.'; the prefix makes
// a name starting with a digit a valid variable too.)
func EpochVar(lock string) string {
	return "FENCEKEEPER_EPOCH_" + strings.Map(func(r rune) rune {
		switch {
		case r == '-' || r == '.':
			return '_'
		case 'a' <= r && r <= 'z':
			return r - 'a' + 'A'
		}
		return r
	}, lock)
}

// oneLockVars are the variables that name one lock: run sets them only
// when it holds one, and with several does not pass on those of its own
// environment (a run inside another's COMMAND) either.
var oneLockVars = []string{"FENCEKEEPER_EPOCH", "FENCEKEEPER_LOCK", "FENCEKEEPER_CLAIM"}

// runEnv is COMMAND's environment: environ (run's own) and what run adds.
// One lock: FENCEKEEPER_EPOCH, _LOCK, _HOLDER, _CLAIM, _NAMESPACE as
// always, and FENCEKEEPER_EPOCH_<LOCK>. Several: FENCEKEEPER_EPOCH_<LOCK>
// for each, FENCEKEEPER_HOLDER and FENCEKEEPER_NAMESPACE (the same for
// every lock of the set).
func runEnv(environ []string, ns, holder string, leases []*lease.Lease) []string {
	env := slices.Clone(environ)
	if len(leases) == 1 {
		l := leases[0]
		return append(env,
			"FENCEKEEPER_EPOCH="+strconv.FormatInt(l.Epoch, 10),
			"FENCEKEEPER_LOCK="+l.Lock,
			"FENCEKEEPER_HOLDER="+holder,
			"FENCEKEEPER_CLAIM="+l.ClaimName,
			"FENCEKEEPER_NAMESPACE="+ns,
			EpochVar(l.Lock)+"="+strconv.FormatInt(l.Epoch, 10),
		)
	}
	env = slices.DeleteFunc(env, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(oneLockVars, name)
	})
	for _, l := range leases {
		env = append(env, EpochVar(l.Lock)+"="+strconv.FormatInt(l.Epoch, 10))
	}
	return append(env, "FENCEKEEPER_HOLDER="+holder, "FENCEKEEPER_NAMESPACE="+ns)
}

// setWaitFailed is waitFailed for AcquireAll's error, which names the lock
// not taken. With one lock it says exactly what waitFailed says; with
// several it adds what became of the locks taken before.
func (f *acquireFlags) setWaitFailed(ctx context.Context, c client.Client, ns string, locks []string, err error) error {
	var le *lease.LockError
	if !errors.As(err, &le) {
		return err
	}
	if len(locks) == 1 {
		return f.waitFailed(ctx, c, ns, le.Lock, le.Err)
	}
	if errors.Is(le.Err, lease.ErrLost) {
		// A lock taken was lost while run waited for a later one.
		return fmt.Errorf("%w; run gave up waiting for the other locks: COMMAND not run", le)
	}
	order, _ := lease.AcquisitionOrder(locks) // checked in runArgs
	var before []string
	for _, lock := range order {
		if lock == le.Lock {
			break
		}
		before = append(before, ns+"/"+lock)
	}
	released := ""
	switch {
	case le.ReleaseErr != nil:
		released = fmt.Sprintf("; releasing the locks taken before it failed: %v", le.ReleaseErr)
	case len(before) == 1:
		released = "; lock " + before[0] + ", taken before it, was released"
	case len(before) > 1:
		released = "; locks " + strings.Join(before, ", ") + ", taken before it, were released"
	}
	failed := f.waitFailed(ctx, c, ns, le.Lock, le.Err)
	var na notAcquired
	if errors.As(failed, &na) {
		return notAcquired{fmt.Errorf("%w%s", na.err, released)}
	}
	return fmt.Errorf("%w%s", failed, released)
}

// runHeld runs the command while set is held: one lock, or several that
// stand and fall together.
func runHeld(o *options, c client.Client, set *lease.Set, ns string, argv []string, sigName string, sig syscall.Signal, grace time.Duration) error {
	leases := set.Leases()
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, o.streams.Out, o.streams.ErrOut
	child.SysProcAttr = childProcAttr(sig)
	child.Env = runEnv(os.Environ(), ns, set.Holder(), leases)
	if err := child.Start(); err != nil {
		_ = set.Release(context.Background())
		return fmt.Errorf("starting %s: %w", argv[0], err)
	}
	held := make([]string, len(leases))
	for i, l := range leases {
		held[i] = fmt.Sprintf("%s/%s with epoch %d (claim %s)", ns, l.Lock, l.Epoch, l.ClaimName)
		if l.MaxHolders > 1 {
			held[i] = fmt.Sprintf("a permit of %s/%s with epoch %d (claim %s, capacity %d)", ns, l.Lock, l.Epoch, l.ClaimName, l.MaxHolders)
		}
	}
	out(o.streams.ErrOut, "kubectl-fence: holding %s; running %s\n", strings.Join(held, ", "), argv[0])
	// Recorded before anything waits for it, so before its ID can be reused.
	command, _ := processOf(child.Process.Pid)

	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	forward := make(chan os.Signal, 1)
	signal.Notify(forward, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(forward)

	var waitErr error
	// done is set to nil once handled: a closed channel stays ready, and the
	// loop would spin until the child exits.
	// The set's Done closes when any of its leases ends.
	done := set.Done()
	// lostTree is what ran under the command when the lease was lost; it
	// must be gone by killAt.
	var lostTree []process
	var killAt time.Time
	lost := false
loop:
	for {
		select {
		case waitErr = <-exited:
			break loop
		case s := <-forward:
			// To the command only: in a terminal its group got it already.
			_ = child.Process.Signal(s)
		case <-done:
			done = nil
			l := firstLost(leases)
			if l == nil {
				continue
			}
			lost = true
			// Everything the command started holds the epoch too. What is
			// found now, and what it starts meanwhile, is killed after the
			// grace period even once the command itself is gone (its
			// orphans no longer show below it).
			lostTree, killAt = below([]process{command}), time.Now().Add(grace)
			// The signal first: who holds the lock now is only news.
			signalTree(lostTree, sig)
			go func(tree []process) {
				time.Sleep(grace)
				signalTree(below(tree), syscall.SIGKILL) // with what they started since
			}(lostTree)
			holder := "current holder unknown"
			if l.Remaining() > 0 {
				// The apiserver told us (the claim was deleted, expired or
				// replaced): it answers, so ask it who holds the lock now.
				// Lost by our own clock, it may well not answer.
				holder = holderNow(c, l)
			}
			others := ""
			switch n := len(lostTree) - 1; {
			case n == 1:
				others = " and 1 process below it"
			case n > 1:
				others = fmt.Sprintf(" and %d processes below it", n)
			}
			out(o.streams.ErrOut, "kubectl-fence: lease on %s/%s lost (epoch %d, %s); sending %s to %d (%s)%s\n",
				ns, l.Lock, l.Epoch, holder, sigName, child.Process.Pid, argv[0], others)
		}
	}
	relCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// All of the set, in reverse order, the lost ones included (their
	// claims are deleted by UID).
	if err := set.Release(relCtx); err != nil {
		out(o.streams.ErrOut, "kubectl-fence: %v\n", err)
	} else if lost && len(leases) > 1 {
		out(o.streams.ErrOut, "kubectl-fence: released %s\n", strings.Join(lockNames(ns, leases), ", "))
	}
	// The command is gone; what it started may not be (a script killed by
	// the signal leaves its programs to init): they get the grace period
	// too, then SIGKILL, before run exits.
	if lost {
		for anyRunning(below(lostTree)) && time.Now().Before(killAt) {
			time.Sleep(50 * time.Millisecond)
		}
		signalTree(below(lostTree), syscall.SIGKILL)
		out(o.streams.ErrOut, "kubectl-fence: %s %s after the lease was lost; exit code %d (lease lost)\n", argv[0], howEnded(waitErr), ExitLeaseLost)
		return exitCode(ExitLeaseLost)
	}
	var ee *exec.ExitError
	switch {
	case waitErr == nil:
		return nil
	case errors.As(waitErr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return exitCode(128 + int(ws.Signal()))
		}
		return exitCode(ee.ExitCode())
	}
	return waitErr
}

// firstLost is the first of leases found lost, or nil.
func firstLost(leases []*lease.Lease) *lease.Lease {
	for _, l := range leases {
		if l.State() == lease.Lost {
			return l
		}
	}
	return nil
}

// lockNames are "ns/lock" for each of leases.
func lockNames(ns string, leases []*lease.Lease) []string {
	out := make([]string, len(leases))
	for i, l := range leases {
		out[i] = ns + "/" + l.Lock
	}
	return out
}

// howEnded says how the command ended, from its Wait error.
func howEnded(waitErr error) string {
	var ee *exec.ExitError
	switch {
	case waitErr == nil:
		return "exited with status 0"
	case errors.As(waitErr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was ended by " + signalName(ws.Signal())
		}
		return fmt.Sprintf("exited with status %d", ee.ExitCode())
	}
	return "ended: " + waitErr.Error()
}

// signalName is SIGTERM for syscall.SIGTERM (Go's String says "terminated").
func signalName(sig syscall.Signal) string {
	for name, s := range signals {
		if s == sig {
			return name
		}
	}
	return fmt.Sprintf("signal %d (%v)", int(sig), sig)
}

// holderNow says who holds the lock now that l is lost: "now held by H
// with epoch M", "now free", or "current holder unknown". The authority may
// not have moved on yet when the loss is seen (a deleted claim is seen at
// once): it looks again for a short while, not longer.
func holderNow(c client.Client, l *lease.Lease) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	said := "current holder unknown"
	_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var cur coordinationv1.Lease
		err := c.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: l.Lock}, &cur)
		switch {
		case apierrors.IsNotFound(err):
			said = "now free"
			return true, nil
		case err != nil:
			return false, nil //nolint:nilerr // an error would end the poll: try again until the deadline
		}
		led := fkv1.ReadLedger(&cur, l.Lock)
		switch {
		case !led.Exists:
			return true, nil // not fencekeeper's Lease: unknown
		case l.MaxHolders > 1:
			// A permit of a semaphore: the others may hold on.
			if p, ok := led.PermitOf(l.Epoch); ok && p.UID == l.UID {
				return false, nil // still ours: the authority has not moved on yet
			}
			if len(led.Permits) == 0 {
				said = "now no permit held"
			} else {
				said = fmt.Sprintf("now %d of %d permits held: %s", len(led.Permits), ledgerCapacity(led), permitList(led.Permits))
			}
		case led.HolderUID == l.UID:
			return false, nil // still ours: the authority has not moved on yet
		case !led.Held():
			said = "now free"
		case led.HolderIdentity != "":
			said = fmt.Sprintf("now held by %s with epoch %d", led.HolderIdentity, led.Epoch)
		default:
			said = fmt.Sprintf("now held by claim %s with epoch %d", led.HolderClaim, led.Epoch)
		}
		return true, nil
	})
	return said
}

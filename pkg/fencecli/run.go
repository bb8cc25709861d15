package fencecli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
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
		Use:   "run LOCK [flags] -- COMMAND [ARGS...]",
		Short: "Hold the lock while COMMAND runs",
		Long: `run waits for LOCK, then runs COMMAND while renewing the lease. COMMAND sees
FENCEKEEPER_EPOCH, FENCEKEEPER_LOCK, FENCEKEEPER_HOLDER, FENCEKEEPER_CLAIM and
FENCEKEEPER_NAMESPACE; it must stamp FENCEKEEPER_EPOCH on its writes to fenced
objects. If the lease is lost, COMMAND and the processes below it get
--signal, then SIGKILL after --grace (run waits for them), and run says who
holds the lock now. When COMMAND exits the lock is released.

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
  kubectl fence run -n reports report-2026-07 --no-wait -- ./publish-report.sh`,
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
			lc, c, ns, err := o.clients()
			if err != nil {
				return err
			}
			sigCtx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := f.context(sigCtx)
			defer cancel()
			l, err := lc.Acquire(ctx, args[0], f.holder, f.options())
			if err != nil {
				return f.waitFailed(ctx, c, ns, args[0], err)
			}
			stop() // from here on, signals go to the child
			return runHeld(o, c, l, ns, args[1:], sigName, sig, grace)
		},
	}
	f.bind(cmd)
	cmd.Flags().StringVar(&sigName, "signal", "SIGTERM", "Signal sent to COMMAND when the lease is lost.")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "After --signal, how long before SIGKILL (not negative).")
	return cmd
}

// runArgs wants exactly LOCK before "--" and a COMMAND after it. The "--"
// keeps COMMAND's own flags away from ours.
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
		return usageError(cmd, "one LOCK only before \"--\", got %q", args[:dash])
	case len(args) == 1:
		return usageError(cmd, "missing COMMAND after \"--\"")
	}
	return validLock(args[0])
}

func runHeld(o *options, c client.Client, l *lease.Lease, ns string, argv []string, sigName string, sig syscall.Signal, grace time.Duration) error {
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, o.streams.Out, o.streams.ErrOut
	child.SysProcAttr = childProcAttr(sig)
	child.Env = append(os.Environ(),
		"FENCEKEEPER_EPOCH="+strconv.FormatInt(l.Epoch, 10),
		"FENCEKEEPER_LOCK="+l.Lock,
		"FENCEKEEPER_HOLDER="+l.Holder,
		"FENCEKEEPER_CLAIM="+l.ClaimName,
		"FENCEKEEPER_NAMESPACE="+ns,
	)
	if err := child.Start(); err != nil {
		_ = l.Release(context.Background())
		return fmt.Errorf("starting %s: %w", argv[0], err)
	}
	out(o.streams.ErrOut, "kubectl-fence: holding %s/%s with epoch %d (claim %s); running %s\n", ns, l.Lock, l.Epoch, l.ClaimName, argv[0])
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
	done := l.Done()
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
			if l.State() != lease.Lost {
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
	if err := l.Release(relCtx); err != nil {
		out(o.streams.ErrOut, "kubectl-fence: %v\n", err)
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

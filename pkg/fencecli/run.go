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
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

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
--signal, then SIGKILL after --grace (run waits for them). When COMMAND
exits the lock is released, and run exits with COMMAND's exit code.`,
		Example: `  kubectl fence run -n reports report-2026-07 --holder W1 --ttl 30s -- ./publish-report.sh
  kubectl fence run -n reports report-2026-07 -- sh -c 'echo "epoch $FENCEKEEPER_EPOCH"'`,
		Args: runArgs,
		PreRunE: func(*cobra.Command, []string) error {
			var ok bool
			if sig, ok = signals[sigName]; !ok {
				return fmt.Errorf("unknown --signal %q: use one of %v", sigName, sets.List(sets.KeySet(signals)))
			}
			if grace < 0 {
				return fmt.Errorf("--grace %v: want 0 (SIGKILL at once) or a positive duration such as 10s", grace)
			}
			return f.validate()
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, _, ns, err := o.clients()
			if err != nil {
				return err
			}
			sigCtx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := f.context(sigCtx)
			defer cancel()
			l, err := lc.Acquire(ctx, args[0], f.holder, lease.Options{RequestID: f.requestID, TTL: f.ttl})
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("gave up waiting for lock %s/%s (left the queue): %w", ns, args[0], ctx.Err())
				}
				return err
			}
			stop() // from here on, signals go to the child
			return runHeld(o, l, ns, args[1:], sig, grace)
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

func runHeld(o *options, l *lease.Lease, ns string, argv []string, sig syscall.Signal, grace time.Duration) error {
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
			out(o.streams.ErrOut, "kubectl-fence: lease on %s/%s lost (epoch %d); sending %v to %s and what it started\n", ns, l.Lock, l.Epoch, sig, argv[0])
			// Everything the command started holds the epoch too. What is
			// found now, and what it starts meanwhile, is killed after the
			// grace period even once the command itself is gone (its
			// orphans no longer show below it).
			lostTree, killAt = below([]process{command}), time.Now().Add(grace)
			signalTree(lostTree, sig)
			go func(tree []process) {
				time.Sleep(grace)
				signalTree(below(tree), syscall.SIGKILL) // with what they started since
			}(lostTree)
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
	if lostTree != nil {
		for anyRunning(below(lostTree)) && time.Now().Before(killAt) {
			time.Sleep(50 * time.Millisecond)
		}
		signalTree(below(lostTree), syscall.SIGKILL)
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

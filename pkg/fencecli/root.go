// Package fencecli implements `kubectl fence`: acquire, run, status and
// release fencekeeper locks from a shell, the way `etcdctl lock` and
// `consul lock` work.
package fencecli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// Streams are the command's standard streams.
type Streams = genericclioptions.IOStreams

type options struct {
	flags   *genericclioptions.ConfigFlags
	streams Streams
}

// NewCommand returns the `kubectl fence` command tree.
func NewCommand(streams Streams) *cobra.Command {
	o := &options{flags: genericclioptions.NewConfigFlags(true), streams: streams}
	root := &cobra.Command{
		Use:   "kubectl-fence",
		Short: "Acquire, hold and inspect fencekeeper locks",
		Long: `kubectl fence works with fencekeeper locks: a FencedLease claim per holder,
granted one at a time with a strictly increasing epoch (fencing token).

Every write to an object fenced by the lock must carry the epoch
(annotation fencekeeper.io/epoch); the object refuses older epochs.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Usage lines and errors say what to type: "kubectl fence run ...".
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl fence"},
	}
	root.SetOut(streams.Out) // --help, for callers of Main other than the binary
	root.SetErr(streams.ErrOut)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w\nsee '%s --help'", err, cmd.CommandPath())
	})
	o.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(newAcquireCommand(o), newRunCommand(o), newStatusCommand(o), newReleaseCommand(o), newBreakCommand(o))
	return root
}

// Main runs the command and returns the process exit code.
func Main(args []string, streams Streams) int {
	cmd := NewCommand(streams)
	cmd.SetArgs(args)
	err := cmd.Execute()
	var exit exitCode
	if errors.As(err, &exit) {
		return int(exit)
	}
	var na notAcquired
	if errors.As(err, &na) {
		fmt.Fprintln(streams.ErrOut, "error:", na.Error())
		return ExitNotAcquired
	}
	if err != nil {
		fmt.Fprintln(streams.ErrOut, "error:", explain(err))
		return 1
	}
	return 0
}

// ExitNotAcquired is the exit code of acquire and run when the lock was not
// granted: --no-wait found it taken, or --wait ran out (73, EX_CANTCREAT of
// sysexits.h: the lock could not be taken). The authority ended the claim
// and the command deleted it: nothing is left in the queue. Other failures
// exit 1.
const ExitNotAcquired = 73

// notAcquired: the authority ended the claim without a grant (its
// acquireTimeoutSeconds); the command exits ExitNotAcquired.
type notAcquired struct{ err error }

func (e notAcquired) Error() string { return e.err.Error() }
func (e notAcquired) Unwrap() error { return e.err }

// exitCode is returned by `run` to pass the child's exit code through.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func (o *options) restConfig() (*rest.Config, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes connection (--kubeconfig, --context or KUBECONFIG): %w", err)
	}
	return cfg, nil
}

func (o *options) namespace() (string, error) {
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", err
	}
	return ns, nil
}

func (o *options) clients() (*lease.Client, client.WithWatch, string, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return nil, nil, "", err
	}
	ns, err := o.namespace()
	if err != nil {
		return nil, nil, "", err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return nil, nil, "", err
	}
	return lease.NewClientFrom(c, ns), c, ns, nil
}

// explain turns common API errors into what to do about them.
func explain(err error) string {
	switch {
	case lease.FencingReason(err) != "":
		return err.Error() // a fencing refusal says what to do itself
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("%v\n(RBAC: your user needs create/get/watch/delete on fencedleases.fencekeeper.io and get/watch/update on leases in this namespace; a semaphore's holders renew the Leases LOCK-permit-EPOCH)", err)
	case meta.IsNoMatchError(err):
		return fmt.Sprintf("%v\n(is fencekeeper installed? the FencedLease CRD was not found)", err)
	}
	return err.Error()
}

func out(w io.Writer, format string, args ...any) { fmt.Fprintf(w, format, args...) }

// holderDefault documents defaultHolder in every command's --holder help.
const holderDefault = "Default: $POD_NAME if set (downward API), else the hostname; " +
	"the same on every call, so 'release --lock' finds the claim."

// defaultHolder is the same for every call from one pod or machine (not
// per process): a later `release --lock X` must find the claim an earlier
// `acquire X` made without --holder.
func defaultHolder() string {
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return pod
	}
	h, _ := os.Hostname()
	return h
}

package fencecli

import (
	"fmt"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func newReleaseCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "release CLAIM",
		Short: "Release a lock by deleting its claim (the exact one: UID precondition)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, c, ns, err := o.clients()
			if err != nil {
				return err
			}
			var cl fkv1.FencedLease
			if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: ns, Name: args[0]}, &cl); err != nil {
				if apierrors.IsNotFound(err) {
					return fmt.Errorf("no claim %s/%s (already released?)", ns, args[0])
				}
				return err
			}
			if err := c.Delete(cmd.Context(), &cl, client.Preconditions{UID: &cl.UID}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			out(o.streams.Out, "released %s/%s (lock %s, epoch %d)\n", ns, cl.Name, cl.Spec.LockName, cl.Status.Epoch)
			return nil
		},
	}
}

package demokit

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// Connect opens the local control plane at kubeconfig and creates a fresh
// namespace prefix-<time> for one demo run. cleanup removes what it can
// (the local control plane runs no namespace controller, and fenced objects
// refuse unmarked deletes: they stay until dev-down).
func Connect(kubeconfig, prefix string) (c client.WithWatch, ns string, cleanup func(), err error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, "", nil, fmt.Errorf("no local control plane: run 'make dev-up' first: %w", err)
	}
	if c, err = client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()}); err != nil {
		return nil, "", nil, err
	}
	ns = fmt.Sprintf("%s-%d", prefix, time.Now().Unix())
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, "", nil, fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	cleanup = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.DeleteAllOf(ctx, &fkv1.FencedLease{}, client.InNamespace(ns))
		_ = c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(ns))
		_ = c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	return c, ns, cleanup, nil
}

// Start runs this executable again with args (a demo's process role) and
// adds the events it prints to t; its standard error goes to stderr (nil:
// discarded).
func (t *Timeline) Start(stderr io.Writer, args ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go t.Follow(stdout)
	return cmd, nil
}

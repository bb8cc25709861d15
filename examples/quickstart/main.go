// Command quickstart holds the lock report-2026-07 in the namespace reports,
// computes the month's report while it holds the lock, and publishes it to
// the ConfigMap report-2026-07 with its epoch. If a newer holder took over
// meanwhile, the ConfigMap refuses the write and the result is discarded.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	cfg, err := config.GetConfig() // --kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config
	if err != nil {
		return err
	}
	holders, err := lease.NewClient(cfg, "reports")
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return err
	}

	wait, cancel := context.WithTimeout(ctx, time.Minute) // how long to wait in the queue
	l, err := holders.Acquire(wait, "report-2026-07", "W1", lease.Options{
		RequestID: "monthly-report-2026-07", // a retry after a lost reply finds the same claim
		TTL:       30 * time.Second,
	})
	cancel() // the lease does not depend on it: it is renewed until released or lost
	if err != nil {
		return err // the wait ran out: the claim was deleted, the queue left
	}
	defer func() {
		// Deletes this exact claim (UID precondition); ErrReleaseUncertain
		// means the reply was lost: the claim is gone or will expire.
		if err := l.Release(context.Background()); err != nil {
			log.Print(err)
		}
	}()
	log.Printf("holding lock %s with epoch %d", l.Lock, l.Epoch) // Epoch is a field

	result, err := compute(l.Context()) // l.Context() is cancelled when the lease is lost
	if err != nil {
		return err
	}

	// Publish: Create and Update stamp the lock label and the epoch on the
	// object, and the object refuses the write if a newer epoch is current.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "reports", Name: "report-2026-07"}}
	err = c.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	cm.Data = map[string]string{"report.csv": result}
	switch {
	case apierrors.IsNotFound(err):
		err = l.Create(ctx, c, cm)
	case err == nil:
		err = l.Update(ctx, c, cm)
	}
	if errors.Is(err, lease.ErrStaleEpoch) {
		log.Print("a newer holder owns the report: result discarded")
		return nil
	}
	if err != nil {
		return err
	}
	log.Printf("published report-2026-07 with epoch %d", l.Epoch)
	return nil
}

// compute stands for the real work: it stops when ctx is cancelled.
func compute(ctx context.Context) (string, error) {
	select {
	case <-ctx.Done():
		return "", fmt.Errorf("lease lost before the report was done: %w", ctx.Err())
	case <-time.After(3 * time.Second):
		return "month,total\n2026-07,42\n", nil
	}
}

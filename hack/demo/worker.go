package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/hack/internal/demokit"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// worker is one report worker built on pkg/lease: acquire, read, compute,
// publish with the epoch, and react to loss.
func worker(kubeconfig, ns, name, lock string, ttl, compute time.Duration, holdUntilSignal bool) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return err
	}
	ctx := context.Background()
	demokit.Emit(name, "acquiring", 0, "lock "+lock)
	l, err := lease.NewClientFrom(c, ns).Acquire(ctx, lock, name, lease.Options{
		RequestID: name + "-" + lock, TTL: ttl,
		OnTransition: func(t lease.Transition) {
			if t.To == lease.Suspect || t.To == lease.Lost {
				demokit.Emit(name, "state "+string(t.To), 0, t.Reason)
			}
		},
	})
	if err != nil {
		return err
	}
	demokit.Emit(name, "acquired", l.Epoch, "claim "+l.ClaimName)

	var cm corev1.ConfigMap
	err = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock}}
		demokit.Emit(name, "read", l.Epoch, "no report yet")
	case err != nil:
		return err
	default:
		demokit.Emit(name, "read", l.Epoch, "report says "+cm.Data["report.csv"])
	}
	result := fmt.Sprintf("report %s computed by %s", lock, name)
	// The lease is checked here, before the long computation: the design's
	// point is that this check cannot protect the write that follows. It
	// comes before "computing" is announced, since the demo pauses W1 on
	// that line (a pause before the check would fail it, not the write).
	if l.State() != lease.Held {
		return fmt.Errorf("lost the lease before computing")
	}
	demokit.Emit(name, "computing", l.Epoch, compute.String())
	time.Sleep(compute)

	err = publish(ctx, c, l, &cm, result)
	if errors.Is(err, lease.ErrStaleEpoch) {
		demokit.Emit(name, "publish rejected", l.Epoch, "stale_owner: "+apiMessage(err))
		select {
		case <-l.Done():
		case <-time.After(2 * ttl):
			return fmt.Errorf("the lease was not reported lost after the write was rejected")
		}
		demokit.Emit(name, "discarded result", l.Epoch, "lease state "+string(l.State()))
		return nil
	}
	if err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	demokit.Emit(name, "published", l.Epoch, result)
	if holdUntilSignal {
		s := make(chan os.Signal, 1)
		signal.Notify(s, syscall.SIGUSR1)
		<-s
	}
	if err := l.Release(ctx); err != nil {
		return err
	}
	demokit.Emit(name, "released", l.Epoch, "claim "+l.ClaimName)
	return nil
}

func apiMessage(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Message
	}
	return err.Error()
}

// publish writes the result from the copy read before computing, the way
// controllers do: a client.MergeFrom patch (no resourceVersion precondition)
// of that copy, stamped with the lease's epoch. Nothing but the fence stands
// between a paused owner and the report.
func publish(ctx context.Context, c client.Client, l *lease.Lease, read *corev1.ConfigMap, data string) error {
	if read.ResourceVersion == "" {
		cm := read.DeepCopy()
		cm.Data = map[string]string{"report.csv": data}
		return l.Create(ctx, c, cm)
	}
	cm := read.DeepCopy()
	cm.Data = map[string]string{"report.csv": data}
	return l.Patch(ctx, c, cm, client.MergeFrom(read))
}

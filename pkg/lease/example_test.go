package lease_test

import (
	"context"
	"errors"
	"log"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// A report worker: acquire by request ID, do the work under the lease's
// context, publish with the epoch, and treat a stale-epoch refusal as the
// signal to discard the result.
func Example() {
	cfg := config.GetConfigOrDie()
	holders, err := lease.NewClient(cfg, "reports")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // how long to wait in the queue
	l, err := holders.Acquire(ctx, "report-2026-07", "W1", lease.Options{
		RequestID: "monthly-report-2026-07", // a retry finds the same claim
		TTL:       30 * time.Second,
		OnTransition: func(t lease.Transition) {
			log.Printf("lease %s -> %s: %s", t.From, t.To, t.Reason)
		},
	})
	cancel()
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()

	work := l.Context() // cancelled when the lease is lost
	result := computeReport(work)

	var cm corev1.ConfigMap
	if err := c.Get(work, client.ObjectKey{Namespace: "reports", Name: "report-2026-07"}, &cm); err != nil {
		log.Print(err)
		return
	}
	cm.Data = map[string]string{"report.csv": result}
	switch err := l.Update(context.Background(), c, &cm); {
	case errors.Is(err, lease.ErrStaleEpoch):
		log.Printf("a newer holder owns the report; discarding my result")
	case err != nil:
		log.Print(err)
	}
}

func computeReport(ctx context.Context) string {
	select {
	case <-ctx.Done():
		return ""
	case <-time.After(time.Second):
		return "v12"
	}
}

// Stamp works on any object: typed, unstructured, or your own kinds.
func ExampleStamp() {
	cm := &corev1.ConfigMap{}
	lease.Stamp(cm, "report-2026-07", 42)
	_ = cm.Labels["fencekeeper.io/lock"]       // "report-2026-07"
	_ = cm.Annotations["fencekeeper.io/epoch"] // "42"
}

// TryAcquire asks once: the lock now, or ErrAcquireTimeout (the claim is
// gone again, nothing waits in the queue).
func ExampleClient_TryAcquire() {
	holders, err := lease.NewClient(config.GetConfigOrDie(), "reports")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // in case no authority answers
	l, err := holders.TryAcquire(ctx, "report-2026-07", "W1", lease.Options{TTL: 30 * time.Second})
	cancel() // the lease does not depend on it
	switch {
	case errors.Is(err, lease.ErrAcquireTimeout):
		log.Print("someone else has the report; skipping this run")
		return
	case err != nil:
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	_ = computeReport(l.Context())
}

// AcquireAll holds several locks at once: the report and the ledger it
// totals. Every caller takes them in one order (sorted by name), so a
// worker that asks for "ledger-2026-07", "report-2026-07" and one that asks
// for them the other way round cannot deadlock. Each lock has its own
// epoch: a write to an object fenced by a lock presents that lock's.
func ExampleClient_AcquireAll() {
	cfg := config.GetConfigOrDie()
	holders, err := lease.NewClient(cfg, "reports")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadline for the whole set
	set, err := holders.AcquireAll(ctx, []string{"report-2026-07", "ledger-2026-07"}, "W1", lease.Options{TTL: 30 * time.Second})
	cancel()
	if err != nil {
		log.Fatal(err) // a *lease.LockError names the lock; the ones taken before it were released
	}
	defer func() { _ = set.Release(context.Background()) }() // all of them, in reverse order
	log.Printf("holding %v", set.Epochs())                   // map[ledger-2026-07:41 report-2026-07:9]

	work := set.Context() // cancelled when ANY of the locks is lost
	result := computeReport(work)

	var cm corev1.ConfigMap
	if err := c.Get(work, client.ObjectKey{Namespace: "reports", Name: "report-2026-07"}, &cm); err != nil {
		log.Print(err)
		return
	}
	cm.Data = map[string]string{"report.csv": result}
	// The report's ConfigMap is fenced by the report's lock: its lease stamps it.
	if err := set.Lease("report-2026-07").Update(context.Background(), c, &cm); errors.Is(err, lease.ErrStaleEpoch) {
		log.Printf("a newer holder owns the report; discarding my result")
	}
}

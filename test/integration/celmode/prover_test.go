package celmode_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// TestProverAgainstAPIServer runs the proofs CEL mode orders its bindings
// by against a real apiserver: a probe proves a step only when every
// instance the kubernetes Service lists refuses it as it must (the
// expected rule, from the lock's own binding), sent to each instance
// directly. An instance that admits the probe (here a stand-in that has
// not loaded the binding) keeps the proof pending, whatever the others
// say.
func TestProverAgainstAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := envtestutil.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	prover := celmode.NewProver(cfg, c)

	// The envtest apiserver lists itself, at an address the prover reaches
	// (the certificate names 127.0.0.1, which the manager's config uses).
	var eps []string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		eps, err = prover.Endpoints(ctx)
		return err == nil && len(eps) == 1, nil
	}); err != nil {
		t.Fatalf("the kubernetes Service lists %v (%v), want the one apiserver", eps, err)
	}
	if host, _, _ := strings.Cut(eps[0], ":"); host != envtestutil.AdvertiseAddress() {
		t.Fatalf("endpoint %s, want the advertise address %s", eps[0], envtestutil.AdvertiseAddress())
	}

	guarded, err := webhook.ParseGuardedResources([]string{"configmaps"})
	if err != nil {
		t.Fatal(err)
	}
	policies, err := celmode.Render(celmode.Options{Guarded: guarded})
	if err != nil {
		t.Fatal(err)
	}
	if err := celmode.Install(ctx, c, policies); err != nil {
		t.Fatal(err)
	}
	const lock = "proof"
	withLease, withoutLease := namespace(ctx, t, c, "proof"), namespace(ctx, t, c, "proof-none")
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: withLease, Name: lock,
		Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock},
		Annotations: map[string]string{fkv1.AnnotationEpoch: "3"}}}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	b := celmode.Bindings(lock)
	inForce := celmode.FencingInForce(lock)

	// No binding: the probe is admitted, nothing is proven.
	if err := prover.Prove(ctx, inForce, []string{withLease}); !celmode.IsPending(err) || !strings.Contains(err.Error(), withLease+": accepted") {
		t.Fatalf("without the fencing binding: %v, want pending (accepted)", err)
	}

	// The validating bindings: proven once the apiserver enforces them.
	for _, o := range []client.Object{b.Validating, b.LeaseRequired} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	eventuallyProven(ctx, t, prover, inForce, withLease)
	// A refusal by another rule proves nothing: where the lock has no
	// Lease, the lease-required binding refuses the probe (NoLease), and
	// the fencing binding skips it.
	if err := prover.Prove(ctx, inForce, []string{withoutLease}); !celmode.IsPending(err) || !strings.Contains(err.Error(), "no params found") {
		t.Fatalf("probing where the lock has no Lease: %v, want pending (refused for another reason)", err)
	}

	// A second instance that has not loaded the binding: no proof until it
	// has (here: until it forwards to the apiserver that has).
	extra, err := envtestutil.StartExtraInstance(ctx, env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = extra.Stop(context.Background()) })
	if eps, err := prover.Endpoints(ctx); err != nil || len(eps) != 2 {
		t.Fatalf("endpoints with the extra instance: %v (%v)", eps, err)
	}
	err = prover.Prove(ctx, inForce, []string{withLease})
	var pending *celmode.PendingError
	if !errors.As(err, &pending) || len(pending.Reasons) != 1 || !strings.HasPrefix(pending.Reasons[0], extra.Addr+": ") || !strings.Contains(pending.Reasons[0], "accepted") {
		t.Fatalf("with a lagging instance: %v, want pending on %s only (accepted)", err, extra.Addr)
	}
	if extra.Requests.Load() == 0 {
		t.Fatal("the probe never reached the extra instance")
	}
	extra.SetLagging(false)
	eventuallyProven(ctx, t, prover, inForce, withLease)
	if err := extra.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Removal: the validating binding may go once no instance runs the
	// mutating one any more. While it does, the probe's malformed
	// watermark is removed and the fencing binding says MissingEpoch.
	gone := celmode.MutatingGone(lock)
	eventuallyProven(ctx, t, prover, gone, withLease)
	if err := c.Create(ctx, b.Mutating); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := prover.Prove(ctx, gone, []string{withLease})
		return celmode.IsPending(err) && strings.Contains(err.Error(), "fencekeeper.io/MissingEpoch"), nil
	}); err != nil {
		t.Fatalf("the mutating binding in force, the removal probe is still proven: %v", prover.Prove(ctx, gone, []string{withLease}))
	}
	if err := c.Delete(ctx, b.Mutating); err != nil {
		t.Fatal(err)
	}
	eventuallyProven(ctx, t, prover, gone, withLease)
}

func eventuallyProven(ctx context.Context, t *testing.T, prover celmode.Prover, probe celmode.Probe, ns string) {
	t.Helper()
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = prover.Prove(ctx, probe, []string{ns})
		if last != nil && !celmode.IsPending(last) {
			return false, last
		}
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%s is never proven: %v (last: %v)", probe.What, err, last)
	}
}

func namespace(ctx context.Context, t *testing.T, c client.Client, prefix string) string {
	t.Helper()
	ns, err := envtestutil.NewNamespace(ctx, c, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

package celmode_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

var _ = Describe("CEL mode's prover against a real apiserver", func() {
	// The proofs CEL mode orders its bindings by, against a real
	// apiserver: a probe proves a step only when every instance the
	// kubernetes Service lists refuses it as it must (the expected rule,
	// from the lock's own binding), sent to each instance directly. An
	// instance that admits the probe (here a stand-in that has not loaded
	// the binding) keeps the proof pending, whatever the others say.
	It("proves a step only when every instance refuses the probe by the expected rule", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		env, err := envtestutil.New()
		Expect(err).NotTo(HaveOccurred())
		cfg, err := env.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = env.Stop() })
		c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		prover := celmode.NewProver(cfg, c)

		By("the envtest apiserver lists itself, at an address the prover reaches " +
			"(the certificate names 127.0.0.1, which the manager's config uses)")
		var eps []string
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			eps, err = prover.Endpoints(ctx)
			return err == nil && len(eps) == 1, nil
		}); err != nil {
			Fail(fmt.Sprintf("the kubernetes Service lists %v (%v), want the one apiserver", eps, err))
		}
		host, _, _ := strings.Cut(eps[0], ":")
		Expect(host).To(Equal(envtestutil.AdvertiseAddress()), "endpoint %s, want the advertise address %s", eps[0], envtestutil.AdvertiseAddress())

		guarded, err := webhook.ParseGuardedResources([]string{"configmaps"})
		Expect(err).NotTo(HaveOccurred())
		policies, err := celmode.Render(celmode.Options{Guarded: guarded})
		Expect(err).NotTo(HaveOccurred())
		Expect(celmode.Install(ctx, c, policies)).To(Succeed())
		const lock = "proof"
		withLease, withoutLease := namespace(ctx, c, "proof"), namespace(ctx, c, "proof-none")
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: withLease, Name: lock,
			Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock},
			Annotations: map[string]string{fkv1.AnnotationEpoch: "3"}}}
		Expect(c.Create(ctx, lease)).To(Succeed())
		b := celmode.Bindings(lock)
		inForce := celmode.FencingInForce(lock)

		By("no binding: the probe is admitted, nothing is proven")
		if err := prover.Prove(ctx, inForce, []string{withLease}); !celmode.IsPending(err) || !strings.Contains(err.Error(), withLease+": accepted") {
			Fail(fmt.Sprintf("without the fencing binding: %v, want pending (accepted)", err))
		}

		By("the validating bindings: proven once the apiserver enforces them")
		for _, o := range []client.Object{b.Validating, b.LeaseRequired} {
			Expect(c.Create(ctx, o)).To(Succeed())
		}
		eventuallyProven(ctx, prover, inForce, withLease)
		By("a refusal by another rule proves nothing: where the lock has no Lease, the lease-required " +
			"binding refuses the probe (NoLease), and the fencing binding skips it")
		if err := prover.Prove(ctx, inForce, []string{withoutLease}); !celmode.IsPending(err) || !strings.Contains(err.Error(), "no params found") {
			Fail(fmt.Sprintf("probing where the lock has no Lease: %v, want pending (refused for another reason)", err))
		}

		By("a second instance that has not loaded the binding: no proof until it has " +
			"(here: until it forwards to the apiserver that has)")
		extra, err := envtestutil.StartExtraInstance(ctx, env, cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = extra.Stop(context.Background()) })
		if eps, err := prover.Endpoints(ctx); err != nil || len(eps) != 2 {
			Fail(fmt.Sprintf("endpoints with the extra instance: %v (%v)", eps, err))
		}
		err = prover.Prove(ctx, inForce, []string{withLease})
		var pending *celmode.PendingError
		if !errors.As(err, &pending) || len(pending.Reasons) != 1 || !strings.HasPrefix(pending.Reasons[0], extra.Addr+": ") || !strings.Contains(pending.Reasons[0], "accepted") {
			Fail(fmt.Sprintf("with a lagging instance: %v, want pending on %s only (accepted)", err, extra.Addr))
		}
		Expect(extra.Requests.Load()).NotTo(BeZero(), "the probe never reached the extra instance")
		extra.SetLagging(false)
		eventuallyProven(ctx, prover, inForce, withLease)
		Expect(extra.Stop(ctx)).To(Succeed())

		By("removal: the validating binding may go once no instance runs the mutating one any more; " +
			"while it does, the probe's malformed watermark is removed and the fencing binding says MissingEpoch")
		gone := celmode.MutatingGone(lock)
		eventuallyProven(ctx, prover, gone, withLease)
		Expect(c.Create(ctx, b.Mutating)).To(Succeed())
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := prover.Prove(ctx, gone, []string{withLease})
			return celmode.IsPending(err) && strings.Contains(err.Error(), "fencekeeper.io/MissingEpoch"), nil
		}); err != nil {
			Fail(fmt.Sprintf("the mutating binding in force, the removal probe is still proven: %v", prover.Prove(ctx, gone, []string{withLease})))
		}
		Expect(c.Delete(ctx, b.Mutating)).To(Succeed())
		eventuallyProven(ctx, prover, gone, withLease)
	})
})

func eventuallyProven(ctx context.Context, prover celmode.Prover, probe celmode.Probe, ns string) {
	GinkgoHelper()
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = prover.Prove(ctx, probe, []string{ns})
		if last != nil && !celmode.IsPending(last) {
			return false, last
		}
		return last == nil, nil
	}); err != nil {
		Fail(fmt.Sprintf("%s is never proven: %v (last: %v)", probe.What, err, last))
	}
}

func namespace(ctx context.Context, c client.Client, prefix string) string {
	GinkgoHelper()
	ns, err := envtestutil.NewNamespace(ctx, c, prefix)
	Expect(err).NotTo(HaveOccurred())
	return ns
}

// Admission cost in CEL enforcement mode: a second control plane whose
// fencing rules are the admission policies (webhook/celmode), the same
// interleaved guarded/unguarded updates as the webhook's figure, and the
// guarded update again with 10, 1,000 and 5,000 locks bound (the apiserver
// matches every binding of a policy against each request).
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8swait "k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

func celAdmission(ctx context.Context, n int, bindingCounts []int) (guarded, unguarded latency, byBindings map[string]latency, err error) {
	env, err := envtestutil.StartCELEnv(ctx, []string{"configmaps"})
	if err != nil {
		return guarded, unguarded, nil, err
	}
	defer func() { _ = env.Env.Stop() }()
	m, err := env.StartManager()
	if err != nil {
		return guarded, unguarded, nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = m.Stop()
		}
	}()
	cfg := rest.CopyConfig(env.Admin)
	cfg.QPS, cfg.Burst = 2000, 4000
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return guarded, unguarded, nil, err
	}
	a, err := setupAdmission(ctx, c, func(ns, epoch string) error {
		// The apiserver loads the lock's bindings asynchronously: wait until
		// a dry run presenting the epoch passes.
		return k8swait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			probe := celProbe(ns, epoch)
			return c.Create(ctx, probe, client.DryRunAll) == nil, nil
		})
	})
	if err != nil {
		return guarded, unguarded, nil, err
	}
	defer a.stop()
	if _, _, err := a.measure(ctx, c, 20); err != nil { // warm-up
		return guarded, unguarded, nil, err
	}
	if guarded, unguarded, err = a.measure(ctx, c, n); err != nil {
		return guarded, unguarded, nil, err
	}
	// Stop the manager so the extra bindings (locks nobody claims) stay.
	if err := m.Stop(); err != nil {
		return guarded, unguarded, nil, err
	}
	stopped = true
	byBindings = map[string]latency{}
	bound := 1 // the lock "report"
	for _, want := range bindingCounts {
		for ; bound < want; bound++ {
			if err := celmode.EnsureBindings(ctx, c, fmt.Sprintf("bench-lock-%d", bound)); err != nil {
				return guarded, unguarded, nil, err
			}
		}
		// Let the apiserver's policy source take the new bindings in.
		time.Sleep(3 * time.Second)
		if _, _, err := a.measure(ctx, c, 20); err != nil {
			return guarded, unguarded, nil, err
		}
		g, _, err := a.measure(ctx, c, n/2)
		if err != nil {
			return guarded, unguarded, nil, err
		}
		byBindings[fmt.Sprintf("bindings_%d", want)] = g
		fmt.Fprintf(os.Stderr, " [%d locks bound: p50 %.2f p99 %.2f ms]", want, g.P50, g.P99)
	}
	return guarded, unguarded, byBindings, nil
}

func celProbe(ns, epoch string) client.Object {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe",
		Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: map[string]string{fkv1.AnnotationEpoch: epoch}}}
}

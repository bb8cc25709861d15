package celmode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// bed is one control plane in one enforcement mode, with the identities the
// rule table writes as.
type bed struct {
	t    testing.TB
	mode string
	env  *envtestutil.AdmissionEnv
	// admin holds the claims and writes as their holder; mallory is another
	// cluster-admin (rule 9); gc sends what the garbage collector sends.
	admin, mallory, gc client.Client
	// watcher is admin with watches.
	watcher client.WithWatch
}

const (
	modeWebhook = "webhook"
	modeCEL     = "cel"
)

func startBed(t testing.TB, mode string) *bed {
	t.Helper()
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	start := envtestutil.StartAdmissionEnvWithManager
	if mode == modeCEL {
		start = envtestutil.StartCELEnvWithManager
	}
	// Reports (test/crds) have a scale subresource: rule 7.
	// Deployments keep the annotations a status write sends (statusWrites).
	// HorizontalPodAutoscalers are listed at v1 and written through v2 too
	// (otherVersions).
	env := start(t, []string{"configmaps", "reports.reports.example.com/v1", "deployments.apps/v1", "horizontalpodautoscalers.autoscaling/v1"},
		filepath.Join(envtestutil.RepoRoot(), "test", "crds"))
	b := &bed{t: t, mode: mode, env: env}
	b.admin = newClient(t, env.Admin)
	var err2 error
	if b.watcher, err2 = client.NewWithWatch(env.Admin, client.Options{Scheme: envtestutil.Scheme()}); err2 != nil {
		t.Fatal(err2)
	}
	if mode == modeCEL {
		b.waitForPolicies()
		b.bindingsSettle()
	}
	b.mallory = b.user("mallory")
	b.gc = b.user("system:kube-controller-manager")
	return b
}

// waitForPolicies waits until the manager applied the CEL-mode policies and
// the apiserver enforces them: a dry-run create with an empty lock label is
// refused by the base policy.
func (b *bed) waitForPolicies() {
	b.t.Helper()
	ns := b.namespace()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		last = b.admin.Create(ctx, configMap(ns, "policy-probe", "", nil, "probe"), client.DryRunAll)
		return reasonOf(last) == fkv1.AdmissionEmptyLockLabel, nil
	})
	if err != nil {
		b.t.Fatalf("the CEL-mode policies are not enforced: the probe got %v", last)
	}
}

// bindingsSettle checks that the manager leaves a lock's bindings alone
// once they are right: no write loop against the apiserver's defaults.
func (b *bed) bindingsSettle() {
	b.t.Helper()
	ctx := context.Background()
	ns := b.namespace()
	b.hold(ns, "settle-check", "w")
	var first, later admissionregistrationv1.ValidatingAdmissionPolicyBinding
	key := client.ObjectKey{Name: celmode.BindingName("settle-check")}
	if err := b.admin.Get(ctx, key, &first); err != nil {
		b.t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := b.admin.Get(ctx, key, &later); err != nil {
		b.t.Fatal(err)
	}
	if first.ResourceVersion != later.ResourceVersion {
		b.t.Fatalf("the manager keeps rewriting binding %s (resourceVersion %s -> %s within a second)", key.Name, first.ResourceVersion, later.ResourceVersion)
	}
	// The mutating binding comes only once every apiserver proved the
	// validating one in force (alone, it would consume tokens nothing
	// checks); it records which validating binding was proven
	// (controllers/celmode tests the ordering itself).
	var m admissionregistrationv1.MutatingAdmissionPolicyBinding
	if err := b.admin.Get(ctx, key, &m); err != nil {
		b.t.Fatal(err)
	}
	if got := m.Annotations[celmode.ProvenAnnotation]; got != string(first.UID) {
		b.t.Fatalf("the mutating binding records proof for validating binding uid %q, want %q", got, first.UID)
	}
}

func (b *bed) user(name string) client.Client {
	u, err := b.env.Env.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return newClient(b.t, u.Config())
}

func newClient(t testing.TB, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *bed) namespace() string {
	ns, err := envtestutil.NewNamespace(context.Background(), b.admin, "rules")
	if err != nil {
		b.t.Fatal(err)
	}
	return ns
}

// hold creates claim name for lock as admin and waits until it holds; it
// returns the epoch.
func (b *bed) hold(ns, lock, name string) *fkv1.FencedLease {
	b.t.Helper()
	c := &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(int32(3600))},
	}
	if err := b.admin.Create(context.Background(), c); err != nil {
		b.t.Fatal(err)
	}
	var got fkv1.FencedLease
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		// A failed Get is retried until the timeout.
		return b.admin.Get(ctx, client.ObjectKeyFromObject(c), &got) == nil && got.Status.Phase == fkv1.PhaseHeld, nil
	})
	if err != nil {
		b.t.Fatalf("claim %s/%s never held: %v", ns, name, err)
	}
	b.settle(ns, lock, got.Status.Epoch)
	return &got
}

// release deletes a claim (the lock goes to the next waiter or is free).
func (b *bed) release(c *fkv1.FencedLease) {
	b.t.Helper()
	if err := b.admin.Delete(context.Background(), c, client.Preconditions{UID: &c.UID}); err != nil {
		b.t.Fatal(err)
	}
}

// settle waits until admission judges epoch as the lock's current one
// (envtestutil.WaitFencingEnforced). The CEL policies read the Lease from
// the apiserver's own cache, which trails the write by a watch delivery; the
// table's cases are about the rules, not that window (currentAfterHandoff
// measures it).
func (b *bed) settle(ns, lock string, epoch int64) {
	b.t.Helper()
	if err := envtestutil.WaitFencingEnforced(context.Background(), b.admin, ns, lock, epoch); err != nil {
		b.t.Fatal(err)
	}
}

// settleGone waits until admission no longer accepts epoch as current (the
// lock moved on).
func (b *bed) settleGone(ns, lock string, epoch int64) {
	b.t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		probe := configMap(ns, "settle-probe", lock, map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(epoch)}, "probe")
		return b.admin.Create(ctx, probe, client.DryRunAll) != nil, nil
	})
	if err != nil {
		b.t.Fatalf("admission still accepts epoch %d of %s/%s", epoch, ns, lock)
	}
}

func configMap(ns, name, lock string, ann map[string]string, data string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Data:       map[string]string{"report": data},
	}
	if lock != "-" {
		cm.Labels = map[string]string{fkv1.LabelLock: lock}
	}
	return cm
}

// reasonOf is the fencing reason of a denial, from the webhook's status
// cause or the CEL policy's message; "" for nil, "?" for any other error.
func reasonOf(err error) fkv1.AdmissionReason {
	if err == nil {
		return ""
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		st := se.Status()
		if st.Details != nil {
			for _, c := range st.Details.Causes {
				if r, ok := strings.CutPrefix(string(c.Type), fkv1.Prefix); ok {
					return fkv1.AdmissionReason(r)
				}
			}
		}
		if r := fkv1.PolicyDenialReason(st.Message); r != "" {
			return r
		}
	}
	return fkv1.AdmissionReason(fmt.Sprintf("?(%v)", err))
}

package envtestutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook"
)

// ManagerNamespace is where the manager runs and the lease-guard parameter lives.
const ManagerNamespace = "fencekeeper-system"

// ManagerUser is the identity the manager uses against a local control plane.
const ManagerUser = "fencekeeper-manager"

// WithFencingWebhook registers the fencing webhook for the guarded resources
// with the environment; on Start, envtest generates a CA and serving
// certificate (in WebhookInstallOptions.LocalServingCertDir) and points the
// configuration at LocalServingHost:LocalServingPort.
func WithFencingWebhook(env *envtest.Environment, guarded []string) error {
	return WithWebhook(env, guarded, false)
}

// WithWebhook is WithFencingWebhook, with only the scale webhook when
// scaleOnly is set (CEL mode: admission policies fence the objects).
func WithWebhook(env *envtest.Environment, guarded []string, scaleOnly bool) error {
	cfg, err := localWebhookConfig(guarded, scaleOnly)
	if err != nil {
		return err
	}
	env.WebhookInstallOptions.MutatingWebhooks = append(env.WebhookInstallOptions.MutatingWebhooks, cfg)
	env.WebhookInstallOptions.LocalServingHost = "127.0.0.1"
	return nil
}

// LocalWebhook returns install options for the fencing webhook on an already
// running control plane; call Install(cfg) to generate the certificate and
// register it, Cleanup to remove the certificate directory.
func LocalWebhook(_ *envtest.Environment, guarded []string) *envtest.WebhookInstallOptions {
	cfg, err := localWebhookConfig(guarded, false)
	if err != nil {
		panic(err)
	}
	cfg.Name = "fencekeeper-fencing-local"
	return &envtest.WebhookInstallOptions{
		MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{cfg},
		LocalServingHost: "127.0.0.1",
	}
}

func localWebhookConfig(guarded []string, scaleOnly bool) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	g, err := webhook.ParseGuardedResources(guarded)
	if err != nil {
		return nil, err
	}
	return webhook.FencingWebhookConfiguration(webhook.ConfigOptions{
		Guarded: g,
		// envtest turns a service reference into https://host:port/<path>.
		ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
			Name: "local", Namespace: ManagerNamespace, Path: ptr.To(webhook.FencingPath[1:]),
		}},
		ExcludedNamespaces: []string{"kube-system", ManagerNamespace},
		ScaleOnly:          scaleOnly,
	}), nil
}

// InstallLeaseGuard creates the manager namespace, the lease guard's
// parameter naming managerUser, and the ValidatingAdmissionPolicy and binding
// from config/policy, then waits until the policy is enforced. managerCfg is
// the manager's identity (it removes the probe the wait uses).
func InstallLeaseGuard(ctx context.Context, cfg, managerCfg *rest.Config, managerUser string) error {
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return err
	}
	mc, err := client.New(managerCfg, client.Options{})
	if err != nil {
		return err
	}
	if _, err := createPolicyParams(ctx, c, managerUser); err != nil {
		return err
	}
	for _, f := range []string{"managed-lease-guard.yaml", "claim-identity.yaml", "claim-break.yaml"} {
		if _, err := applyPolicyFile(ctx, c, f); err != nil {
			return err
		}
	}
	if err := waitForPolicy(ctx, c, mc); err != nil {
		return err
	}
	if err := WaitForClaimIdentity(ctx, c); err != nil {
		return err
	}
	return waitForClaimBreak(ctx, c)
}

// createPolicyParams creates the manager namespace and the policies'
// parameter naming managerUser (both may exist already), and returns the
// parameter.
func createPolicyParams(ctx context.Context, c client.Client, managerUser string) (*corev1.ConfigMap, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	params := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-lease-guard-params", Namespace: ManagerNamespace},
		Data:       map[string]string{"managerUsername": managerUser},
	}
	if err := c.Create(ctx, params); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return params, nil
}

// waitForClaimBreak waits until the apiserver records who breaks a lock: a
// dry-run update that sets a break reason on a probe claim must come back
// with the breaker's name (and a dry-run create of a broken claim must be
// refused). The probe claim is deleted afterwards.
func waitForClaimBreak(ctx context.Context, admin client.Client) error {
	probe := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: "fencekeeper-break-probe"},
		Spec: fkv1.FencedLeaseSpec{LockName: "fencekeeper-break-probe", HolderIdentity: "probe"}}
	if err := admin.Create(ctx, probe); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	defer func() { _ = admin.Delete(ctx, probe) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var cur fkv1.FencedLease
		err := admin.Get(ctx, client.ObjectKeyFromObject(probe), &cur)
		if err == nil {
			if cur.Annotations == nil {
				cur.Annotations = map[string]string{}
			}
			cur.Annotations[fkv1.AnnotationBreakReason] = "probe"
			cur.Annotations[fkv1.AnnotationBrokenBy] = "forged"
			err = admin.Update(ctx, &cur, client.DryRunAll)
			by := cur.Annotations[fkv1.AnnotationBrokenBy]
			if err == nil && by != "forged" && by != "" {
				broken := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: "fencekeeper-break-probe-2",
					Annotations: map[string]string{fkv1.AnnotationBreakReason: "probe"}}, Spec: probe.Spec}
				if cerr := admin.Create(ctx, broken, client.DryRunAll); cerr != nil {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the claim-break policies are not in effect after 30s (probe: %v)", err) //nolint:errorlint // the probe's result (often nil) is context, not the cause
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitForClaimIdentity waits until the apiserver records who creates a
// claim: a dry-run create (in the manager's namespace) must come back with
// the creator's annotation. A claim made before that records no identity,
// and every write presenting its epoch is refused.
func WaitForClaimIdentity(ctx context.Context, admin client.Client) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		probe := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: "fencekeeper-policy-probe",
			Annotations: map[string]string{fkv1.AnnotationCreatedBy: "forged"}},
			Spec: fkv1.FencedLeaseSpec{LockName: "probe", HolderIdentity: "probe"}}
		err := admin.Create(ctx, probe, client.DryRunAll)
		if err == nil && probe.Annotations[fkv1.AnnotationCreatedBy] != "forged" && probe.Annotations[fkv1.AnnotationCreatedBy] != "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the claim-identity policy is not in effect after 30s (probe: %v, annotations %v)", err, probe.Annotations) //nolint:errorlint // the probe's result (often nil) is context, not the cause
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// InstallClaimIdentity applies the claim-identity policies (config/policy)
// and their parameter naming managerUser, for an environment that has no
// lease guard, and waits until claims record who creates them (a claim that
// records nobody has every write presenting its epoch refused). remove
// takes them away again, so that a chart installed later can own them.
func InstallClaimIdentity(ctx context.Context, cfg *rest.Config, managerUser string) (remove func(context.Context) error, err error) {
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	params, err := createPolicyParams(ctx, c, managerUser)
	if err != nil {
		return nil, err
	}
	objs := []client.Object{params}
	remove = func(ctx context.Context) error {
		var errs []error
		for _, o := range objs {
			if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	applied, err := applyPolicyFile(ctx, c, "claim-identity.yaml")
	objs = append(objs, applied...)
	if err != nil {
		return nil, errors.Join(err, remove(ctx))
	}
	if err := WaitForClaimIdentity(ctx, c); err != nil {
		return nil, errors.Join(err, remove(ctx))
	}
	return remove, nil
}

// WithoutClaimIdentity runs fn while the claim-identity policy is not in
// effect, as on a cluster right after the policy is installed or before it
// was: its binding is deleted, and fn runs once a dry-run claim create comes
// back recording nobody. The binding is then created again (also when fn
// exits through t.Fatal), and WithoutClaimIdentity returns once the policy
// is back in effect.
func WithoutClaimIdentity(ctx context.Context, cfg *rest.Config, fn func()) (err error) {
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return err
	}
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-claim-identity"}}
	if err := c.Delete(ctx, binding); err != nil {
		return fmt.Errorf("deleting the claim-identity binding: %w", err)
	}
	defer func() {
		if _, rerr := applyPolicyFile(ctx, c, "claim-identity.yaml"); rerr != nil {
			err = errors.Join(err, rerr)
			return
		}
		err = errors.Join(err, WaitForClaimIdentity(ctx, c))
	}()
	var probe *fkv1.FencedLease
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		probe = &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ManagerNamespace, Name: "fencekeeper-unbound-probe"},
			Spec: fkv1.FencedLeaseSpec{LockName: "probe", HolderIdentity: "probe"}}
		last = c.Create(ctx, probe, client.DryRunAll)
		_, recorded := probe.Annotations[fkv1.AnnotationCreatedBy]
		return last == nil && !recorded, nil
	}); err != nil {
		return fmt.Errorf("the claim-identity policy is still in effect 30s after its binding was deleted (probe: %v, annotations %v)", last, probe.Annotations) //nolint:errorlint // the probe's result (often nil) is context, not the cause
	}
	fn()
	return nil
}

// waitForPolicy waits until the apiserver enforces the policy. Its status is
// written by kube-controller-manager, which a local control plane does not
// run, so it probes instead: a dry-run delete of a managed Lease by a user
// who is not the manager must be refused. The probe Lease is created and then
// deleted by the manager's identity.
func waitForPolicy(ctx context.Context, admin, manager client.Client) error {
	probe := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace: ManagerNamespace, Name: "fencekeeper-policy-probe",
		Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue},
	}}
	// Only the manager may create a managed Lease.
	if err := manager.Create(ctx, probe); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := admin.Delete(ctx, probe, client.DryRunAll)
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the lease guard policy is not enforced after 30s (probe delete: %w)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return client.IgnoreNotFound(manager.Delete(ctx, probe))
}

// applyPolicyFile creates the objects of config/policy/name (those that
// exist already are left as they are), and returns them.
func applyPolicyFile(ctx context.Context, c client.Client, name string) ([]client.Object, error) {
	path := filepath.Join(RepoRoot(), "config", "policy", name)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var objs []client.Object
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return objs, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
			return objs, fmt.Errorf("%s: creating %s %s: %w", path, u.GetKind(), u.GetName(), err)
		}
		objs = append(objs, u)
	}
}

// AdmissionEnv is a control plane with the fencing webhook registered and the
// managed-Lease guard installed, plus the manager's identity.
type AdmissionEnv struct {
	Env *envtest.Environment
	// Admin is cluster-admin but not the manager (the guard applies to it).
	Admin *rest.Config
	// Manager is the identity the manager runs as.
	Manager *rest.Config
	// Guarded are the kinds fenced; CEL is true when the fencing rules are
	// the CEL-mode admission policies (StartCELEnv) instead of the webhook.
	Guarded []string
	CEL     bool
}

// StartAdmissionEnv starts it; extraCRDDirs add CRDs (e.g. test/crds).
func StartAdmissionEnv(ctx context.Context, guarded []string, extraCRDDirs ...string) (*AdmissionEnv, error) {
	return startAdmissionEnv(ctx, guarded, false, extraCRDDirs...)
}

// StartCELEnv is StartAdmissionEnv in CEL enforcement mode: only the scale
// webhook is registered; managers started with StartManager apply the
// CEL-mode policies, keep their bindings and serve that webhook.
func StartCELEnv(ctx context.Context, guarded []string, extraCRDDirs ...string) (*AdmissionEnv, error) {
	return startAdmissionEnv(ctx, guarded, true, extraCRDDirs...)
}

func startAdmissionEnv(ctx context.Context, guarded []string, cel bool, extraCRDDirs ...string) (*AdmissionEnv, error) {
	env, err := New()
	if err != nil {
		return nil, err
	}
	env.CRDDirectoryPaths = append(env.CRDDirectoryPaths, extraCRDDirs...)
	if err := WithWebhook(env, guarded, cel); err != nil {
		return nil, err
	}
	admin, err := env.Start()
	if err != nil {
		return nil, err
	}
	a := &AdmissionEnv{Env: env, Admin: admin, Guarded: guarded, CEL: cel}
	mu, err := env.AddUser(envtest.User{Name: ManagerUser, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	a.Manager = mu.Config()
	if err := InstallLeaseGuard(ctx, admin, a.Manager, ManagerUser); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return a, nil
}

// StartManager starts an in-process manager as the manager identity, serving
// the fencing webhook.
func (a *AdmissionEnv) StartManager() (*Manager, error) {
	if a.CEL {
		g, err := webhook.ParseGuardedResources(a.Guarded)
		if err != nil {
			return nil, err
		}
		return StartManager(a.Manager, ManagerOptions{CEL: g, Webhook: &a.Env.WebhookInstallOptions})
	}
	return StartManager(a.Manager, ManagerOptions{Webhook: &a.Env.WebhookInstallOptions})
}

// WaitFencingEnforced waits until admission fences lock in ns with epoch
// current, in either mode: a dry-run create presenting epoch comes back
// with the token consumed into the watermark, and one presenting epoch+1
// is refused. (A dry run alone proves nothing while no policy or webhook is
// loaded yet: it would pass unchecked.)
func WaitFencingEnforced(ctx context.Context, c client.Client, ns, lock string, epoch int64) error {
	probe := func(e int64) (*corev1.ConfigMap, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fencing-probe",
			Labels: map[string]string{fkv1.LabelLock: lock}, Annotations: map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(e)}}}
		return cm, c.Create(ctx, cm, client.DryRunAll)
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		cm, err := probe(epoch)
		if err != nil {
			last = fmt.Sprintf("presenting %d: %v", epoch, err)
			return false, nil
		}
		if _, kept := cm.Annotations[fkv1.AnnotationEpoch]; kept || cm.Annotations[fkv1.AnnotationFencedEpoch] != fkv1.FormatEpoch(epoch) {
			last = fmt.Sprintf("presenting %d: not consumed (annotations %v)", epoch, cm.Annotations)
			return false, nil
		}
		if _, err := probe(epoch + 1); err == nil {
			last = fmt.Sprintf("presenting %d (never issued): accepted", epoch+1)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("admission does not fence lock %s/%s at epoch %d: %s", ns, lock, epoch, last)
	}
	return nil
}

// Package admission_test holds the fencing admission webhook's scenario
// tests (package webhook): fenced writes, the lease guard, leader handovers,
// stalled watches and lost replies, against a real kube-apiserver and etcd
// (envtest) that call the webhook of managers running in the test process
// or as processes (test/envtestutil).
package admission_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	ctx        = context.Background()
	suite      *envtestutil.Suite
	testEnv    *envtest.Environment
	adminCfg   *rest.Config
	managerCfg *rest.Config
	k8s        client.WithWatch // an admin who is not the manager
	asManager  client.Client
)

func TestAdmission(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Fencing admission suite")
}

var _ = BeforeSuite(func() {
	var err error
	suite, err = envtestutil.StartSuite(ctx, envtestutil.SuiteOptions{Log: GinkgoWriter,
		Guarded: []string{"configmaps", "reports.reports.example.com/v1"},
		CRDDirs: []string{filepath.Join(envtestutil.RepoRoot(), "test", "crds")}})
	Expect(err).NotTo(HaveOccurred())
	testEnv, adminCfg, managerCfg, k8s = suite.Env, suite.Config, suite.Admission.Manager, suite.Client
	asManager, err = client.New(managerCfg, client.Options{Scheme: envtestutil.Scheme()})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if suite != nil {
		Expect(suite.Stop()).To(Succeed())
	}
})

func startManager() *envtestutil.Manager {
	m, err := envtestutil.StartManager(managerCfg, envtestutil.ManagerOptions{Webhook: &testEnv.WebhookInstallOptions})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return m
}

func newNamespace() string {
	ns, err := envtestutil.NewNamespace(context.Background(), k8s, "fenced")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return ns
}

// acquire creates a claim and waits until it holds; returns it with its epoch.
func acquire(ns, name, lock, holder string, ttl int32) *fkv1.FencedLease {
	c := &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: holder, LeaseDurationSeconds: ptr.To(ttl)},
	}
	ExpectWithOffset(1, k8s.Create(ctx, c)).To(Succeed())
	return waitPhase(c, fkv1.PhaseHeld)
}

func waitPhase(c *fkv1.FencedLease, phase fkv1.FencedLeasePhase) *fkv1.FencedLease {
	var got fkv1.FencedLease
	EventuallyWithOffset(2, func() fkv1.FencedLeasePhase {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), &got); err != nil {
			return ""
		}
		return got.Status.Phase
	}, 30*time.Second, 20*time.Millisecond).Should(Equal(phase))
	return &got
}

// breakHold has an operator break claim name's hold (kubectl fence break).
func breakHold(ns, name, reason string) {
	ExpectWithOffset(1, k8s.Patch(ctx, &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+fkv1.AnnotationBreakReason+`":"`+reason+`"}}}`)))).To(Succeed())
}

func release(c *fkv1.FencedLease) {
	ExpectWithOffset(1, k8s.Delete(ctx, c, client.Preconditions{UID: &c.UID})).To(Succeed())
}

func epochString(e int64) string { return fmt.Sprintf("%d", e) }

// fencedConfigMap is a ConfigMap fenced by lock, stamped with epoch.
func fencedConfigMap(ns, name, lock string, epoch int64, data string, extra map[string]string) *corev1.ConfigMap {
	ann := map[string]string{fkv1.AnnotationEpoch: epochString(epoch)}
	for k, v := range extra {
		ann[k] = v
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{fkv1.LabelLock: lock}, Annotations: ann},
		Data:       map[string]string{"report.csv": data},
	}
}

// publish is a worker's read-modify-write of a fenced ConfigMap with its epoch.
func publish(ns, name string, epoch int64, data string) error {
	return publishAs(k8s, ns, name, epoch, data)
}

// publishAs is publish sent by c.
func publishAs(c client.Client, ns, name string, epoch int64, data string) error {
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm); err != nil {
		return err
	}
	cm.Annotations[fkv1.AnnotationEpoch] = epochString(epoch)
	cm.Data = map[string]string{"report.csv": data}
	return c.Update(ctx, &cm)
}

// workerAccount creates the ServiceAccount "worker" in ns, allowed
// everything: pods run as it and write with tokens bound to them.
func workerAccount(ns string) {
	ExpectWithOffset(1, k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker"}})).To(Succeed())
	ExpectWithOffset(1, k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "worker", Namespace: ns}},
	})).To(Succeed())
}

// asPod is a client that authenticates the way pod p's containers would:
// with a token of its ServiceAccount ("worker", see workerAccount) bound
// to p.
func asPod(p *corev1.Pod) client.Client {
	cs, err := kubernetes.NewForConfig(adminCfg)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	tr, err := cs.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, "worker", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}, metav1.CreateOptions{})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	cfg := rest.AnonymousClientConfig(adminCfg)
	cfg.BearerToken = tr.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return c
}

func configMapData(ns, name string) string {
	var cm corev1.ConfigMap
	ExpectWithOffset(1, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm)).To(Succeed())
	return cm.Data["report.csv"]
}

// Package cluster_test runs fencekeeper against a control plane with real
// controllers: kube-controller-manager (garbage collection, namespace
// deletion, Deployments, node lifecycle), kube-scheduler and kwok playing the
// kubelet of fake nodes. What envtest alone can only replay by hand happens
// here.
package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	ctx     = context.Background()
	suite   *envtestutil.Suite
	env     *envtestutil.AdmissionEnv
	cluster *envtestutil.Cluster
	manager *envtestutil.Manager
	k8s     client.WithWatch // an admin who is not the manager
)

func TestCluster(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Real-cluster suite (kube-controller-manager, kube-scheduler, kwok)")
}

var _ = BeforeSuite(func() {
	var err error
	suite, err = envtestutil.StartSuite(ctx, envtestutil.SuiteOptions{Log: GinkgoWriter, Guarded: []string{"configmaps"}})
	Expect(err).NotTo(HaveOccurred())
	env, k8s = suite.Admission, suite.Client
	// kube-controller-manager, kube-scheduler and kwok start before the manager.
	cluster, err = envtestutil.StartCluster(env.Env, envtestutil.ClusterOptions{})
	Expect(err).NotTo(HaveOccurred())
	manager, err = env.StartManager()
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if manager != nil {
		Expect(manager.Stop()).To(Succeed())
	}
	if cluster != nil {
		cluster.Stop()
	}
	if suite != nil {
		Expect(suite.Stop()).To(Succeed())
	}
})

// On failure, show what kube-controller-manager, kube-scheduler and kwok
// were doing.
var _ = ReportAfterEach(func(r SpecReport) {
	if r.Failed() && cluster != nil {
		AddReportEntry("kube-controller-manager log", cluster.Logs("kube-controller-manager", 40))
		AddReportEntry("kube-scheduler log", cluster.Logs("kube-scheduler", 20))
		AddReportEntry("kwok log", cluster.Logs("kwok", 20))
	}
})

func newNamespace() string {
	ns, err := envtestutil.NewNamespace(ctx, k8s, "cluster")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return ns
}

func claim(ns, name, lock string, ttl int32) *fkv1.FencedLease {
	c := &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(ttl)},
	}
	ExpectWithOffset(1, k8s.Create(ctx, c)).To(Succeed())
	return c
}

func waitPhase(c *fkv1.FencedLease, phase fkv1.FencedLeasePhase) *fkv1.FencedLease {
	var got fkv1.FencedLease
	EventuallyWithOffset(1, func() fkv1.FencedLeasePhase {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), &got); err != nil {
			return ""
		}
		return got.Status.Phase
	}, 30*time.Second, 20*time.Millisecond).Should(Equal(phase))
	return &got
}

func epochOf(c *fkv1.FencedLease) int64 { return c.Status.Epoch }

// fencedConfigMap is a ConfigMap fenced by lock, written with epoch.
func fencedConfigMap(ns, name, lock string, epoch int64) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{fkv1.LabelLock: lock},
			Annotations: map[string]string{fkv1.AnnotationEpoch: fmt.Sprint(epoch)}},
		Data: map[string]string{"report.csv": fmt.Sprintf("written by epoch %d", epoch)},
	}
}

// leaseDeployment is a Deployment whose pods ask for lock; kube-scheduler
// places them on kwok's nodes, on node alone when node is not "". Options
// change it before it is created.
func leaseDeployment(ns, name, lock, node string, replicas int32, ttl string, opts ...func(*appsv1.Deployment)) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	var onNode map[string]string
	if node != "" {
		onNode = map[string]string{corev1.LabelHostname: node}
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
					fkv1.AnnotationLease: lock, fkv1.AnnotationLeaseDuration: ttl,
				}},
				Spec: corev1.PodSpec{
					NodeSelector:                  onNode,
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Containers:                    []corev1.Container{{Name: "worker", Image: "example.com/report-worker:1"}},
				},
			},
		},
	}
	for _, o := range opts {
		o(d)
	}
	ExpectWithOffset(1, k8s.Create(ctx, d)).To(Succeed())
	return d
}

// withLeaseGate gives the pods the fencekeeper.io/lease-held readiness gate.
func withLeaseGate(d *appsv1.Deployment) {
	d.Spec.Template.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: fkv1.PodConditionLeaseHeld}}
}

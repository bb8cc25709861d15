package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// nonDefault exercises every optional part of the chart.
var nonDefault = []string{
	"--set", "replicaCount=3",
	"--set", "certManager.enabled=true",
	"--set", "metrics.serviceMonitor.enabled=true",
	"--set", "networkPolicy.enabled=true",
	"--set", "crds.keep=false",
	"--set", "guardedResources={configmaps,reports.reports.example.com/v1}",
	"--set", "webhook.excludedNamespaces={monitoring}",
	"--set", "extraArgs={--zap-log-level=debug}",
	"--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
	"--set", "claims.expiredRetention=1h30m",
	"--set", "dashboards.enabled=true",
	"--set", "prometheusRule.enabled=true",
	"--set", "dashboards.annotations.grafana_folder=Infrastructure",
}

// servedAPIs tell helm template that the cluster serves the third-party kinds
// nonDefault needs (this test's apiserver has their CRDs; helm template sees
// no cluster).
var servedAPIs = []string{"--api-versions", "cert-manager.io/v1/Certificate", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
	"--api-versions", "monitoring.coreos.com/v1/PrometheusRule"}

// withoutThirdParty is nonDefault minus the options that need third-party
// kinds: helm lint cannot be told a cluster serves them.
func withoutThirdParty(values []string) []string {
	var out []string
	for i := 0; i < len(values); i += 2 {
		if strings.HasPrefix(values[i+1], "certManager.") || strings.HasPrefix(values[i+1], "metrics.serviceMonitor.") ||
			strings.HasPrefix(values[i+1], "prometheusRule.") {
			continue
		}
		out = append(out, values[i], values[i+1])
	}
	return out
}

var _ = Describe("Helm chart", Ordered, func() {
	It("passes helm lint --strict with default and non-default values", func() {
		out, errOut, err := helm("lint", "--strict", chartDir)
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		out, errOut, err = helm(append([]string{"lint", "--strict", chartDir}, withoutThirdParty(nonDefault)...)...)
		Expect(err).NotTo(HaveOccurred(), out+errOut)
	})

	DescribeTable("renders manifests the apiserver accepts (server-side dry run)",
		func(values []string) {
			args := append(append([]string{"template", "fk", chartDir, "--namespace", "fencekeeper-system"}, servedAPIs...), values...)
			manifests, errOut, err := helm(args...)
			Expect(err).NotTo(HaveOccurred(), errOut)
			_, _, _ = run(nil, kubectlBin, "create", "namespace", "fencekeeper-system")
			out, errOut, err := run([]byte(manifests), kubectlBin, "apply", "--server-side", "--dry-run=server", "-f", "-")
			Expect(err).NotTo(HaveOccurred(), out+errOut)
			Expect(out).To(ContainSubstring("deployment.apps/fk-fencekeeper serverside-applied (server dry run)"))
			if len(values) > 0 {
				Expect(out).To(ContainSubstring("prometheusrule.monitoring.coreos.com/fk-fencekeeper serverside-applied (server dry run)"))
				Expect(out).To(ContainSubstring("configmap/fk-fencekeeper-dashboard serverside-applied (server dry run)"))
			}
		},
		Entry("default values", nil),
		Entry("non-default values", nonDefault),
	)

	DescribeTable("rejects bad values with a clear message",
		func(set, want string) {
			_, errOut, err := helm("template", "fk", chartDir, "--set", set)
			Expect(err).To(HaveOccurred())
			Expect(errOut).To(ContainSubstring(want))
		},
		Entry("wrong type", "replicaCount=two", "replicaCount"),
		Entry("unknown top-level key", "replicas=2", "additional properties 'replicas' not allowed"),
		Entry("bad guarded resource", "guardedResources={Config_Maps}", "guardedResources"),
		Entry("pods guarded", "guardedResources={configmaps,pods}", "guardedResources: pods cannot be fenced"),
		Entry("a subresource guarded", "guardedResources={configmaps/status}", `guardedResources: "configmaps/status": "status" is not an API version`),
		Entry("a subresource guarded after a version", "guardedResources={deployments.apps/v1/scale}", `'deployments.apps/v1/scale' does not match pattern`),
		Entry("timeout out of range", "webhook.timeoutSeconds=60", "timeoutSeconds"),
		Entry("bad expired-claim retention", "claims.expiredRetention=1day", "expiredRetention"),
		Entry("cert-manager asked for, not served", "certManager.enabled=true",
			"certManager.enabled=true needs the cert-manager.io/v1/Certificate kind, which this cluster does not serve: install cert-manager"),
		Entry("ServiceMonitor asked for, not served", "metrics.serviceMonitor.enabled=true",
			"metrics.serviceMonitor.enabled=true needs the monitoring.coreos.com/v1/ServiceMonitor kind, which this cluster does not serve: install the Prometheus Operator"),
		Entry("PrometheusRule asked for, not served", "prometheusRule.enabled=true",
			"prometheusRule.enabled=true needs the monitoring.coreos.com/v1/PrometheusRule kind, which this cluster does not serve: install the Prometheus Operator"),
		Entry("alert threshold out of range", "prometheusRule.webhook.errorRatio=2", "errorRatio"),
		Entry("unknown fencing mode", "fencing.mode=both", "value must be one of 'webhook', 'cel'"),
		Entry("a tag in image.repository", "image.repository=registry.example/fencekeeper:v1",
			`image.repository "registry.example/fencekeeper:v1" names a tag or digest: set the repository alone and the tag in image.tag`),
		Entry("a digest in image.repository", "image.repository=registry.example/fencekeeper@sha256:0123", "names a tag or digest"),
	)

	It("without an image refuses to render or install, saying how to build and set one", func() {
		const want = "image.repository is required: no fencekeeper image is published. Build one with `make image`, " +
			"push it with `make image-push IMG=REGISTRY/REPOSITORY:TAG` (or, for kind, `kind load image-archive bin/image.tar`), " +
			"then pass --set image.repository=REGISTRY/REPOSITORY --set image.tag=TAG. See docs/install.md#the-image."
		_, errOut, err := helmNoImage("template", "fk", chartDir)
		Expect(err).To(HaveOccurred())
		Expect(errOut).To(ContainSubstring(want))
		out, errOut, err := helmNoImage("install", "fk", chartDir, "-n", "fencekeeper-system", "--create-namespace")
		Expect(err).To(HaveOccurred(), out)
		Expect(errOut).To(ContainSubstring(want))
		By("nothing was installed: no release, no Deployment to sit in ImagePullBackOff")
		_, _, err = helmNoImage("status", "fk", "-n", "fencekeeper-system")
		Expect(err).To(HaveOccurred())
		err = admin.Get(ctx, client.ObjectKey{Namespace: "fencekeeper-system", Name: "fk-fencekeeper"}, &appsv1.Deployment{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)

		By("with one, the manager runs REPOSITORY:TAG, the tag defaulting to the chart's appVersion")
		var chart struct {
			AppVersion string `json:"appVersion"`
		}
		raw, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(yaml.Unmarshal(raw, &chart)).To(Succeed())
		out, errOut, err = helm("template", "fk", chartDir, "--show-only", "templates/deployment.yaml")
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(ContainSubstring(fmt.Sprintf("image: %q\n", testImage+":"+chart.AppVersion)))
		out, errOut, err = helm("template", "fk", chartDir, "--show-only", "templates/deployment.yaml",
			"--set", "image.repository=localhost:5000/team/fencekeeper", "--set", "image.tag=v1.2.3")
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(ContainSubstring(`image: "localhost:5000/team/fencekeeper:v1.2.3"` + "\n"))
	})

	It("in CEL mode renders only the scale webhook and tells the manager the mode, the guarded kinds and the skipped namespaces", func() {
		out, errOut, err := helm("template", "fk", chartDir, "--namespace", "fencekeeper-system", "--set", "fencing.mode=cel",
			"--set", "guardedResources={configmaps,reports.reports.example.com/v1}", "--set", "webhook.excludedNamespaces={monitoring}")
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(ContainSubstring("kind: MutatingWebhookConfiguration"))
		Expect(out).To(ContainSubstring("- name: " + webhook.ScaleWebhookName + "\n"))
		Expect(out).NotTo(ContainSubstring("- name: " + webhook.FencingWebhookName + "\n"))
		Expect(out).To(ContainSubstring(`resources: ["reports/scale"]`))
		Expect(out).To(ContainSubstring("- --fencing-mode=cel\n"))
		Expect(out).To(ContainSubstring("- --guarded-resources=configmaps,reports.reports.example.com/v1\n"))
		Expect(out).To(ContainSubstring("- --excluded-namespaces=kube-system,fencekeeper-system,monitoring\n"))
		out, errOut, err = helm("template", "fk", chartDir)
		Expect(err).NotTo(HaveOccurred(), errOut)
		Expect(out).To(ContainSubstring("kind: MutatingWebhookConfiguration"))
		Expect(out).To(ContainSubstring("- --fencing-mode=webhook\n"))
	})

	It("with leaseGuard.enabled=false leaves out only the managed-Lease guard: claims still record who made them, and who broke them", func() {
		// A claim that records no identity binds nobody, and every write
		// presenting its epoch is refused (rule 9): without the claim-identity
		// policy, no holder but pods could write at all.
		out, errOut, err := helm("template", "fk", chartDir, "--namespace", "fencekeeper-system", "--set", "leaseGuard.enabled=false")
		Expect(err).NotTo(HaveOccurred(), errOut)
		off := byKindName(out)
		Expect(off).NotTo(HaveKey("ValidatingAdmissionPolicy/fencekeeper-managed-lease-guard"))
		Expect(off).NotTo(HaveKey("ValidatingAdmissionPolicyBinding/fencekeeper-managed-lease-guard"))
		out, errOut, err = helm("template", "fk", chartDir, "--namespace", "fencekeeper-system")
		Expect(err).NotTo(HaveOccurred(), errOut)
		on := byKindName(out)
		for _, k := range []string{
			"MutatingAdmissionPolicy/fencekeeper-claim-identity", "MutatingAdmissionPolicyBinding/fencekeeper-claim-identity",
			"ValidatingAdmissionPolicy/fencekeeper-claim-identity-immutable", "ValidatingAdmissionPolicyBinding/fencekeeper-claim-identity-immutable",
			"MutatingAdmissionPolicy/fencekeeper-claim-break", "ValidatingAdmissionPolicy/fencekeeper-claim-break",
			"ConfigMap/fk-fencekeeper-lease-guard-params",
		} {
			Expect(on).To(HaveKey(k))
			Expect(off).To(HaveKeyWithValue(k, Equal(on[k])), "%s differs or is missing with leaseGuard.enabled=false", k)
		}
	})

	It("installs, upgrades with changed values, and uninstalls", func() {
		out, errOut, err := helm("install", "fk", chartDir, "-n", "fencekeeper-system", "--create-namespace")
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		By("the notes say what to wait for, that fenced writes fail closed until then, and what to try")
		Expect(out).To(ContainSubstring("kubectl -n fencekeeper-system rollout status deployment/fk-fencekeeper"))
		Expect(out).To(ContainSubstring("writes to fenced objects are refused"))
		Expect(out).To(ContainSubstring("kubectl -n reports get fencedleases"))
		Expect(out).To(ContainSubstring("the Secret fk-fencekeeper-webhook-cert (the chart creates it empty; helm uninstall deletes it)"))

		var dep appsv1.Deployment
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: "fencekeeper-system", Name: "fk-fencekeeper"}, &dep)).To(Succeed())
		Expect(*dep.Spec.Replicas).To(Equal(int32(2)))
		c := dep.Spec.Template.Spec.Containers[0]
		Expect(c.Args).To(ContainElements("--leader-elect", "--cert-rotation=true", "--expired-claim-retention=24h"))
		Expect(*c.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
		Expect(c.SecurityContext.Capabilities.Drop).To(ContainElement(corev1.Capability("ALL")))
		Expect(*dep.Spec.Template.Spec.SecurityContext.RunAsNonRoot).To(BeTrue())
		Expect(dep.Spec.Template.Spec.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		Expect(dep.Spec.Template.Spec.TopologySpreadConstraints).NotTo(BeEmpty())

		var crd apiextensionsv1.CustomResourceDefinition
		Expect(admin.Get(ctx, client.ObjectKey{Name: "fencedleases.fencekeeper.io"}, &crd)).To(Succeed())
		vwc := webhookConfig()
		Expect(vwc.Webhooks[0].Rules).To(HaveLen(2)) // configmaps and configmaps/status
		Expect(*vwc.Webhooks[0].FailurePolicy).To(Equal(admissionregistrationv1.Fail))
		Expect(vwc.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values).To(ConsistOf("kube-system", "fencekeeper-system"))

		By("breaking a lock is an admin's right (verb break, aggregated to admin), not a holder's (edit)")
		verbs := func(role string) []string {
			var cr rbacv1.ClusterRole
			Expect(admin.Get(ctx, client.ObjectKey{Name: role}, &cr)).To(Succeed())
			var out []string
			for _, r := range cr.Rules {
				if slices.Contains(r.Resources, "fencedleases") {
					out = append(out, r.Verbs...)
				}
			}
			return out
		}
		Expect(verbs("fencekeeper-breaker")).To(ContainElements("break", "patch"))
		Expect(verbs("fencekeeper-holder")).NotTo(ContainElements("break"))
		Expect(verbs("fencekeeper-holder")).NotTo(ContainElements("patch"))
		var breaker rbacv1.ClusterRole
		Expect(admin.Get(ctx, client.ObjectKey{Name: "fencekeeper-breaker"}, &breaker)).To(Succeed())
		Expect(breaker.Labels).To(HaveKeyWithValue("rbac.authorization.k8s.io/aggregate-to-admin", "true"))
		Expect(breaker.Labels).NotTo(HaveKey("rbac.authorization.k8s.io/aggregate-to-edit"))

		out, errOut, err = helm("upgrade", "fk", chartDir, "-n", "fencekeeper-system",
			"--set", "replicaCount=3", "--set", "guardedResources={configmaps,reports.reports.example.com/v1}")
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		Expect(admin.Get(ctx, client.ObjectKey{Namespace: "fencekeeper-system", Name: "fk-fencekeeper"}, &dep)).To(Succeed())
		Expect(*dep.Spec.Replicas).To(Equal(int32(3)))
		Expect(webhookConfig().Webhooks[0].Rules).To(HaveLen(4)) // two kinds, each with its status

		out, errOut, err = helm("uninstall", "fk", "-n", "fencekeeper-system")
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		Expect(apierrors.IsNotFound(admin.Get(ctx, client.ObjectKey{Namespace: "fencekeeper-system", Name: "fk-fencekeeper"}, &dep))).To(BeTrue())
		Expect(apierrors.IsNotFound(admin.Get(ctx, client.ObjectKey{Name: "fk-fencekeeper-fencing"}, &admissionregistrationv1.MutatingWebhookConfiguration{}))).To(BeTrue())
		Expect(admin.Get(ctx, client.ObjectKey{Name: "fencedleases.fencekeeper.io"}, &crd)).To(Succeed(), "crds.keep keeps the CRD")
	})

	It("agrees with config/ on the CRD, the RBAC rules and the webhook rules", func() {
		manifests, errOut, err := helm("template", "fencekeeper", chartDir, "-n", "fencekeeper-system")
		Expect(err).NotTo(HaveOccurred(), errOut)
		chart := byKindName(manifests)
		kust, errOut, err := run(nil, kubectlBin, "kustomize", envtestutil.RepoRoot()+"/config/default")
		Expect(err).NotTo(HaveOccurred(), errOut)
		config := byKindName(kust)

		Expect(chart["CustomResourceDefinition/fencedleases.fencekeeper.io"]["spec"]).To(Equal(config["CustomResourceDefinition/fencedleases.fencekeeper.io"]["spec"]))
		// The chart adds get on each guarded kind (the scale webhook reads
		// the scaled object); config/ guards configmaps, which have no scale.
		guardedGet := map[string]any{"apiGroups": []any{""}, "resources": []any{"configmaps"}, "verbs": []any{"get"}}
		Expect(chart["ClusterRole/fencekeeper-manager"]["rules"]).To(Equal(append(config["ClusterRole/fencekeeper-manager"]["rules"].([]any), guardedGet)))
		Expect(chart["Role/fencekeeper-manager"]["rules"]).To(Equal(config["Role/fencekeeper-manager"]["rules"]))
		cws := chart["MutatingWebhookConfiguration/fencekeeper-fencing"]["webhooks"].([]any)
		kws := config["MutatingWebhookConfiguration/fencekeeper-fencing"]["webhooks"].([]any)
		Expect(cws).To(HaveLen(len(kws)))
		for i := range kws {
			cw, kw := cws[i].(map[string]any), kws[i].(map[string]any)
			for _, k := range []string{"name", "rules", "objectSelector", "namespaceSelector", "failurePolicy", "reinvocationPolicy", "sideEffects", "timeoutSeconds", "matchPolicy"} {
				if kw[k] == nil {
					Expect(cw[k]).To(BeNil(), "webhook %d: %s", i, k)
					continue
				}
				Expect(cw[k]).To(Equal(kw[k]), "webhook %d: %s", i, k)
			}
		}
		Expect(chart["ValidatingAdmissionPolicy/fencekeeper-managed-lease-guard"]["spec"]).To(Equal(config["ValidatingAdmissionPolicy/fencekeeper-managed-lease-guard"]["spec"]))
		Expect(chart["MutatingAdmissionPolicy/fencekeeper-claim-identity"]["spec"]).NotTo(BeNil())
		Expect(chart["MutatingAdmissionPolicy/fencekeeper-claim-identity"]["spec"]).To(Equal(config["MutatingAdmissionPolicy/fencekeeper-claim-identity"]["spec"]))
		Expect(chart["ValidatingAdmissionPolicy/fencekeeper-claim-identity-immutable"]["spec"]).To(Equal(config["ValidatingAdmissionPolicy/fencekeeper-claim-identity-immutable"]["spec"]))
		for _, p := range []string{"MutatingAdmissionPolicy/fencekeeper-claim-break", "ValidatingAdmissionPolicy/fencekeeper-claim-break"} {
			Expect(chart[p]["spec"]).NotTo(BeNil(), p)
			Expect(chart[p]["spec"]).To(Equal(config[p]["spec"]), p)
		}
	})

	It("matches every version of a guarded kind, as the manager does, even when a version is listed", func() {
		list := []string{"configmaps", "reports.reports.example.com/v1", "horizontalpodautoscalers.autoscaling/v1"}
		out, errOut, err := helm("template", "fk", chartDir, "--set", "guardedResources={"+strings.Join(list, ",")+"}")
		Expect(err).NotTo(HaveOccurred(), errOut)
		cws := byKindName(out)["MutatingWebhookConfiguration/fk-fencekeeper-fencing"]["webhooks"].([]any)
		guarded, err := webhook.ParseGuardedResources(list)
		Expect(err).NotTo(HaveOccurred())
		raw, err := yaml.Marshal(webhook.FencingWebhookConfiguration(webhook.ConfigOptions{Guarded: guarded}).Webhooks)
		Expect(err).NotTo(HaveOccurred())
		var kws []any
		Expect(yaml.Unmarshal(raw, &kws)).To(Succeed())
		Expect(cws).To(HaveLen(len(kws)))
		for i := range kws {
			Expect(cws[i].(map[string]any)["rules"]).To(Equal(kws[i].(map[string]any)["rules"]), "webhook %d", i)
		}
		Expect(out).To(ContainSubstring(`apiGroups: ["autoscaling"]
        apiVersions: ["*"]`))
		Expect(out).NotTo(ContainSubstring(`apiVersions: ["v1"]
        resources: ["reports"]`))
	})

	It("gives the manager enough RBAC to grant, renew and admit, and no more", func() {
		out, errOut, err := helm("install", "fk", chartDir, "-n", "fencekeeper-system", "--create-namespace",
			"--set", "crds.keep=false", "--set", "guardedResources={configmaps,deployments.apps/v1}")
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		DeferCleanup(func() { _, _, _ = helm("uninstall", "fk", "-n", "fencekeeper-system") })
		// No pods run here, so the chart's webhook Service has no endpoints:
		// replace it by one pointing at the manager this test runs.
		Expect(admin.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "fk-fencekeeper-fencing"}})).To(Succeed())

		sa := fmt.Sprintf("system:serviceaccount:%s:%s", "fencekeeper-system", "fk-fencekeeper")
		asSA := rest.CopyConfig(adminCfg)
		asSA.Impersonate = rest.ImpersonationConfig{UserName: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:fencekeeper-system", "system:authenticated"}}
		saClient, err := client.New(asSA, client.Options{Scheme: envtestutil.Scheme()})
		Expect(err).NotTo(HaveOccurred())

		By("it cannot read Secrets outside its namespace, nor write Deployments")
		err = saClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: "anything"}, &corev1.Secret{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		err = saClient.List(ctx, &appsv1.DeploymentList{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		By("it can read one object of a guarded kind, which the scale webhook needs, and nothing more")
		err = saClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: "no-such-deployment"}, &appsv1.Deployment{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
		err = saClient.Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "x"}}, client.DryRunAll)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		err = saClient.Get(ctx, client.ObjectKey{Namespace: "fencekeeper-system", Name: "fk-fencekeeper-webhook-cert"}, &corev1.Secret{})
		Expect(err).NotTo(HaveOccurred(), "its own certificate Secret")

		By("a manager running as the ServiceAccount grants, and the lease guard recognises it")
		wh := envtestutil.LocalWebhook(env, []string{"configmaps"})
		Expect(wh.Install(adminCfg)).To(Succeed())
		DeferCleanup(func() {
			_ = wh.Cleanup()
			// Nothing serves it once this spec ends: later specs would be
			// refused by it (it fails closed).
			for _, w := range wh.MutatingWebhooks {
				Expect(client.IgnoreNotFound(admin.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: w.Name}}))).To(Succeed())
			}
		})
		m, err := envtestutil.StartManager(asSA, envtestutil.ManagerOptions{Webhook: wh})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })

		ns, claim := grantedClaim("rbac")
		epoch := strconv.FormatInt(claim.Status.Epoch, 10)
		forged := strconv.FormatInt(claim.Status.Epoch+1, 10)

		By("a holder renews; nobody but the ServiceAccount may rewrite the Lease")
		Eventually(func() error { return renewAsAdmin(ns, "report") }, 10*time.Second).Should(Succeed())
		// The chart's policy was installed moments ago; the apiserver picks
		// it up asynchronously. Dry runs change nothing while we wait.
		Eventually(func() error { return tamperAsAdmin(ns, "report", client.DryRunAll) }, 20*time.Second).
			Should(MatchError(ContainSubstring("only the fencekeeper manager may change")))
		Expect(tamperAsAdmin(ns, "report")).To(MatchError(ContainSubstring("only the fencekeeper manager may change")))

		By("admission works: the current epoch is accepted, a forged one denied")
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report",
			Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: map[string]string{fkv1.AnnotationEpoch: epoch}}}
		Eventually(func() error { return admin.Create(ctx, cm) }, 20*time.Second).Should(Succeed())
		cm.Annotations[fkv1.AnnotationEpoch] = forged
		cm.Data = map[string]string{"x": "forged"}
		err = admin.Update(ctx, cm)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("was never issued"))
	})

	It("in CEL mode gives the manager what it needs to apply the policies and bind each lock, and fencing works without the object webhook", func() {
		out, errOut, err := helm("install", "fk", chartDir, "-n", "fencekeeper-system", "--create-namespace",
			"--set", "crds.keep=false", "--set", "fencing.mode=cel")
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		DeferCleanup(func() { _, _, _ = helm("uninstall", "fk", "-n", "fencekeeper-system") })
		// Only the scale webhook is registered (configmaps have no scale).
		Expect(webhookConfig().Webhooks).To(ConsistOf(HaveField("Name", webhook.ScaleWebhookName)))

		sa := "system:serviceaccount:fencekeeper-system:fk-fencekeeper"
		asSA := rest.CopyConfig(adminCfg)
		asSA.Impersonate = rest.ImpersonationConfig{UserName: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:fencekeeper-system", "system:authenticated"}}
		guarded, err := webhook.ParseGuardedResources([]string{"configmaps"})
		Expect(err).NotTo(HaveOccurred())
		m, err := envtestutil.StartManager(asSA, envtestutil.ManagerOptions{CEL: guarded})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			Expect(m.Stop()).To(Succeed())
			// Later specs run the webhook mode on this apiserver.
			for _, obj := range []client.Object{
				&admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: celmode.PolicyName}},
				&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: celmode.PolicyName}},
				&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: celmode.LeaseRequiredPolicyName}},
				&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: celmode.BasePolicyName}},
				&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: celmode.BasePolicyName}},
			} {
				Expect(client.IgnoreNotFound(admin.Delete(ctx, obj))).To(Succeed())
			}
			for _, obj := range celmode.Bindings("report").Objects() {
				Expect(client.IgnoreNotFound(admin.Delete(ctx, obj))).To(Succeed())
			}
		})

		ns, claim := grantedClaim("cel-rbac")
		By("the ServiceAccount's manager bound the lock")
		Eventually(func() error {
			return admin.Get(ctx, client.ObjectKey{Name: celmode.BindingName("report")}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{})
		}, 20*time.Second).Should(Succeed())

		By("the current epoch is accepted and consumed, a forged one denied by the policy")
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report",
			Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: map[string]string{fkv1.AnnotationEpoch: strconv.FormatInt(claim.Status.Epoch, 10)}}}
		// The apiserver loads new policies and bindings asynchronously.
		Expect(envtestutil.WaitFencingEnforced(ctx, admin, ns, "report", claim.Status.Epoch)).To(Succeed())
		Expect(admin.Create(ctx, cm)).To(Succeed())
		Expect(cm.Annotations).To(HaveKeyWithValue(fkv1.AnnotationFencedEpoch, strconv.FormatInt(claim.Status.Epoch, 10)))
		Expect(cm.Annotations).NotTo(HaveKey(fkv1.AnnotationEpoch))
		cm.Annotations[fkv1.AnnotationEpoch] = strconv.FormatInt(claim.Status.Epoch+1, 10)
		cm.Data = map[string]string{"x": "forged"}
		err = admin.Update(ctx, cm)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("fencekeeper.io/FutureEpoch: epoch"))
	})
})

// grantedClaim creates claim w1 for lock "report" in a new namespace and
// waits until it has an epoch.
func grantedClaim(prefix string) (string, *fkv1.FencedLease) {
	ns, err := envtestutil.NewNamespace(ctx, admin, prefix)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	claim := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w1"},
		Spec: fkv1.FencedLeaseSpec{LockName: "report", HolderIdentity: "W1", LeaseDurationSeconds: ptr.To(int32(300))}}
	// A claim made before the chart's claim-identity policy is in effect
	// records no identity, and its epoch is refused every write.
	ExpectWithOffset(1, envtestutil.WaitForClaimIdentity(ctx, admin)).To(Succeed())
	// The claim-identity policy needs the CRD's schema, which the apiserver
	// publishes a moment after the CRD is installed.
	EventuallyWithOffset(1, func() error { return admin.Create(ctx, claim) }, 20*time.Second).Should(Succeed())
	EventuallyWithOffset(1, func() int64 {
		_ = admin.Get(ctx, client.ObjectKeyFromObject(claim), claim)
		return claim.Status.Epoch
	}, 20*time.Second).Should(BeNumerically(">", 0))
	return ns, claim
}

func webhookConfig() *admissionregistrationv1.MutatingWebhookConfiguration {
	var vwc admissionregistrationv1.MutatingWebhookConfiguration
	ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Name: "fk-fencekeeper-fencing"}, &vwc)).To(Succeed())
	return &vwc
}

func byKindName(manifests string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, doc := range strings.Split(manifests, "\n---") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil || m == nil {
			continue
		}
		md, _ := m["metadata"].(map[string]any)
		out[fmt.Sprintf("%v/%v", m["kind"], md["name"])] = m
	}
	return out
}

func renewAsAdmin(ns, lock string) error {
	return leaseUpdate(ns, lock, func(l *coordinationv1.Lease) {
		now := metav1.NewMicroTime(time.Now().Add(time.Second))
		l.Spec.RenewTime = &now
	})
}

func tamperAsAdmin(ns, lock string, opts ...client.UpdateOption) error {
	return leaseUpdate(ns, lock, func(l *coordinationv1.Lease) { l.Annotations[fkv1.AnnotationEpoch] = "0" }, opts...)
}

func leaseUpdate(ns, lock string, mutate func(*coordinationv1.Lease), opts ...client.UpdateOption) error {
	var l coordinationv1.Lease
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &l); err != nil {
		return err
	}
	mutate(&l)
	return admin.Update(ctx, &l, opts...)
}

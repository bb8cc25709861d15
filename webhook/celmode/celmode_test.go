package celmode

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook"
)

func TestRenderRefusesNoGuardedKinds(t *testing.T) {
	if _, err := Render(Options{}); err == nil || !strings.Contains(err.Error(), "no guarded resources") {
		t.Fatalf("got %v, want an error naming the missing guarded resources", err)
	}
}

// The validating policies come before the mutating one (see Objects), and
// every policy matches exactly the guarded kinds.
func TestRenderOrderAndRules(t *testing.T) {
	g, err := webhook.ParseGuardedResources([]string{"configmaps", "reports.reports.example.com/v1"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Render(Options{Guarded: g, ExcludedNamespaces: []string{"kube-system"}})
	if err != nil {
		t.Fatal(err)
	}
	objs := p.Objects()
	if objs[len(objs)-1] != p.Mutating {
		t.Fatalf("the mutating policy is not applied last: %T", objs[len(objs)-1])
	}
	for _, rules := range [][]string{
		{p.Mutating.Spec.MatchConstraints.ResourceRules[0].Resources[0], p.Mutating.Spec.MatchConstraints.ResourceRules[1].Resources[0]},
		{p.Validating.Spec.MatchConstraints.ResourceRules[0].Resources[0], p.Validating.Spec.MatchConstraints.ResourceRules[1].Resources[0]},
		{p.Base.Spec.MatchConstraints.ResourceRules[0].Resources[0], p.Base.Spec.MatchConstraints.ResourceRules[1].Resources[0]},
	} {
		if rules[0] != "configmaps" || rules[1] != "reports" {
			t.Fatalf("resource rules %v", rules)
		}
	}
}

func TestBindingNameFitsEveryLockName(t *testing.T) {
	long := strings.Repeat("a", 250)
	if n := BindingName(long); len(n) > 253 || !strings.HasPrefix(n, bindingPrefix) || n == BindingName(long+"b") {
		t.Fatalf("BindingName of a long lock: %q", n)
	}
	if n := BindingName("report-2026-07"); n != "fencekeeper-lock-report-2026-07" {
		t.Fatalf("BindingName = %q", n)
	}
}

// Owned names what a webhook-mode manager deletes after a switch of modes:
// everything Install and Bindings make, and nothing else (the chart's own
// policies, another team's).
func TestOwned(t *testing.T) {
	g, err := webhook.ParseGuardedResources([]string{"configmaps"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Render(Options{Guarded: g})
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range append(p.Objects(), Bindings("report-2026-07").Objects()...) {
		if !Owned(obj) {
			t.Errorf("%T %s is not Owned", obj, obj.GetName())
		}
	}
	ours := map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue}
	for _, tc := range []struct {
		name   string
		labels map[string]string
	}{
		{"fencekeeper-managed-lease-guard", ours},
		{"fencekeeper-claim-identity", ours},
		{"fencekeeper-claim-break", ours},
		{"fencekeeper-fencing", map[string]string{fkv1.LabelManagedBy: "Helm"}},
		{"fencekeeper-lock-report-2026-07", nil},
		{"team-policy", ours},
	} {
		obj := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Labels: tc.labels}}
		if Owned(obj) {
			t.Errorf("%s (labels %v) is Owned", tc.name, tc.labels)
		}
	}
}

// CEL mode proves its bindings with a dry-run ConfigMap: without
// configmaps among the guarded kinds, no proof could ever come.
func TestRenderRequiresConfigMaps(t *testing.T) {
	g, err := webhook.ParseGuardedResources([]string{"reports.reports.example.com/v1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Render(Options{Guarded: g}); err == nil || !strings.Contains(err.Error(), "configmaps must be among the guarded resources") {
		t.Fatalf("got %v, want an error naming configmaps", err)
	}
}

// A proof goes to one instance: the endpoint as host, the manager's
// credentials, and TLS verifying the name the manager uses.
func TestInstanceConfig(t *testing.T) {
	for _, tc := range []struct{ host, serverName, wantHost, wantName string }{
		{"https://api.example.com:6443", "", "https://10.0.0.7:6443", "api.example.com"},
		{"https://10.96.0.1:443/", "", "https://10.0.0.7:6443", "10.96.0.1"},
		{"api.example.com", "", "https://10.0.0.7:6443", "api.example.com"},
		{"https://api.example.com", "kubernetes.default.svc", "https://10.0.0.7:6443", "kubernetes.default.svc"},
	} {
		cfg := &rest.Config{Host: tc.host, BearerToken: "t"}
		cfg.ServerName = tc.serverName
		got, err := instanceConfig(cfg, "10.0.0.7:6443")
		if err != nil {
			t.Fatal(err)
		}
		if got.Host != tc.wantHost || got.ServerName != tc.wantName || got.BearerToken != "t" || got.Timeout != ProbeTimeout {
			t.Errorf("%s: host %s serverName %s token %q timeout %v", tc.host, got.Host, got.ServerName, got.BearerToken, got.Timeout)
		}
		if cfg.Host != tc.host {
			t.Errorf("the manager's config changed: %s", cfg.Host)
		}
	}
}

func TestHTTPSPort(t *testing.T) {
	named := func(n string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: ptr.To(n), Port: ptr.To(p)}
	}
	if p, err := httpsPort([]discoveryv1.EndpointPort{named("https", 6443)}); err != nil || p != "6443" {
		t.Errorf("one https port: %q %v", p, err)
	}
	if p, err := httpsPort([]discoveryv1.EndpointPort{named("metrics", 1), named("https", 443)}); err != nil || p != "443" {
		t.Errorf("https among others: %q %v", p, err)
	}
	if _, err := httpsPort([]discoveryv1.EndpointPort{named("a", 1), named("b", 2)}); err == nil {
		t.Error("two ports, none https: no error")
	}
	if _, err := httpsPort(nil); err == nil {
		t.Error("no port: no error")
	}
}

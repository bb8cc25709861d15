package celmode

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

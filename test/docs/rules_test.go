package docs_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// rulesFile is the chart's alert rules as a plain Prometheus rules file
// (docs/operations.md#alerts links it); hack/sync-chart.sh writes it.
const rulesFile = "config/prometheus/fencekeeper-rules.yaml"

// TestPlainRulesAreTheChartRules renders the chart's PrometheusRule as
// hack/sync-chart.sh does (default thresholds, job="fencekeeper") and wants
// its groups to be exactly those of the plain rules file, which
// `promtool check rules` must accept. It needs bin/helm and bin/promtool
// (make tools), no control plane.
func TestPlainRulesAreTheChartRules(t *testing.T) {
	root := envtestutil.RepoRoot()
	helm := filepath.Join(envtestutil.BinDir(), "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("bin/helm is missing (run 'make tools'): %v", err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helm, "template", "fencekeeper", filepath.Join(root, "charts", "fencekeeper"), "-n", "fencekeeper-system",
		"--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
		"--set", "prometheusRule.enabled=true", "--set-string", `prometheusRule.selector=job="fencekeeper"`,
		// The chart renders only with an image; any will do for the rules.
		"--set", "image.repository=registry.example/fencekeeper/fencekeeper",
		"--show-only", "templates/prometheusrule.yaml")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	var pr struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &pr); err != nil {
		t.Fatalf("the rendered PrometheusRule: %v\n%s", err, out)
	}
	if pr.Kind != "PrometheusRule" || pr.Spec.Groups == nil {
		t.Fatalf("the chart rendered no PrometheusRule groups:\n%s", out)
	}

	path := filepath.Join(root, rulesFile)
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var plain map[string]any
	if err := yaml.Unmarshal(text, &plain); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if len(plain) != 1 || plain["groups"] == nil {
		t.Errorf("%s: want a Prometheus rules file (only groups: at the top), got the keys %v", rulesFile, keys(plain))
	}
	if !reflect.DeepEqual(plain["groups"], pr.Spec.Groups) {
		want, _ := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
		t.Errorf("%s differs from the chart's PrometheusRule (templates/prometheusrule.yaml); run 'make manifests'. The chart's rules:\n%s", rulesFile, want)
	}

	promtool := filepath.Join(envtestutil.BinDir(), "promtool")
	if _, err := os.Stat(promtool); err != nil {
		t.Fatalf("bin/promtool is missing (run 'make tools'): %v", err)
	}
	check, err := exec.Command(promtool, "check", "rules", "--lint=all", "--lint-fatal", path).CombinedOutput()
	if err != nil || !strings.Contains(string(check), "SUCCESS") {
		t.Errorf("promtool check rules %s: %v\n%s", rulesFile, err, check)
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

package chart

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var promtoolBin = filepath.Join(envtestutil.BinDir(), "promtool")

// expectedAlerts are the chart's alerts; docs/operations.md has a runbook
// section (### NAME under ## Alerts) for each.
var expectedAlerts = []string{
	"FencekeeperStaleTokenRejections",
	"FencekeeperOldestWaiterStuck",
	"FencekeeperWebhookErrors",
	"FencekeeperWebhookLatencyHigh",
	"FencekeeperManagerDown",
	"FencekeeperManagerReplicaDown",
	"FencekeeperExpirationsSpiking",
	"FencekeeperLockHeldTooLong",
}

// observability renders the chart with the dashboard and the PrometheusRule.
func observability() (dashboard map[string]any, rules []map[string]any) {
	out, errOut, err := helm("template", "fk", chartDir, "-n", "fencekeeper-system",
		"--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
		"--set", "dashboards.enabled=true", "--set", "prometheusRule.enabled=true")
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), errOut)
	objs := byKindName(out)
	cm := objs["ConfigMap/fk-fencekeeper-dashboard"]
	ExpectWithOffset(1, cm).NotTo(BeNil(), "the dashboard ConfigMap")
	ExpectWithOffset(1, cm["metadata"].(map[string]any)["labels"]).To(HaveKeyWithValue("grafana_dashboard", "1"))
	data := cm["data"].(map[string]any)["fencekeeper.json"].(string)
	ExpectWithOffset(1, json.Unmarshal([]byte(data), &dashboard)).To(Succeed())
	pr := objs["PrometheusRule/fk-fencekeeper"]
	ExpectWithOffset(1, pr).NotTo(BeNil(), "the PrometheusRule")
	for _, g := range pr["spec"].(map[string]any)["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			rules = append(rules, r.(map[string]any))
		}
	}
	return dashboard, rules
}

var _ = Describe("Observability: the dashboard and the alerts", Ordered, func() {
	var (
		dashboard map[string]any
		rules     []map[string]any
	)
	BeforeAll(func() { dashboard, rules = observability() })

	It("renders alert rules that promtool check rules accepts, each with a runbook section", func() {
		_, err := os.Stat(promtoolBin)
		Expect(err).NotTo(HaveOccurred(), "bin/promtool is missing: run 'make tools'")
		out, errOut, err := helm("template", "fk", chartDir, "-n", "fencekeeper-system",
			"--api-versions", "monitoring.coreos.com/v1/PrometheusRule", "--set", "prometheusRule.enabled=true",
			"--show-only", "templates/prometheusrule.yaml")
		Expect(err).NotTo(HaveOccurred(), errOut)
		var pr map[string]any
		Expect(yaml.Unmarshal([]byte(out), &pr)).To(Succeed())
		file := filepath.Join(GinkgoT().TempDir(), "rules.yaml")
		b, err := yaml.Marshal(map[string]any{"groups": pr["spec"].(map[string]any)["groups"]})
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(file, b, 0o600)).To(Succeed())
		out, errOut, err = run(nil, promtoolBin, "check", "rules", "--lint=all", "--lint-fatal", file)
		Expect(err).NotTo(HaveOccurred(), "promtool check rules:\n%s%s\nrules:\n%s", out, errOut, b)
		Expect(out).To(ContainSubstring(fmt.Sprintf("SUCCESS: %d rules found", len(expectedAlerts))))

		anchors := runbookAnchors()
		var names []string
		for _, r := range rules {
			name := r["alert"].(string)
			names = append(names, name)
			ann := r["annotations"].(map[string]any)
			Expect(ann).To(HaveKey("summary"), name)
			Expect(ann).To(HaveKey("description"), name)
			url, _ := ann["runbook_url"].(string)
			_, frag, _ := strings.Cut(url, "#")
			Expect(anchors).To(ContainElement(frag), "%s: runbook_url %q names no section of docs/operations.md's ## Alerts (%v)", name, url, anchors)
			Expect(r["labels"]).To(HaveKey("severity"), name)
		}
		Expect(names).To(ConsistOf(expectedAlerts))
	})

	It("fires (and stays quiet) as the runbook says: promtool test rules", func() {
		// The unit tests check the expressions; the annotations (checked by
		// check rules above) are left out so that expected alerts need only
		// their labels.
		dir := GinkgoT().TempDir()
		var bare []map[string]any
		for _, r := range rules {
			r = maps.Clone(r)
			delete(r, "annotations")
			bare = append(bare, r)
		}
		b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "fencekeeper", "rules": bare}}})
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o600)).To(Succeed())
		tests := strings.ReplaceAll(alertUnitTests, "$L", `job="fk-fencekeeper-metrics",namespace="fencekeeper-system"`)
		Expect(os.WriteFile(filepath.Join(dir, "tests.yaml"), []byte(tests), 0o600)).To(Succeed())
		out, errOut, err := run(nil, promtoolBin, "test", "rules", filepath.Join(dir, "tests.yaml"))
		Expect(err).NotTo(HaveOccurred(), "promtool test rules:\n%s%s", out, errOut)
	})

	It("references only metrics that the manager and the holder library export", func() {
		By("collecting the metric names of every panel, template variable and alert")
		var dashNames, alertNames []string
		walkPanels(dashboard["panels"], func(p map[string]any) {
			targets, _ := p["targets"].([]any)
			for _, t := range targets {
				if expr, ok := t.(map[string]any)["expr"].(string); ok {
					dashNames = append(dashNames, metricNames(expr)...)
				}
			}
		})
		for _, v := range dashboard["templating"].(map[string]any)["list"].([]any) {
			if q, ok := v.(map[string]any)["definition"].(string); ok {
				if m := regexp.MustCompile(`label_values\(\s*([^,)]+)`).FindStringSubmatch(q); m != nil {
					dashNames = append(dashNames, metricNames(m[1])...)
				}
			}
		}
		for _, r := range rules {
			alertNames = append(alertNames, metricNames(r["expr"].(string))...)
		}
		// The extraction must find what the panels are about (a guard against
		// a tokenizer that silently drops names).
		Expect(dashNames).To(ContainElements("fencekeeper_grants_total", "fencekeeper_expirations_total",
			"fencekeeper_acquire_wait_seconds_bucket", "fencekeeper_hold_duration_seconds_bucket",
			"fencekeeper_waiters", "fencekeeper_oldest_waiter_age_seconds", "fencekeeper_contended_locks",
			"fencekeeper_admission_decisions_total", "fencekeeper_admission_duration_seconds_bucket",
			"fencekeeper_client_renewal_duration_seconds_bucket"))
		Expect(alertNames).To(ContainElements("up", "fencekeeper_admission_decisions_total",
			"fencekeeper_oldest_waiter_age_seconds", "fencekeeper_expirations_total"))

		By("exercising a manager process: a grant, a waiter, a release, a stale write; scraping its /metrics")
		exported := managerMetricFamilies()

		By("reading the holder library's metric descriptors")
		holder := holderLibraryMetricFamilies()

		var missing []string
		check := func(where string, names []string) {
			for _, n := range dedupe(names) {
				if n == "up" {
					continue // Prometheus's own
				}
				known := exported
				if strings.HasPrefix(n, "fencekeeper_client_") {
					known = holder
				}
				if !exports(known, n) {
					missing = append(missing, fmt.Sprintf("%s (%s)", n, where))
				}
			}
		}
		check("dashboard", dashNames)
		check("alerts", alertNames)
		sort.Strings(missing)
		Expect(missing).To(BeEmpty(), "referenced but not exported (manager: scraped /metrics; fencekeeper_client_*: pkg/lease.MustRegisterMetrics):\n  %s",
			strings.Join(missing, "\n  "))
	})
})

// walkPanels calls f on every panel, including those nested in rows.
func walkPanels(v any, f func(map[string]any)) {
	list, _ := v.([]any)
	for _, p := range list {
		pm, ok := p.(map[string]any)
		if !ok {
			continue
		}
		f(pm)
		walkPanels(pm["panels"], f)
	}
}

var (
	promqlStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping  = regexp.MustCompile(`(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlOffset    = regexp.MustCompile(`(?i)\boffset\s+-?[0-9a-z]+`)
	promqlTokens    = regexp.MustCompile(`[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promqlNonMetric = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "by": true, "without": true,
		"on": true, "ignoring": true, "group_left": true, "group_right": true, "offset": true, "inf": true, "nan": true, "atan2": true}
)

// metricNames returns the metric names a PromQL expression (or a Grafana
// target's, with $variables) selects: identifiers that are not inside
// strings, label matchers or ranges, not functions or aggregations (followed
// by "(") and not keywords.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlOffset.ReplaceAllString(s, " ")
	var out []string
	for _, m := range promqlTokens.FindAllStringSubmatch(s, -1) {
		tok := m[0]
		if m[1] != "" || tok[0] >= '0' && tok[0] <= '9' || promqlNonMetric[strings.ToLower(tok)] {
			continue
		}
		out = append(out, tok)
	}
	return out
}

// exports reports whether a family list (name -> type) has the series name:
// the family itself, or a histogram's or summary's _bucket, _sum, _count.
func exports(families map[string]string, name string) bool {
	if _, ok := families[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch families[base] {
		case "histogram":
			return true
		case "summary":
			return suffix != "_bucket"
		}
	}
	return false
}

func dedupe(names []string) []string {
	out := slices.Clone(names)
	sort.Strings(out)
	return slices.Compact(out)
}

// runbookAnchors returns the GitHub anchors of the ### sections under
// "## Alerts" in docs/operations.md.
func runbookAnchors() []string {
	f, err := os.Open(filepath.Join(envtestutil.RepoRoot(), "docs", "operations.md"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer f.Close()
	var anchors []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = strings.TrimSpace(line[3:]) == "Alerts"
		case in && strings.HasPrefix(line, "### "):
			a := strings.ToLower(strings.TrimSpace(line[4:]))
			a = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(a, "")
			anchors = append(anchors, strings.ReplaceAll(a, " ", "-"))
		}
	}
	ExpectWithOffset(1, sc.Err()).NotTo(HaveOccurred())
	return anchors
}

// holderLibraryMetricFamilies returns the names and types of the metrics
// lease.MustRegisterMetrics registers. A Vec with no children yet gathers
// nothing, so its name comes from its descriptor and its type from its Go
// type; the plain metrics are gathered, with their types.
func holderLibraryMetricFamilies() map[string]string {
	out := map[string]string{}
	rec := &recordingRegisterer{}
	lease.MustRegisterMetrics(rec)
	descName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descName.FindStringSubmatch(d.String())
			ExpectWithOffset(1, m).NotTo(BeNil(), d.String())
			out[m[1]] = vecKind(c)
		}
	}
	reg := prometheus.NewRegistry()
	lease.MustRegisterMetrics(reg)
	mfs, err := reg.Gather()
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		out[mf.GetName()] = strings.ToLower(mf.GetType().String())
	}
	return out
}

// vecKind names the metric type of a client_golang Vec ("untyped" for
// anything else: those are gathered).
func vecKind(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	}
	return "untyped"
}

// recordingRegisterer is a prometheus.Registerer that keeps what is
// registered with it.
type recordingRegisterer struct{ collectors []prometheus.Collector }

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recordingRegisterer) Unregister(prometheus.Collector) bool { return false }

// managerMetricFamilies runs the manager binary against the suite's
// apiserver, makes it grant a lock, queue a waiter, release, grant again and
// refuse a stale write, and returns the metric families (name -> type) its
// /metrics showed at any point.
func managerMetricFamilies() map[string]string {
	crdPaths := []string{filepath.Join(envtestutil.RepoRoot(), "config", "crd", "bases")}
	err := admin.Get(ctx, client.ObjectKey{Name: "fencedleases.fencekeeper.io"}, &apiextensionsv1.CustomResourceDefinition{})
	if apierrors.IsNotFound(err) {
		// The chart's tests install the CRD with helm: leave none behind.
		_, err = envtest.InstallCRDs(adminCfg, envtest.CRDInstallOptions{Paths: crdPaths, ErrorIfPathMissing: true})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			Expect(envtest.UninstallCRDs(adminCfg, envtest.CRDInstallOptions{Paths: crdPaths})).To(Succeed())
			Eventually(func() bool {
				return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKey{Name: "fencedleases.fencekeeper.io"}, &apiextensionsv1.CustomResourceDefinition{}))
			}, 60*time.Second).Should(BeTrue())
		})
	} else {
		Expect(err).NotTo(HaveOccurred())
	}

	// The suite's environment registers no webhook: register one at a local
	// port, and point StartManagerProcess at it.
	wh := envtestutil.LocalWebhook(env, []string{"configmaps"})
	Expect(wh.Install(adminCfg)).To(Succeed())
	saved := env.WebhookInstallOptions
	env.WebhookInstallOptions.LocalServingPort = wh.LocalServingPort
	env.WebhookInstallOptions.LocalServingCertDir = wh.LocalServingCertDir
	env.WebhookInstallOptions.LocalServingHost = wh.LocalServingHost
	DeferCleanup(func() {
		env.WebhookInstallOptions = saved
		for _, w := range wh.MutatingWebhooks {
			_ = admin.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: w.Name}})
		}
		_ = wh.Cleanup()
	})

	// Claims record who makes them (without that, every write presenting
	// their epoch is refused), as the chart's policies would have them.
	removeIdentity, err := envtestutil.InstallClaimIdentity(ctx, adminCfg, envtestutil.ManagerUser)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(removeIdentity(ctx)).To(Succeed()) })

	port := freePort()
	p, err := envtestutil.StartManagerProcess(ctx, env, admin, GinkgoT().TempDir(), GinkgoWriter,
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", port))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(p.Stop)

	families := map[string]string{}
	scrape := func() {
		GinkgoHelper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK), string(b))
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
				families[f[2]] = f[3]
			}
		}
	}
	// scrapeFor scrapes for a while (gauges may be set on a later
	// reconcile), until every name in want is there.
	scrapeFor := func(d time.Duration, want ...string) {
		GinkgoHelper()
		for deadline := time.Now().Add(d); ; time.Sleep(250 * time.Millisecond) {
			scrape()
			if time.Now().After(deadline) || !slices.ContainsFunc(want, func(n string) bool { _, ok := families[n]; return !ok }) {
				return
			}
		}
	}

	ns, err := envtestutil.NewNamespace(ctx, admin, "observability")
	Expect(err).NotTo(HaveOccurred())
	claim := func(name, holder string) *fkv1.FencedLease {
		GinkgoHelper()
		c := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: fkv1.FencedLeaseSpec{LockName: "report", HolderIdentity: holder, LeaseDurationSeconds: ptr.To(int32(300))}}
		Expect(admin.Create(ctx, c)).To(Succeed())
		return c
	}
	waitPhase := func(c *fkv1.FencedLease, phase fkv1.FencedLeasePhase) {
		GinkgoHelper()
		Eventually(func() fkv1.FencedLeasePhase {
			_ = admin.Get(ctx, client.ObjectKeyFromObject(c), c)
			return c.Status.Phase
		}, 30*time.Second).Should(Equal(phase))
	}

	w1 := claim("w1", "W1")
	waitPhase(w1, fkv1.PhaseHeld)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report",
		Labels: map[string]string{fkv1.LabelLock: "report"}, Annotations: map[string]string{fkv1.AnnotationEpoch: strconv.FormatInt(w1.Status.Epoch, 10)}},
		Data: map[string]string{"by": "W1"}}
	Expect(admin.Create(ctx, cm)).To(Succeed())

	By("W2 waits: the waiter gauges have something to show")
	w2 := claim("w2", "W2")
	waitPhase(w2, fkv1.PhasePending)
	scrapeFor(10*time.Second, "fencekeeper_waiters", "fencekeeper_oldest_waiter_age_seconds", "fencekeeper_contended_locks")

	By("W1 releases, W2 is granted and writes; W1's late write is refused as stale")
	Expect(admin.Delete(ctx, w1)).To(Succeed())
	waitPhase(w2, fkv1.PhaseHeld)
	Expect(admin.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	cm.Annotations[fkv1.AnnotationEpoch] = strconv.FormatInt(w2.Status.Epoch, 10)
	cm.Data = map[string]string{"by": "W2"}
	Expect(admin.Update(ctx, cm)).To(Succeed())
	Expect(admin.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	cm.Annotations[fkv1.AnnotationEpoch] = strconv.FormatInt(w1.Status.Epoch, 10)
	cm.Data = map[string]string{"by": "W1, late"}
	err = admin.Update(ctx, cm)
	Expect(err).To(HaveOccurred(), "W1's stale write was admitted")
	Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "refused as stale: %v", err)
	scrapeFor(10*time.Second, "fencekeeper_admission_decisions_total", "fencekeeper_admission_duration_seconds",
		"fencekeeper_acquire_wait_seconds", "fencekeeper_hold_duration_seconds")
	return families
}

// alertUnitTests are promtool rule unit tests of the chart's alerts with
// their default thresholds; $L stands for the manager's series selector.
const alertUnitTests = `rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - name: a hold far past the usual (p99 of ended holds) fires; a long but usual one does not
    interval: 1m
    input_series:
      - series: 'fencekeeper_longest_hold_seconds{$L}'
        values: '3000+60x60'
      - series: 'fencekeeper_hold_duration_seconds_bucket{$L,ended="released",le="60"}'
        values: '0+10x60'
      - series: 'fencekeeper_hold_duration_seconds_bucket{$L,ended="released",le="300"}'
        values: '0+10x60'
      - series: 'fencekeeper_hold_duration_seconds_bucket{$L,ended="released",le="+Inf"}'
        values: '0+10x60'
    alert_rule_test:
      - {eval_time: 5m, alertname: FencekeeperLockHeldTooLong, exp_alerts: []}
      - {eval_time: 30m, alertname: FencekeeperLockHeldTooLong, exp_alerts: [{exp_labels: {severity: warning}}]}
  - name: long holds that are usual do not fire
    interval: 1m
    input_series:
      - series: 'fencekeeper_longest_hold_seconds{$L}'
        values: '7200x60'
      - series: 'fencekeeper_hold_duration_seconds_bucket{$L,ended="released",le="3600"}'
        values: '0x60'
      - series: 'fencekeeper_hold_duration_seconds_bucket{$L,ended="released",le="86400"}'
        values: '0+10x60'
      - series: 'fencekeeper_hold_duration_seconds_bucket{$L,ended="released",le="+Inf"}'
        values: '0+10x60'
    alert_rule_test:
      - {eval_time: 40m, alertname: FencekeeperLockHeldTooLong, exp_alerts: []}
  - name: stale-token rejections fire; accepted writes do not count
    interval: 1m
    input_series:
      - series: 'fencekeeper_admission_decisions_total{$L,allowed="false",reason="StaleEpoch"}'
        values: '0+1x40'
      - series: 'fencekeeper_admission_decisions_total{$L,allowed="true",reason="EpochAccepted"}'
        values: '0+100x40'
    alert_rule_test:
      - {eval_time: 25m, alertname: FencekeeperStaleTokenRejections, exp_alerts: [{exp_labels: {severity: warning}}]}
      - {eval_time: 25m, alertname: FencekeeperWebhookErrors, exp_alerts: []}
  - name: a few stale-token rejections do not fire
    interval: 1m
    input_series:
      - series: 'fencekeeper_admission_decisions_total{$L,allowed="false",reason="NotCurrentEpoch"}'
        values: '0+0.2x40'
    alert_rule_test:
      - {eval_time: 25m, alertname: FencekeeperStaleTokenRejections, exp_alerts: []}
  - name: the oldest waiter past 20 TTLs fires; a young one does not
    interval: 1m
    input_series:
      - series: 'fencekeeper_oldest_waiter_age_seconds{$L}'
        values: '0+60x20 0x20'
    alert_rule_test:
      - {eval_time: 15m, alertname: FencekeeperOldestWaiterStuck, exp_alerts: [{exp_labels: {severity: warning}}]}
      - {eval_time: 35m, alertname: FencekeeperOldestWaiterStuck, exp_alerts: []}
  - name: webhook errors above 5% fire
    interval: 1m
    input_series:
      - series: 'fencekeeper_admission_decisions_total{$L,allowed="false",reason="LockReadError"}'
        values: '0+10x20'
      - series: 'fencekeeper_admission_decisions_total{$L,allowed="true",reason="EpochAccepted"}'
        values: '0+10x20'
    alert_rule_test:
      - {eval_time: 15m, alertname: FencekeeperWebhookErrors, exp_alerts: [{exp_labels: {severity: critical}}]}
  - name: p99 webhook latency above the budget fires
    interval: 1m
    input_series:
      - series: 'fencekeeper_admission_duration_seconds_bucket{$L,allowed="true",le="0.25"}'
        values: '0x30'
      - series: 'fencekeeper_admission_duration_seconds_bucket{$L,allowed="true",le="1"}'
        values: '0+10x30'
      - series: 'fencekeeper_admission_duration_seconds_bucket{$L,allowed="true",le="+Inf"}'
        values: '0+10x30'
    alert_rule_test:
      - {eval_time: 20m, alertname: FencekeeperWebhookLatencyHigh, exp_alerts: [{exp_labels: {severity: warning}}]}
  - name: no manager scraped at all fires ManagerDown
    interval: 1m
    input_series:
      - series: 'fencekeeper_grants_total{$L}'
        values: '0x20'
    alert_rule_test:
      - {eval_time: 10m, alertname: FencekeeperManagerDown, exp_alerts: [{exp_labels: {severity: critical}}]}
  - name: one replica down fires ReplicaDown, not ManagerDown
    interval: 1m
    input_series:
      - series: 'up{$L,instance="a"}'
        values: '1x30'
      - series: 'up{$L,instance="b"}'
        values: '0x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: FencekeeperManagerReplicaDown
        exp_alerts: [{exp_labels: {severity: warning, job: fk-fencekeeper-metrics, namespace: fencekeeper-system, instance: b}}]
      - {eval_time: 20m, alertname: FencekeeperManagerDown, exp_alerts: []}
  - name: every replica down fires ManagerDown
    interval: 1m
    input_series:
      - series: 'up{$L,instance="a"}'
        values: '0x30'
      - series: 'up{$L,instance="b"}'
        values: '0x30'
    alert_rule_test:
      - {eval_time: 10m, alertname: FencekeeperManagerDown, exp_alerts: [{exp_labels: {severity: critical}}]}
  - name: an expiration spike fires over a steady rate
    interval: 1m
    input_series:
      - series: 'fencekeeper_expirations_total{$L,instance="a"}'
        values: '0+0.1x70 12+20x15'
      - series: 'fencekeeper_expirations_total{$L,instance="b"}'
        values: '0+2x90'
    alert_rule_test:
      - {eval_time: 82m, alertname: FencekeeperExpirationsSpiking, exp_alerts: [{exp_labels: {severity: warning}}]}
  - name: a steady expiration rate does not fire
    interval: 1m
    input_series:
      - series: 'fencekeeper_expirations_total{$L}'
        values: '0+2x90'
    alert_rule_test:
      - {eval_time: 85m, alertname: FencekeeperExpirationsSpiking, exp_alerts: []}
`

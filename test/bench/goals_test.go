// Pure tests of the goals table: no control plane, no clock. They check the
// table's shape (unique keys, one printed row per goal, key names that agree
// with their constant denominators), that report.json keeps its keys, and
// that each verdict flips when a synthetic figure crosses its goal.
package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// okReport meets every goal exactly at its limit. Its latencies have 200
// samples (a p99) and a max far above it, so a ratio that took the max
// instead of the p99 would fail.
func okReport() report {
	l := func(p50, p99 float64) latency {
		return latency{P50: p50, P99: p99, Min: p50 / 2, Max: p99 + 1000, N: 200}
	}
	return report{
		FloorMS: l(2, 10),
		FloorByPhaseMS: map[string]latency{"floor": l(2, 10), "grant_new": l(2, 10), "grant_existing": l(2, 10),
			"handoff_waiters_1": l(2, 10), "handoff_waiters_10": l(2, 10), "handoff_waiters_1000": l(2, 10),
			"semaphore_grant": l(2, 10), "semaphore_handoff": l(2, 10), "semaphore_admission": l(2, 10)},
		GrantMS: l(4, 20), GrantNewMS: l(4, 20), GrantExistingMS: l(3, 20), GrantExistingLeaseSeenMS: l(7, 40),
		HandoffMS:           map[string]latency{"waiters_1": l(5, 30), "waiters_10": l(5, 35), "waiters_1000": l(5, 35)},
		TakeoverOvershootMS: l(50, 100), ClientgoTakeoverOvershootMS: latency{P50: -100, Min: -800, Max: 150, N: 20}, ClientgoTakeoverBeforeTTLShare: 0.35,
		ElectionTakeoverOvershootMS: l(50, 100),
		GracefulHandoffMS:           l(10, 20), ClientgoGracefulHandoffMS: l(200, 400), EtcdMutexHandoffMS: l(1, 3),
		WritesPerGrant: 3, WritesPerGrantNew: 3, WritesPerGrantExisting: 2, WritesPerHandoff: 2, NoopResyncWrites: 0, PodHeldSteadyWrites: 0, WritesPerRenewal: 1,
		GrantsPerS: 8, ChainFloorGrantsPerS: 10, FloorUpdatesPerS: 20,
		GuardedUpdateMS: l(5, 13), UnguardedUpdateMS: l(4, 10), WebhookHandlerMeanMS: 0.1,
		GuardedUpdateCELMS: l(5, 13), UnguardedUpdateCELMS: l(4, 10),
		GuardedUpdateCELByBindings:   map[string]latency{"bindings_10": l(5, 13), "bindings_1000": l(5, 15), "bindings_5000": l(5, 20)},
		UnguardedUpdateCELByBindings: map[string]latency{"bindings_10": l(4, 10), "bindings_1000": l(4, 10), "bindings_5000": l(4, 10)},
		CELByBindings:                []celPoint{{Bindings: 10, GuardedMS: l(5, 13), UnguardedMS: l(4, 10), GuardedOverUnguarded: 1.3}},
		RSSMiB10k:                    150, RSSMiB50k: 600, ScaleCurve: []scalePoint{{Claims: 50000, Locks: 25000, RSSMiB: 600, HandoffP99MS: 35, Correct: true}}, ScaleClaims: 10000, ScaleLocks: 5000, ScaleCorrect: true,
		SemaphoreGrantMS:            map[string]latency{"permits_held_0": l(8, 30), "permits_held_1": l(8, 30), "permits_held_2": l(9, 40), "mutex": l(6, 20)},
		SemaphoreGrantLeaseSeenMS:   map[string]latency{"permits_held_0": l(6, 25), "permits_held_1": l(6, 25), "permits_held_2": l(6, 25), "mutex": l(5, 15)},
		SemaphoreHandoffMS:          map[string]latency{"semaphore": l(10, 30), "mutex": l(5, 20)},
		SemaphoreHandoffLeaseSeenMS: map[string]latency{"semaphore": l(8, 25), "mutex": l(4, 15)},
		SemaphoreAdmissionMS:        map[string]latency{"semaphore": l(5, 15), "mutex": l(5, 12), "unguarded": l(4, 10)},
		Ratios:                      map[string]float64{},
		GrantLeaseSeenMS:            l(10, 60), HandoffLeaseSeenMS: map[string]latency{"waiters_1": l(3, 20), "waiters_1000": l(3, 20)},
		RequestCostMS: map[string]map[string]float64{
			"floor":             {"PUT leases": 2},
			"grant_new":         {"POST fencedleases": 4, "POST leases": 3, "PUT leases": 2, "PATCH fencedleases/status": 5, "POST events": 3},
			"grant_existing":    {"POST fencedleases": 4, "PUT leases": 3, "PATCH fencedleases/status": 5, "POST events": 3},
			"handoff_waiters_1": {"DELETE fencedleases": 4, "PUT leases": 2, "PATCH fencedleases/status": 5},
		},
	}
}

func goalByFigure(t *testing.T, figure string) goal {
	t.Helper()
	for _, g := range goals {
		if g.figure == figure {
			return g
		}
	}
	t.Fatalf("no goal %q", figure)
	return goal{}
}

func TestGoalKeysAndFiguresUnique(t *testing.T) {
	keys, figures := map[string]bool{}, map[string]bool{}
	for _, g := range goals {
		if g.key != "" && keys[g.key] {
			t.Errorf("key %q twice", g.key)
		}
		if figures[g.figure] {
			t.Errorf("figure %q twice", g.figure)
		}
		keys[g.key], figures[g.figure] = true, true
		if strings.Contains(strings.ToLower(g.figure+g.key+g.target), "revision") {
			t.Errorf("%s: the revision read is gone (DESIGN §7 rev. 3)", g.figure)
		}
		if g.key != "" && g.num == nil {
			t.Errorf("%s: a key but no ratio", g.figure)
		}
		if (g.num == nil) != (g.den == nil) {
			t.Errorf("%s: num and den must be set together", g.figure)
		}
		if judged := g.cmp != reported; judged != (strings.Count(g.target, "%g") == 1) || strings.Count(g.target, "%") > 1 {
			t.Errorf("%s: target %q: a judged goal prints its bound once (%%g), a reported one none", g.figure, g.target)
		}
	}
}

// A key that names a constant denominator ("..._over_150", "..._over_100ms")
// must divide by that constant, so a key cannot keep an old goal's number.
func TestKeysNameTheirConstantDenominator(t *testing.T) {
	re := regexp.MustCompile(`_over_(\d+)(ms)?$`)
	for _, g := range goals {
		m := re.FindStringSubmatch(g.key)
		if m == nil {
			continue
		}
		want, _ := strconv.ParseFloat(m[1], 64)
		if got := g.den(report{}); got != want {
			t.Errorf("%s divides by %g", g.key, got)
		}
	}
}

func TestReportJSONKeys(t *testing.T) {
	r := okReport()
	ratios(&r)
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var top []string
	for k := range m {
		top = append(top, k)
	}
	sort.Strings(top)
	wantTop := []string{"cel_by_bindings", "chain_floor_grants_per_s", "chain_floor_throughput_breakdown", "chain_floor_with_events_grants_per_s", "chain_floor_with_events_throughput_breakdown", "clientgo_graceful_handoff_ms", "clientgo_takeover_before_ttl_share", "clientgo_takeover_overshoot_ms",
		"current_staleness_window_ms", "election_takeover_burst_overshoot_ms", "election_takeover_burst_phases_ms", "election_takeover_overshoot_ms", "election_takeover_phases_ms", "etcd_mutex_handoff_ms", "floor_by_phase_ms", "floor_ms", "floor_throughput_breakdown", "floor_updates_per_s",
		"graceful_handoff_ms", "grant_existing_lease_seen_ms", "grant_existing_ms", "grant_lease_seen_ms", "grant_ms", "grant_new_ms", "grants_per_s",
		"guarded_update_cel_by_bindings_ms", "guarded_update_cel_ms", "guarded_update_ms", "handoff_lease_seen_ms", "handoff_ms", "noop_resync_writes", "pod_held_steady_writes", "quick", "ratios", "request_cost_ms", "rss_mib_10k", "rss_mib_50k", "scale_all_grants_correct",
		"scale_claims", "scale_curve", "scale_earlier_claims", "scale_locks",
		"semaphore_admission_ms", "semaphore_grant_lease_seen_ms", "semaphore_grant_ms", "semaphore_handoff_lease_seen_ms", "semaphore_handoff_ms",
		"stale_refused_after_release_ms", "takeover_burst_overshoot_ms", "takeover_overshoot_ms", "throughput_breakdown", "unguarded_update_cel_by_bindings_ms", "unguarded_update_cel_ms", "unguarded_update_ms", "webhook_call_mean_ms", "webhook_handler_mean_ms", "webhook_server_mean_ms",
		"writes_per_grant", "writes_per_grant_existing", "writes_per_grant_new", "writes_per_handoff", "writes_per_renewal"}
	if !slices.Equal(top, wantTop) {
		t.Errorf("top-level keys\n got %v\nwant %v", top, wantTop)
	}
	var got, want []string
	for k := range r.Ratios {
		got = append(got, k)
	}
	for _, g := range goals {
		if g.key != "" {
			want = append(want, g.key)
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("ratios keys %v, goals' keys %v", got, want)
	}
}

func TestPrintedRowsComeFromGoals(t *testing.T) {
	var buf bytes.Buffer
	printTable(&buf, okReport())
	var rows [][]string
	for _, line := range strings.Split(buf.String(), "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| figure |") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		rows = append(rows, cells)
	}
	if len(rows) != len(goals) {
		t.Fatalf("%d rows printed, %d goals", len(rows), len(goals))
	}
	for i, g := range goals {
		if rows[i][0] != g.figure || rows[i][2] != g.goalText(okReport()) {
			t.Errorf("row %d is %q, goal %q %q", i, rows[i], g.figure, g.goalText(okReport()))
		}
		if strings.Contains(rows[i][2], "%!") {
			t.Errorf("row %d: bad goal format %q", i, rows[i][2])
		}
		want := "yes"
		if g.cmp == reported {
			want = "-"
		}
		if rows[i][4] != want {
			t.Errorf("%s: met? is %q on a report at every limit, want %q", g.figure, rows[i][4], want)
		}
	}
}

// Each case moves one figure just past its goal: that goal's verdict flips
// to not met and every other goal stays met.
func TestVerdictFlipsAtTheLimit(t *testing.T) {
	cases := []struct {
		figure string
		cross  func(r *report)
	}{
		{"grant_existing_ms p50 (the Lease names the claim)", func(r *report) { r.GrantExistingLeaseSeenMS.P50 = 7.01 }},
		{"grant_existing_ms p99 (the Lease names the claim)", func(r *report) { r.GrantExistingLeaseSeenMS.P99 = 40.01 }},
		{"grant_existing_ms p99 (the Lease names the claim)", func(r *report) { r.FloorByPhaseMS["grant_existing"] = latency{P50: 2, P99: 9.99, Max: 1000, N: 200} }},
		{"grant_new_ms p50 (the Lease names the claim)", func(r *report) { r.GrantLeaseSeenMS.P50 = 10.01 }},
		{"grant_new_ms p99 (the Lease names the claim)", func(r *report) { r.GrantLeaseSeenMS.P99 = 60.01 }},
		// Each phase is judged against its own floor, not another's.
		{"grant_new_ms p50 (the Lease names the claim)", func(r *report) { r.FloorByPhaseMS["grant_new"] = latency{P50: 1.99, P99: 10, Max: 1000, N: 200} }},
		{"handoff_ms waiters_1", func(r *report) { r.HandoffMS["waiters_1"] = latency{P50: 5, P99: 30.01, Max: 1000, N: 200} }},
		{"handoff_ms waiters_10", func(r *report) { r.HandoffMS["waiters_10"] = latency{P50: 5, P99: 35.01, Max: 1000, N: 200} }},
		{"handoff_ms waiters_1000", func(r *report) { r.HandoffMS["waiters_1000"] = latency{P50: 5, P99: 35.01, Max: 1000, N: 200} }},
		{"takeover_overshoot_ms", func(r *report) { r.TakeoverOvershootMS.P99 = 100.01 }},
		{"election_takeover_overshoot_ms (fenced election)", func(r *report) { r.ElectionTakeoverOvershootMS.P99 = 100.01 }},
		{"graceful_handoff_ms (fenced election)", func(r *report) { r.GracefulHandoffMS.P50 = 10.01 }},
		{"clientgo_graceful_handoff_ms (ReleaseOnCancel)", func(r *report) { r.ClientgoGracefulHandoffMS.P99 = 399.9 }},
		{"writes_per_grant_existing", func(r *report) { r.WritesPerGrantExisting = 2.01 }},
		{"writes_per_grant (new lock)", func(r *report) { r.WritesPerGrant = 3.01 }},
		{"writes_per_handoff (1000 waiters)", func(r *report) { r.WritesPerHandoff = 2.01 }},
		{"noop_resync_writes", func(r *report) { r.NoopResyncWrites = 1 }},
		{"pod_held_steady_writes", func(r *report) { r.PodHeldSteadyWrites = 1 }},
		{"writes_per_renewal", func(r *report) { r.WritesPerRenewal = 1.1 }},
		{"grants_per_s", func(r *report) { r.GrantsPerS = 7.99 }},
		{"grants_per_s", func(r *report) { r.ChainFloorGrantsPerS = 10.01 }},
		{"guarded_update_ms", func(r *report) { r.GuardedUpdateMS.P99 = 13.01 }},
		{"guarded_update_cel_ms, 10 locks bound", func(r *report) {
			r.GuardedUpdateCELByBindings["bindings_10"] = latency{P50: 5, P99: 13.01, Max: 1000, N: 200}
		}},
		{"guarded_update_cel_ms, 5,000 locks bound", func(r *report) {
			r.GuardedUpdateCELByBindings["bindings_5000"] = latency{P50: 5, P99: 20.01, Max: 1000, N: 200}
		}},
		{"rss_mib_10k", func(r *report) { r.RSSMiB10k = 150.1 }},
		{"rss_mib_50k", func(r *report) { r.RSSMiB50k = 600.1 }},
		{"scale_curve handoff at 50,000 claims", func(r *report) {
			r.ScaleCurve = []scalePoint{{Claims: 50000, Locks: 25000, RSSMiB: 600, HandoffP99MS: 35.01, Correct: true}} // a copy: base keeps its own
		}},
		{"rss_mib_10k", func(r *report) { r.ScaleCorrect = false }},
		{"grant_new_ms p50 (the Lease names the claim)", func(r *report) {
			r.GrantLeaseSeenMS.P50 = 0
			r.FloorByPhaseMS["grant_new"] = latency{P99: 10, Max: 1000, N: 200}
		}}, // no ratio: not met
	}
	base := okReport()
	for _, g := range goals {
		if met, _ := g.met(base); !met {
			t.Fatalf("%s: not met at its limit (ratio %v)", g.figure, g.ratio(base))
		}
	}
	for _, tc := range cases {
		r := okReport()
		tc.cross(&r)
		for _, g := range goals {
			met, judged := g.met(r)
			if g.figure == tc.figure {
				if !judged || met {
					t.Errorf("%s: still met after crossing (ratio %v)", g.figure, g.ratio(r))
				}
			} else if !met {
				t.Errorf("crossing %s also failed %s", tc.figure, g.figure)
			}
		}
	}
}

// A figure this run did not measure (the 50k scale point without
// BENCH_SCALE_CURVE) is printed as such and never judged met.
func TestUnmeasuredGoalIsNotJudged(t *testing.T) {
	r := okReport()
	r.RSSMiB50k = 0
	g := goalByFigure(t, "rss_mib_50k")
	if met, judged := g.met(r); judged || !met {
		t.Fatalf("unmeasured rss_mib_50k: met=%v judged=%v, want a reported-only row", met, judged)
	}
	var b bytes.Buffer
	printTable(&b, r)
	if !strings.Contains(b.String(), "| rss_mib_50k | not measured") {
		t.Fatalf("the table does not say rss_mib_50k was not measured:\n%s", b.String())
	}
	// A quick run's CEL curve stops at 1,000 locks: the 5,000 rows say so
	// and nothing about a max.
	r.GuardedUpdateCELByBindings["bindings_5000"], r.UnguardedUpdateCELByBindings["bindings_5000"] = latency{}, latency{}
	r.UnguardedUpdateCELMS.N = 100
	for _, f := range []string{"guarded_update_cel_ms, 5,000 locks bound", "unguarded_update_cel_ms, 5,000 locks bound"} {
		g := goalByFigure(t, f)
		if _, judged := g.met(r); judged || strings.Contains(g.goalText(r), "max") || !strings.HasPrefix(g.value(r), "not measured") {
			t.Errorf("%s unmeasured: judged=%v, %q, %q", f, judged, g.goalText(r), g.value(r))
		}
	}
}

// The chains sum their own requests' server times (and nothing else the
// phase served), over the floor request's; a request the phase did not
// serve makes the chain unmeasured (0), never a smaller sum.
func TestChains(t *testing.T) {
	r := okReport()
	for figure, want := range map[string]float64{
		"grant chain, new lock: server time of its requests":      (4 + 3 + 2 + 5) / 2.0,
		"grant chain, existing lock: server time of its requests": (4 + 3 + 5) / 2.0,
		"grant chain, existing lock, without the status patch":    (4 + 3) / 2.0,
		"handoff chain: server time of its requests (1 waiter)":   (4 + 2 + 5) / 2.0,
		"handoff chain without the status patch":                  (4 + 2) / 2.0,
	} {
		if got := goalByFigure(t, figure).ratio(r); got != want {
			t.Errorf("%s: ratio %v, want %v", figure, got, want)
		}
	}
	if got, want := chainText("grant_existing", grantExistingChain, statusPatch)(r), "POST fencedleases 4.00 + PUT leases 3.00 = 7.00 ms vs the floor's PUT leases 2.00 ms"; got != want {
		t.Errorf("chain text %q, want %q", got, want)
	}
	delete(r.RequestCostMS["handoff_waiters_1"], "PUT leases")
	if got := chainMS(r, "handoff_waiters_1", handoffChain); got != 0 {
		t.Errorf("a chain missing a request sums to %v, want 0 (unmeasured)", got)
	}
	delete(r.RequestCostMS, "floor")
	ratios(&r)
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("a report without the floor's request cost cannot be written: %v", err)
	}
}

// BENCH_ONLY takes known step names only, and a partial run's table judges
// nothing: the steps it skipped leave zeros that would read as met or not.
func TestPartialRun(t *testing.T) {
	only, err := parseOnly(" takeover,graceful ")
	if err != nil {
		t.Fatal(err)
	}
	if !only.want("takeover") || !only.want("graceful") || only.want("grant") {
		t.Errorf("want: takeover %v graceful %v grant %v", only.want("takeover"), only.want("graceful"), only.want("grant"))
	}
	if got := only.names(); !slices.Equal(got, []string{"takeover", "graceful"}) {
		t.Errorf("names %v", got)
	}
	if all, err := parseOnly(""); err != nil || !all.want("scale") || all.names() != nil {
		t.Errorf("empty BENCH_ONLY: %v %v %v", all, err, all.names())
	}
	if _, err := parseOnly("takeover,takover"); err == nil || !strings.Contains(err.Error(), `unknown step "takover"`) {
		t.Errorf("a misspelt step: %v", err)
	}
	r := okReport()
	r.Only = only.names()
	r.GrantNewMS = latency{}
	var b bytes.Buffer
	printTable(&b, r)
	if !strings.Contains(b.String(), "Partial run (BENCH_ONLY): the floor and takeover, graceful only.") {
		t.Errorf("the table does not say the run was partial:\n%s", b.String())
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasSuffix(line, "| yes |") || strings.HasSuffix(line, "| NO |") {
			t.Errorf("a partial run judged a goal: %s", line)
		}
	}
}

// A p99 comes from 200 samples or more; below that the figure's tail is its
// max: printed as such, judged on it, and the goal's row says so.
func TestTailIsTheMaxBelow200Samples(t *testing.T) {
	ms := func(n int) []time.Duration {
		d := make([]time.Duration, n)
		for i := range d {
			d[i] = time.Duration(i+1) * time.Millisecond
		}
		return d
	}
	if l := summarize(ms(200)); l.P99 != 198 || l.Max != 200 || l.Min != 1 || l.tail() != 198 || latText(l) != "p50 100.00 / p99 198.00 (n=200)" {
		t.Errorf("200 samples: %+v tail %v %q", l, l.tail(), latText(l))
	}
	if l := summarize(ms(199)); l.P99 != 0 || l.tail() != 199 || latText(l) != "p50 100.00 / max 199.00 (n=199)" {
		t.Errorf("199 samples: %+v tail %v %q", l, l.tail(), latText(l))
	}
	if b, _ := json.Marshal(summarize(ms(50))); strings.Contains(string(b), "p99") {
		t.Errorf("a p99 from 50 samples in the JSON: %s", b)
	}

	g := goalByFigure(t, "handoff_ms waiters_1")
	r := okReport()
	// 50 rounds and 50 floor samples: judged max over max (30 / 10).
	r.HandoffMS["waiters_1"] = latency{P50: 5, P99: 1, Max: 30, N: 50}
	r.FloorByPhaseMS["handoff_waiters_1"] = latency{P50: 2, P99: 1, Max: 10, N: 50}
	if met, judged := g.met(r); !met || !judged || g.ratio(r) != 3 {
		t.Errorf("on the max at the limit: met=%v judged=%v ratio %v", met, judged, g.ratio(r))
	}
	if text := g.goalText(r); !strings.Contains(text, "on the max") {
		t.Errorf("the goal does not say it was judged on the max: %q", text)
	}
	if text := g.goalText(okReport()); strings.Contains(text, "max") {
		t.Errorf("a goal on p99s says max: %q", text)
	}
	r.HandoffMS["waiters_1"] = latency{P50: 5, P99: 1, Max: 30.01, N: 50}
	if met, _ := g.met(r); met {
		t.Errorf("a max past the limit is met (ratio %v)", g.ratio(r))
	}
	var b bytes.Buffer
	printTable(&b, r)
	if !strings.Contains(b.String(), "| handoff_ms waiters_1 | p50 5.00 / max 30.01 (n=50); floor p50 2.00 / max 10.00 (n=50) |") {
		t.Errorf("the row does not show the max:\n%s", b.String())
	}
}

// client-go's takeover is a reference: min/max and the share before the
// TTL, never a p50/p99.
func TestClientgoTakeoverReference(t *testing.T) {
	g := goalByFigure(t, "clientgo_takeover_overshoot_ms")
	if got, want := g.value(okReport()), "min -800.00 / max 150.00 (n=20); 35% taken over before the TTL"; got != want {
		t.Errorf("value %q, want %q", got, want)
	}
	if _, judged := g.met(okReport()); judged || g.num != nil {
		t.Errorf("client-go's takeover is judged or has a ratio")
	}
}

// The semaphore step's rows are reported, never judged: each semaphore
// figure over its phase's floor and over the mutex beside it (p50 and
// tail), the mutex's over the floor; with the step not run they say so.
func TestSemaphoreRows(t *testing.T) {
	r := okReport()
	ratios(&r)
	for key, want := range map[string]float64{
		"semaphore_grant_permits_held_2_p50_over_floor_p50": 4.5, "semaphore_grant_permits_held_2_p99_over_floor_p99": 4,
		"semaphore_grant_permits_held_2_p50_over_mutex_p50": 1.5, "semaphore_grant_permits_held_2_p99_over_mutex_p99": 2,
		"semaphore_grant_permits_held_0_p50_over_mutex_p50": 1.33, "semaphore_grant_mutex_p99_over_floor_p99": 2,
		"semaphore_handoff_p50_over_floor_p50": 5, "semaphore_handoff_p99_over_mutex_p99": 1.5, "semaphore_handoff_mutex_p50_over_floor_p50": 2.5,
		"semaphore_admission_p99_over_mutex_p99": 1.25, "semaphore_admission_p99_over_floor_p99": 1.5, "semaphore_admission_mutex_p99_over_floor_p99": 1.2,
	} {
		if got, ok := r.Ratios[key]; !ok || got != want {
			t.Errorf("ratio %s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	n := 0
	for _, g := range goals {
		if !strings.HasPrefix(g.figure, "semaphore_") {
			continue
		}
		n++
		if g.cmp != reported || g.key == "" || !strings.HasPrefix(g.key, "semaphore_") {
			t.Errorf("%s: want a reported-only row with a semaphore_ key, got cmp %v key %q", g.figure, g.cmp, g.key)
		}
	}
	// 3 grant figures and the handoff and admission ones x 4 rows, and
	// their 3 mutexes x 2.
	if n != 5*4+3*2 {
		t.Errorf("%d semaphore rows, want %d", n, 5*4+3*2)
	}
	var b bytes.Buffer
	printTable(&b, r)
	if !strings.Contains(b.String(), "| semaphore_admission_ms p99 / mutex | p50 5.00 / p99 15.00 (n=200); mutex p50 5.00 / p99 12.00 (n=200); unguarded p50 4.00 / p99 10.00 (n=200) |") {
		t.Errorf("the admission row does not show the mutex and the unguarded update beside it:\n%s", b.String())
	}
	// Fewer than 200 samples: the tail is the max, and the row says so.
	r.SemaphoreHandoffMS["semaphore"] = latency{P50: 10, Max: 60, N: 50}
	if g := goalByFigure(t, "semaphore_handoff_ms p99 / floor"); g.ratio(r) != 6 || !strings.Contains(g.goalText(r), "on the max") {
		t.Errorf("on 50 samples: ratio %v, %q", g.ratio(r), g.goalText(r))
	}
	// The step not run (BENCH_ONLY without it): not measured, no max.
	r.SemaphoreGrantMS, r.SemaphoreHandoffMS, r.SemaphoreAdmissionMS = map[string]latency{}, map[string]latency{}, map[string]latency{}
	for _, g := range goals {
		if !strings.HasPrefix(g.figure, "semaphore_") {
			continue
		}
		if _, judged := g.met(r); judged || strings.Contains(g.goalText(r), "max") || !strings.HasPrefix(g.value(r), "not measured") {
			t.Errorf("%s unmeasured: judged=%v, %q, %q", g.figure, judged, g.goalText(r), g.value(r))
		}
	}
	ratios(&r)
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("a report without the semaphore step cannot be written: %v", err)
	}
}

// Command bench measures fencekeeper against the floor (one
// resourceVersion-guarded Lease update on the same apiserver, same run) and
// against client-go leader election, on a fresh control plane and manager
// process of its own. It reports; it does not fail on timing (make bench).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

type params struct {
	floorN, grantN, handoffRounds, takeoverRuns, throughputLocks, guardedN, scaleClaims, scaleLocks int
	ttl                                                                                             time.Duration
}

var (
	quickParams = params{floorN: 100, grantN: 30, handoffRounds: 10, takeoverRuns: 5, throughputLocks: 300, guardedN: 100, scaleClaims: 2000, scaleLocks: 1000, ttl: 2 * time.Second}
	fullParams  = params{floorN: 500, grantN: 200, handoffRounds: 50, takeoverRuns: 20, throughputLocks: 1000, guardedN: 500, scaleClaims: 10000, scaleLocks: 5000, ttl: 2 * time.Second}
)

// report is .bench/report.json.
type report struct {
	Quick                       bool               `json:"quick"`
	FloorMS                     latency            `json:"floor_ms"`
	GrantMS                     latency            `json:"grant_ms"`
	HandoffMS                   map[string]latency `json:"handoff_ms"`
	TakeoverOvershootMS         latency            `json:"takeover_overshoot_ms"`
	ClientgoTakeoverOvershootMS latency            `json:"clientgo_takeover_overshoot_ms"`
	WritesPerGrant              float64            `json:"writes_per_grant"`
	WritesPerHandoff            float64            `json:"writes_per_handoff"`
	NoopResyncWrites            float64            `json:"noop_resync_writes"`
	GrantsPerS                  float64            `json:"grants_per_s"`
	FloorUpdatesPerS            float64            `json:"floor_updates_per_s"`
	GuardedUpdateMS             latency            `json:"guarded_update_ms"`
	UnguardedUpdateMS           latency            `json:"unguarded_update_ms"`
	WebhookHandlerMeanMS        float64            `json:"webhook_handler_mean_ms"`
	RSSMiB10k                   float64            `json:"rss_mib_10k"`
	ScaleClaims                 int                `json:"scale_claims"`
	ScaleLocks                  int                `json:"scale_locks"`
	ScaleCorrect                bool               `json:"scale_all_grants_correct"`
	Ratios                      map[string]float64 `json:"ratios"`
}

func main() {
	quick := os.Getenv("BENCH_QUICK") == "1"
	p := fullParams
	if quick {
		p = quickParams
	}
	if err := run(quick, p); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func step(name string) func() {
	start := time.Now()
	fmt.Fprintf(os.Stderr, ">> %s ...", name)
	return func() { fmt.Fprintf(os.Stderr, " %.1fs\n", time.Since(start).Seconds()) }
}

func run(quick bool, p params) error {
	ctx := context.Background()
	const syncPeriod = 10 * time.Second
	done := step("starting etcd, kube-apiserver and bin/manager")
	cl, err := startCluster(ctx, syncPeriod)
	if err != nil {
		return err
	}
	defer cl.stop()
	// Interrupted: stop etcd, kube-apiserver and the manager, leave no orphans.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "\nbench: interrupted; stopping the control plane")
		cl.stop()
		os.Exit(130)
	}()
	done()
	c, err := client.NewWithWatch(cl.admin, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return err
	}
	r := report{Quick: quick, HandoffMS: map[string]latency{}, Ratios: map[string]float64{}}

	done = step("warm-up")
	if _, err := measureGrant(ctx, c, 5); err != nil {
		return err
	}
	if _, err := measureFloor(ctx, c, 20); err != nil {
		return err
	}
	done()

	done = step("floor")
	if r.FloorMS, err = measureFloor(ctx, c, p.floorN); err != nil {
		return err
	}
	done()

	done = step("grant")
	l0, s0 := cl.writes()
	if r.GrantMS, err = measureGrant(ctx, c, p.grantN); err != nil {
		return err
	}
	time.Sleep(time.Second)
	l1, s1 := cl.writes()
	r.WritesPerGrant = round2((l1 - l0 + s1 - s0) / float64(p.grantN))
	done()

	for _, w := range []int{1, 10, 1000} {
		done = step(fmt.Sprintf("handoff with %d waiters", w))
		var before, after [2]float64
		lat, err := measureHandoffCounting(ctx, c, w, p.handoffRounds, func(b bool) {
			l, s := cl.writes()
			if b {
				before = [2]float64{l, s}
			} else {
				after = [2]float64{l, s}
			}
		})
		if err != nil {
			return err
		}
		r.HandoffMS[fmt.Sprintf("waiters_%d", w)] = lat
		if w == 1000 {
			r.WritesPerHandoff = round2((after[0] - before[0] + after[1] - before[1]) / float64(p.handoffRounds))
		}
		done()
	}

	done = step(fmt.Sprintf("no-op resync (%v sync period)", syncPeriod))
	if err := settle(cl); err != nil {
		return err
	}
	l0, s0 = cl.writes()
	time.Sleep(syncPeriod + 3*time.Second)
	l1, s1 = cl.writes()
	r.NoopResyncWrites = l1 - l0 + s1 - s0
	done()

	done = step("takeover (fencekeeper and client-go leader election)")
	if r.TakeoverOvershootMS, err = measureTakeover(ctx, c, p.takeoverRuns, p.ttl); err != nil {
		return err
	}
	if r.ClientgoTakeoverOvershootMS, err = measureClientGoTakeover(ctx, cl.admin, p.takeoverRuns, p.ttl); err != nil {
		return err
	}
	done()

	done = step("throughput")
	if r.GrantsPerS, err = grantThroughput(ctx, c, p.throughputLocks, 16); err != nil {
		return err
	}
	if r.FloorUpdatesPerS, err = floorThroughput(ctx, c, p.throughputLocks, 16); err != nil {
		return err
	}
	done()

	done = step("admission cost")
	if r.GuardedUpdateMS, r.UnguardedUpdateMS, err = guardedVsUnguarded(ctx, c, p.guardedN); err != nil {
		return err
	}
	r.WebhookHandlerMeanMS = round2(cl.handlerMeanMS())
	done()

	done = step(fmt.Sprintf("scale: %d claims over %d locks (CPU profile during it)", p.scaleClaims, p.scaleLocks))
	_ = os.MkdirAll(".bench", 0o755)
	profDone := make(chan error, 1)
	go func() { profDone <- cl.profile("profile", 10, ".bench/cpu.pprof") }()
	var detail string
	r.RSSMiB10k, r.ScaleCorrect, detail, err = scale(ctx, c, cl, p.scaleClaims, p.scaleLocks, 32)
	if err != nil {
		return err
	}
	r.ScaleClaims, r.ScaleLocks = p.scaleClaims, p.scaleLocks
	if err := <-profDone; err != nil {
		fmt.Fprintln(os.Stderr, "bench: CPU profile:", err)
	}
	_ = cl.profile("heap", 0, ".bench/heap.pprof")
	done()
	fmt.Fprintln(os.Stderr, "   ", detail)

	ratios(&r)
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(".bench", "report.json"), b, 0o644); err != nil {
		return err
	}
	printTable(r)
	printProfiles()
	return nil
}

func measureHandoffCounting(ctx context.Context, c client.WithWatch, waiters, rounds int, mark func(before bool)) (latency, error) {
	markHook = mark
	defer func() { markHook = nil }()
	return measureHandoff(ctx, c, waiters, rounds)
}

func ratios(r *report) {
	div := func(a, b float64) float64 {
		if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		return round2(a / b)
	}
	r.Ratios["grant_p50_over_floor_p50"] = div(r.GrantMS.P50, r.FloorMS.P50)
	r.Ratios["grant_p99_over_floor_p99"] = div(r.GrantMS.P99, r.FloorMS.P99)
	for _, w := range []string{"waiters_1", "waiters_10", "waiters_1000"} {
		r.Ratios["handoff_p99_over_floor_p99_"+w] = div(r.HandoffMS[w].P99, r.FloorMS.P99)
	}
	r.Ratios["takeover_overshoot_p99_over_200ms"] = div(r.TakeoverOvershootMS.P99, 200)
	r.Ratios["takeover_overshoot_p99_over_clientgo_p99"] = div(r.TakeoverOvershootMS.P99, r.ClientgoTakeoverOvershootMS.P99)
	r.Ratios["writes_per_grant_over_2"] = div(r.WritesPerGrant, 2)
	r.Ratios["writes_per_handoff_over_2"] = div(r.WritesPerHandoff, 2)
	r.Ratios["grants_per_s_over_floor_updates_per_s"] = div(r.GrantsPerS, r.FloorUpdatesPerS)
	r.Ratios["guarded_p99_over_unguarded_p99"] = div(r.GuardedUpdateMS.P99, r.UnguardedUpdateMS.P99)
	r.Ratios["rss_mib_over_150"] = div(r.RSSMiB10k, 150)
}

func printTable(r report) {
	met := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "NO"
	}
	lat := func(l latency) string { return fmt.Sprintf("p50 %.2f / p99 %.2f (n=%d)", l.P50, l.P99, l.N) }
	fmt.Printf("\n## fencekeeper benchmark (quick=%v)\n\n", r.Quick)
	fmt.Println("| figure | value | goal | ratio | met? |")
	fmt.Println("|---|---|---|---|---|")
	row := func(fig, val, goal string, ratio float64, ok bool) {
		fmt.Printf("| %s | %s | %s | %.2f | %s |\n", fig, val, goal, ratio, met(ok))
	}
	row("floor_ms", lat(r.FloorMS), "(the unit)", 1, true)
	row("grant_ms p50", lat(r.GrantMS), "<= 2x floor p50", r.Ratios["grant_p50_over_floor_p50"], r.Ratios["grant_p50_over_floor_p50"] <= 2)
	row("grant_ms p99", lat(r.GrantMS), "<= 3x floor p99", r.Ratios["grant_p99_over_floor_p99"], r.Ratios["grant_p99_over_floor_p99"] <= 3)
	for _, w := range []string{"waiters_1", "waiters_10", "waiters_1000"} {
		k := "handoff_p99_over_floor_p99_" + w
		row("handoff_ms "+w, lat(r.HandoffMS[w]), "p99 <= 3x floor p99", r.Ratios[k], r.Ratios[k] <= 3)
	}
	row("takeover_overshoot_ms", lat(r.TakeoverOvershootMS), "<= 200 ms", r.Ratios["takeover_overshoot_p99_over_200ms"], r.TakeoverOvershootMS.P99 <= 200)
	row("clientgo_takeover_overshoot_ms", lat(r.ClientgoTakeoverOvershootMS), "(reference)", r.Ratios["takeover_overshoot_p99_over_clientgo_p99"], true)
	row("writes_per_grant", fmt.Sprint(r.WritesPerGrant), "<= 2", r.Ratios["writes_per_grant_over_2"], r.WritesPerGrant <= 2)
	row("writes_per_handoff (1000 waiters)", fmt.Sprint(r.WritesPerHandoff), "O(1): <= 2", r.Ratios["writes_per_handoff_over_2"], r.WritesPerHandoff <= 2)
	row("noop_resync_writes", fmt.Sprint(r.NoopResyncWrites), "0", r.NoopResyncWrites, r.NoopResyncWrites == 0)
	row("grants_per_s", fmt.Sprintf("%.0f vs floor %.0f updates/s", r.GrantsPerS, r.FloorUpdatesPerS), "(reported)", r.Ratios["grants_per_s_over_floor_updates_per_s"], true)
	row("guarded_update_ms", lat(r.GuardedUpdateMS)+" vs unguarded "+lat(r.UnguardedUpdateMS), "p99 <= 1.3x unguarded", r.Ratios["guarded_p99_over_unguarded_p99"], r.Ratios["guarded_p99_over_unguarded_p99"] <= 1.3)
	row("webhook_handler_mean_ms", fmt.Sprintf("%.3f", r.WebhookHandlerMeanMS), "(where the guarded cost goes)", 0, true)
	row("rss_mib_10k", fmt.Sprintf("%.1f MiB (%d claims / %d locks, correct=%v)", r.RSSMiB10k, r.ScaleClaims, r.ScaleLocks, r.ScaleCorrect), "<= 150 MiB, all correct", r.Ratios["rss_mib_over_150"], r.RSSMiB10k <= 150 && r.ScaleCorrect)
	fmt.Println("\nJSON: .bench/report.json; profiles: .bench/cpu.pprof, .bench/heap.pprof")
}

func printProfiles() {
	manager := filepath.Join(envtestutil.RepoRoot(), "bin", "manager")
	for _, p := range []string{".bench/cpu.pprof", ".bench/heap.pprof"} {
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=12", manager, p).CombinedOutput()
		if err != nil {
			continue
		}
		fmt.Printf("\n### %s (top)\n\n```\n%s```\n", p, strings.TrimSpace(string(out))+"\n")
	}
}

// settle waits until the manager has written nothing for 3s (at most 2m).
func settle(cl *cluster) error {
	deadline := time.Now().Add(2 * time.Minute)
	l, s := cl.writes()
	for time.Now().Before(deadline) {
		time.Sleep(3 * time.Second)
		l2, s2 := cl.writes()
		if l2 == l && s2 == s {
			return nil
		}
		l, s = l2, s2
	}
	return fmt.Errorf("the manager kept writing for 2m")
}

// The report: .bench/report.json (every figure, and under "ratios" each
// keyed goal's ratio from goals.go) and the markdown table on stdout, one
// row per goal in goals.go, followed by the manager's top CPU and heap
// profile entries.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// report is .bench/report.json.
type report struct {
	Quick bool `json:"quick"`
	// Only: the steps a BENCH_ONLY run ran (besides the floor); empty for a
	// full run. The other steps' figures are zero and no goal is judged.
	Only []string `json:"only,omitempty"`
	// FloorMS pools every floor round trip of the run; FloorByPhaseMS is
	// the floor sampled throughout each phase a latency goal judges
	// (grant_new, grant_existing, handoff_waiters_N), its ratios' unit.
	FloorMS        latency            `json:"floor_ms"`
	FloorByPhaseMS map[string]latency `json:"floor_by_phase_ms"`
	// GrantNewMS: grants on new locks (no Lease yet); GrantMS is the same
	// figure under its old key. GrantExistingMS: on locks whose Lease
	// exists, free.
	GrantMS                     latency            `json:"grant_ms"`
	GrantNewMS                  latency            `json:"grant_new_ms"`
	GrantExistingMS             latency            `json:"grant_existing_ms"`
	HandoffMS                   map[string]latency `json:"handoff_ms"`
	TakeoverOvershootMS         latency            `json:"takeover_overshoot_ms"`
	ClientgoTakeoverOvershootMS latency            `json:"clientgo_takeover_overshoot_ms"`
	// ClientgoTakeoverBeforeTTLShare: the share of client-go's takeovers
	// that came before the TTL had run out since the last renewal.
	ClientgoTakeoverBeforeTTLShare float64 `json:"clientgo_takeover_before_ttl_share"`
	ElectionTakeoverOvershootMS    latency `json:"election_takeover_overshoot_ms"`
	// ElectionTakeoverPhasesMS splits the fenced election's staggered
	// takeovers (takeover.go).
	ElectionTakeoverPhasesMS takeoverPhases `json:"election_takeover_phases_ms"`
	// The same takeovers all at once (a burst), reported only.
	TakeoverBurstOvershootMS         latency        `json:"takeover_burst_overshoot_ms"`
	ElectionTakeoverBurstOvershootMS latency        `json:"election_takeover_burst_overshoot_ms"`
	ElectionTakeoverBurstPhasesMS    takeoverPhases `json:"election_takeover_burst_phases_ms"`
	GracefulHandoffMS                latency        `json:"graceful_handoff_ms"`
	EtcdMutexHandoffMS               latency        `json:"etcd_mutex_handoff_ms"`
	ClientgoGracefulHandoffMS        latency        `json:"clientgo_graceful_handoff_ms"`
	// WritesPerGrant: per grant on a new lock (writes_per_grant_new, kept
	// under its old key too); WritesPerGrantExisting: on an existing one.
	WritesPerGrant         float64 `json:"writes_per_grant"`
	WritesPerGrantNew      float64 `json:"writes_per_grant_new"`
	WritesPerGrantExisting float64 `json:"writes_per_grant_existing"`
	WritesPerHandoff       float64 `json:"writes_per_handoff"`
	NoopResyncWrites       float64 `json:"noop_resync_writes"`
	// PodHeldSteadyWrites: mutating requests while pods only hold their
	// leases; WritesPerRenewal: per renewal a library holder acknowledged
	// (steady.go).
	PodHeldSteadyWrites float64 `json:"pod_held_steady_writes"`
	WritesPerRenewal    float64 `json:"writes_per_renewal"`
	GrantsPerS          float64 `json:"grants_per_s"`
	FloorUpdatesPerS    float64 `json:"floor_updates_per_s"`
	// ChainFloorGrantsPerS: a grant cycle's requests replayed with no
	// authority, at the throughput phase's concurrency (chainfloor.go).
	ChainFloorGrantsPerS          float64   `json:"chain_floor_grants_per_s"`
	ThroughputBreakdown           breakdown `json:"throughput_breakdown"`
	ChainFloorThroughputBreakdown breakdown `json:"chain_floor_throughput_breakdown"`
	// The chain floor plus the cycle's two Events (diagnostic).
	ChainFloorWithEventsGrantsPerS          float64   `json:"chain_floor_with_events_grants_per_s"`
	ChainFloorWithEventsThroughputBreakdown breakdown `json:"chain_floor_with_events_throughput_breakdown"`
	FloorThroughputBreakdown                breakdown `json:"floor_throughput_breakdown"`
	GuardedUpdateMS                         latency   `json:"guarded_update_ms"`
	UnguardedUpdateMS                       latency   `json:"unguarded_update_ms"`
	WebhookHandlerMeanMS                    float64   `json:"webhook_handler_mean_ms"`
	// WebhookServerMeanMS: the webhook server's time per request (the
	// handler's, and reading, decoding and answering the review).
	// WebhookCallMeanMS: the apiserver's own time calling the fencing
	// webhook, per call (its admission_webhook duration histogram).
	WebhookServerMeanMS        float64            `json:"webhook_server_mean_ms"`
	WebhookCallMeanMS          float64            `json:"webhook_call_mean_ms"`
	GuardedUpdateCELMS         latency            `json:"guarded_update_cel_ms"`
	UnguardedUpdateCELMS       latency            `json:"unguarded_update_cel_ms"`
	GuardedUpdateCELByBindings map[string]latency `json:"guarded_update_cel_by_bindings_ms"`
	// UnguardedUpdateCELByBindings: the unguarded update, interleaved with
	// the guarded one, at each binding count.
	UnguardedUpdateCELByBindings map[string]latency `json:"unguarded_update_cel_by_bindings_ms"`
	// CELByBindings: the same, as a curve over the bound-lock counts.
	CELByBindings              []celPoint `json:"cel_by_bindings"`
	StaleRefusedAfterReleaseMS latency    `json:"stale_refused_after_release_ms"`
	CurrentStalenessWindowMS   latency    `json:"current_staleness_window_ms"`
	RSSMiB10k                  float64    `json:"rss_mib_10k"`
	// ScaleClaims: the claims in the cluster when RSSMiB10k was read, the
	// ScaleEarlierClaims earlier steps left among them; ScaleLocks: the
	// step's own locks.
	ScaleClaims        int          `json:"scale_claims"`
	ScaleEarlierClaims int          `json:"scale_earlier_claims"`
	ScaleLocks         int          `json:"scale_locks"`
	ScaleCorrect       bool         `json:"scale_all_grants_correct"`
	RSSMiB50k          float64      `json:"rss_mib_50k"`
	ScaleCurve         []scalePoint `json:"scale_curve"`
	// RequestCostMS: per phase (floor, grant_new, grant_existing,
	// handoff_waiters_N; the last three over their timed part), each
	// request kind's mean server time (requestcost.go).
	RequestCostMS map[string]map[string]float64 `json:"request_cost_ms"`
	// GrantLeaseSeenMS and HandoffLeaseSeenMS: the same clocks as GrantMS
	// and HandoffMS, stopped when a watch of the Lease first sees it name the
	// claim (what a holder learning of its grant from the Lease would see).
	GrantLeaseSeenMS latency `json:"grant_lease_seen_ms"`
	// GrantExistingLeaseSeenMS: the same for grants on existing locks.
	GrantExistingLeaseSeenMS latency            `json:"grant_existing_lease_seen_ms"`
	HandoffLeaseSeenMS       map[string]latency `json:"handoff_lease_seen_ms"`
	// The semaphore step (semaphore.go; reported only, DESIGN §7 sets no
	// goal): a 3-permit lock beside a mutex, each phase against its floor
	// (floor_by_phase_ms semaphore_grant, semaphore_handoff,
	// semaphore_admission). SemaphoreGrantMS: a claim created on an
	// existing lock -> seen Held, keyed permits_held_0..2 (permits other
	// claims hold meanwhile) and mutex; SemaphoreHandoffMS: one of 3
	// holders (the mutex's 1) deletes its claim -> the one waiter seen
	// Held, keyed semaphore and mutex; the _lease_seen_ maps are the same
	// clocks stopped when the lock's Lease first lists the claim's permit
	// (names the mutex's holder). SemaphoreAdmissionMS: a fenced ConfigMap
	// update presenting a live permit's epoch (semaphore), the mutex
	// holder's (mutex) and the unfenced update (unguarded), interleaved.
	SemaphoreGrantMS            map[string]latency `json:"semaphore_grant_ms"`
	SemaphoreGrantLeaseSeenMS   map[string]latency `json:"semaphore_grant_lease_seen_ms"`
	SemaphoreHandoffMS          map[string]latency `json:"semaphore_handoff_ms"`
	SemaphoreHandoffLeaseSeenMS map[string]latency `json:"semaphore_handoff_lease_seen_ms"`
	SemaphoreAdmissionMS        map[string]latency `json:"semaphore_admission_ms"`
	Ratios                      map[string]float64 `json:"ratios"`
}

// writeReport fills in the ratios and writes .bench/report.json.
func writeReport(r *report) error {
	ratios(r)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("writing .bench/report.json: %w", err)
	}
	return os.WriteFile(filepath.Join(".bench", "report.json"), b, 0o644)
}

// printTable prints one row per goal, then the goals not measured here.
func printTable(w io.Writer, r report) {
	fmt.Fprintf(w, "\n## fencekeeper benchmark (quick=%v)\n\n", r.Quick)
	if len(r.Only) > 0 {
		fmt.Fprintf(w, "Partial run (BENCH_ONLY): the floor and %s only. Other figures are zero; no goal is judged.\n\n", strings.Join(r.Only, ", "))
	}
	fmt.Fprintf(w, "Latencies are judged against the floor sampled in their own phase; a p99 comes from %d samples or more, and with fewer the figure's tail is its max (so shown, and a goal judged on it says so).\n\n", minP99N)
	fmt.Fprintln(w, "| figure | value | goal | ratio | met? |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, g := range goals {
		ratio, verdict := "-", "-"
		if g.num != nil {
			ratio = fmt.Sprintf("%.2f", round2(g.ratio(r)))
		}
		if met, judged := g.met(r); judged && len(r.Only) == 0 {
			verdict = "NO"
			if met {
				verdict = "yes"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", g.figure, g.value(r), g.goalText(r), ratio, verdict)
	}
	if len(notMeasured) > 0 {
		fmt.Fprintln(w, "\nGoals not measured here yet (test/bench/goals.go):")
		for _, s := range notMeasured {
			fmt.Fprintln(w, "-", s)
		}
	}
	fmt.Fprintln(w, "\nJSON: .bench/report.json; profiles: .bench/cpu.pprof, .bench/heap.pprof")
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

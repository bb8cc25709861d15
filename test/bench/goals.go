// The goals table: the one place the bench's goals are written. Each goal is
// one row of the printed table; a goal with a key also writes its ratio
// (num/den, rounded to two decimals) under "ratios" in .bench/report.json.
// A goal is judged on its unrounded ratio. The goals are the design's
// (DESIGN §7 rev. 3, "What fast means"); change them here only.
//
// How figures are taken (rev. 3): a latency is judged against the floor
// sampled throughout its own phase (floor_by_phase_ms); a p99 comes from at
// least 200 samples, and with fewer the figure's tail is its maximum, which
// the row says (latency.tail).
package main

import (
	"fmt"
	"math"
)

// cmp is how a goal's ratio is judged against its limit.
type cmp int

const (
	reported cmp = iota // no goal: the figure is reported only
	atMost              // met when ratio <= limit
	atLeast             // met when ratio >= limit
	exactly             // met when ratio == limit
)

type goal struct {
	figure   string               // the printed row
	key      string               // the ratio's key under "ratios" in report.json; "" for none
	value    func(report) string  // the measured figure, as printed
	num, den func(report) float64 // the ratio is num/den; num nil: the row has no ratio
	cmp      cmp                  // how the ratio is judged
	limit    float64              // the bound on the ratio
	target   string               // the goal as printed; %g stands for bound()
	also     func(report) bool    // a further condition for the goal to be met; nil for none
	skipped  func(report) bool    // the figure was not measured in this run (printed, not judged); nil: always measured
	// tails are the latencies whose tail (p99, or max below 200 samples)
	// the ratio takes; the row says when one was a max.
	tails []func(report) latency
}

// graceful handoff: what each side waits on.
const gracefulWaits = " (fenced waits on the release, then its grant seen; client-go on its 2 s RetryPeriod try)"

var goals = append([]goal{
	{figure: "floor_ms", value: latOf(floorMS), num: p50(floorMS), den: p50(floorMS),
		target: "(the unit: every floor round trip of the run; each phase is judged against its own, floor_by_phase_ms)"},
	// Grants are judged on the clock holders go by: a claim on a free lock
	// watches the Lease from its start, and a watch of the Lease sees it name
	// the claim (docs/design.md §5); the claim's Held status follows, off the
	// critical path (the claim_held rows).
	p50Goal(goal{figure: "grant_existing_ms p50 (the Lease names the claim)", key: "grant_existing_p50_over_floor_p50", value: vsFloor(grantExistingLeaseMS, "grant_existing"),
		cmp: atMost, limit: 3.5, target: "p50 <= %gx its phase's floor p50"}, grantExistingLeaseMS, phaseFloor("grant_existing")),
	tailGoal(goal{figure: "grant_existing_ms p99 (the Lease names the claim)", key: "grant_existing_p99_over_floor_p99", value: vsFloor(grantExistingLeaseMS, "grant_existing"),
		cmp: atMost, limit: 4, target: "p99 <= %gx its phase's floor p99"}, grantExistingLeaseMS, phaseFloor("grant_existing")),
	p50Goal(goal{figure: "grant_new_ms p50 (the Lease names the claim)", key: "grant_new_p50_over_floor_p50", value: vsFloor(grantNewLeaseMS, "grant_new"),
		cmp: atMost, limit: 5, target: "p50 <= %gx its phase's floor p50"}, grantNewLeaseMS, phaseFloor("grant_new")),
	tailGoal(goal{figure: "grant_new_ms p99 (the Lease names the claim)", key: "grant_new_p99_over_floor_p99", value: vsFloor(grantNewLeaseMS, "grant_new"),
		cmp: atMost, limit: 6, target: "p99 <= %gx its phase's floor p99"}, grantNewLeaseMS, phaseFloor("grant_new")),
	handoffGoal("waiters_1", 3, ""),
	handoffGoal("waiters_10", 3.5, " (no goal of its own: judged at the 1,000-waiter bound)"),
	handoffGoal("waiters_1000", 3.5, ""),
	p50Goal(goal{figure: "grant_existing_claim_held_ms p50", key: "grant_existing_claim_held_p50_over_floor_p50", value: vsFloor(grantExistingMS, "grant_existing"),
		target: "(diagnostic: until the claim's status shows Held, written after the Lease)"}, grantExistingMS, phaseFloor("grant_existing")),
	p50Goal(goal{figure: "grant_new_claim_held_ms p50", key: "grant_new_claim_held_p50_over_floor_p50", value: vsFloor(grantNewMS, "grant_new"),
		target: "(diagnostic: until the claim's status shows Held, written after the Lease)"}, grantNewMS, phaseFloor("grant_new")),
	leaseSeenGoal("waiters_1"),
	leaseSeenGoal("waiters_1000"),
	chainGoal("grant chain, new lock: server time of its requests", "grant_new_chain_server_over_floor_server", "grant_new", grantNewChain),
	chainGoal("grant chain, existing lock: server time of its requests", "grant_existing_chain_server_over_floor_server", "grant_existing", grantExistingChain),
	chainGoal("grant chain, existing lock, without the status patch", "grant_existing_chain_lease_only_over_floor_server", "grant_existing", grantExistingChain, statusPatch),
	chainGoal("handoff chain: server time of its requests (1 waiter)", "handoff_chain_server_over_floor_server", "handoff_waiters_1", handoffChain),
	chainGoal("handoff chain without the status patch", "handoff_chain_lease_only_over_floor_server", "handoff_waiters_1", handoffChain, statusPatch),
	p50Goal(goal{figure: "etcd_mutex_handoff_ms", key: "handoff_p50_over_etcd_mutex_p50_waiters_1", value: latOf(etcdMutexMS),
		target: "(peer: fencekeeper's 1-waiter handoff p50 / etcd concurrency.Mutex p50)"},
		func(r report) latency { return r.HandoffMS["waiters_1"] }, etcdMutexMS),
	tailGoal(goal{figure: "takeover_overshoot_ms", key: "takeover_overshoot_p99_over_100ms", value: latOf(takeoverMS), den: constant(100),
		cmp: atMost, limit: 1, target: "p99 <= TTL + %g ms"}, takeoverMS, nil),
	{figure: "clientgo_takeover_overshoot_ms", value: func(r report) string {
		l := r.ClientgoTakeoverOvershootMS
		return fmt.Sprintf("min %.2f / max %.2f (n=%d); %.0f%% taken over before the TTL", l.Min, l.Max, l.N, 100*r.ClientgoTakeoverBeforeTTLShare)
	}, target: "(reference: client-go leader election, from the last renewal it wrote, read back)"},
	tailGoal(goal{figure: "election_takeover_overshoot_ms (fenced election)", key: "election_takeover_overshoot_p99_over_100ms",
		value: latOf(electionTakeoverMS), den: constant(100), cmp: atMost, limit: 1, target: "p99 <= TTL + %g ms"}, electionTakeoverMS, nil),
	{figure: "election_takeover_phases_ms", value: func(r report) string { return r.ElectionTakeoverPhasesMS.String() },
		target: "(diagnostic: the fenced election's overshoot split at the Lease versions a watch sees)"},
	{figure: "takeover_burst_overshoot_ms", value: latOf(func(r report) latency { return r.TakeoverBurstOvershootMS }),
		target: "(reported: the same takeovers all at once, a burst on 2 cores)"},
	{figure: "election_takeover_burst_overshoot_ms", value: func(r report) string {
		return latOf(func(r report) latency { return r.ElectionTakeoverBurstOvershootMS })(r) + "; " + r.ElectionTakeoverBurstPhasesMS.String()
	}, target: "(reported: the fenced election's takeovers all at once, a burst on 2 cores)"},
	p50Goal(goal{figure: "graceful_handoff_ms (fenced election)", key: "clientgo_graceful_p50_over_fenced_p50", value: latOf(gracefulMS),
		cmp: atLeast, limit: 20, target: "client-go p50 / fenced p50 >= %g" + gracefulWaits}, clientgoGracefulMS, gracefulMS),
	tailGoal(goal{figure: "clientgo_graceful_handoff_ms (ReleaseOnCancel)", key: "clientgo_graceful_p99_over_fenced_p99", value: latOf(clientgoGracefulMS),
		cmp: atLeast, limit: 20, target: "client-go p99 / fenced p99 >= %g" + gracefulWaits}, clientgoGracefulMS, gracefulMS),
	writesGoal("writes_per_grant_existing", "writes_per_grant_existing_over_2", func(r report) float64 { return r.WritesPerGrantExisting }, 2, "<= %g"),
	writesGoal("writes_per_grant (new lock)", "writes_per_grant_new_over_3", func(r report) float64 { return r.WritesPerGrant }, 3, "<= %g (+1: the free Lease's create)"),
	writesGoal("writes_per_handoff (1000 waiters)", "writes_per_handoff_over_2", func(r report) float64 { return r.WritesPerHandoff }, 2, "O(1): <= %g"),
	{figure: "noop_resync_writes", value: func(r report) string { return fmt.Sprint(r.NoopResyncWrites) },
		num: func(r report) float64 { return r.NoopResyncWrites }, den: constant(1), cmp: exactly, limit: 0, target: "%g"},
	{figure: "pod_held_steady_writes", value: func(r report) string { return fmt.Sprint(r.PodHeldSteadyWrites) },
		num: func(r report) float64 { return r.PodHeldSteadyWrites }, den: constant(1), cmp: exactly, limit: 0,
		target: "%g (10 pods holding leases, over 3 TTLs)", skipped: steadyNotRun},
	{figure: "writes_per_renewal", value: func(r report) string { return fmt.Sprintf("%.2f", r.WritesPerRenewal) },
		num: func(r report) float64 { return r.WritesPerRenewal }, den: constant(1), cmp: exactly, limit: 1,
		target: "%g (every mutating request over the renewals 10 library holders acknowledged, 3 TTLs)", skipped: steadyNotRun},
	{figure: "grants_per_s", key: "grants_per_s_over_chain_floor_grants_per_s",
		value: func(r report) string {
			return fmt.Sprintf("%.0f grant cycles/s vs chain floor %.0f/s", r.GrantsPerS, r.ChainFloorGrantsPerS)
		},
		num: func(r report) float64 { return r.GrantsPerS }, den: func(r report) float64 { return r.ChainFloorGrantsPerS },
		cmp: atLeast, limit: 0.8, target: ">= %gx the chain floor (the cycle's own requests, replayed with no authority, same concurrency)"},
	{figure: "grants_per_s vs the chain floor with the Events", value: func(r report) string {
		return fmt.Sprintf("%.0f vs %.0f/s (the chain floor's requests and the cycle's two Events)", r.GrantsPerS, r.ChainFloorWithEventsGrantsPerS)
	}, num: func(r report) float64 { return r.GrantsPerS }, den: func(r report) float64 { return r.ChainFloorWithEventsGrantsPerS },
		target: "(diagnostic: what the authority adds beyond the requests the contract asks for)"},
	{figure: "grants_per_s vs the Lease floor", key: "grants_per_s_over_floor_updates_per_s",
		value: func(r report) string {
			return fmt.Sprintf("%.0f vs floor %.0f updates/s", r.GrantsPerS, r.FloorUpdatesPerS)
		},
		num: func(r report) float64 { return r.GrantsPerS }, den: func(r report) float64 { return r.FloorUpdatesPerS },
		target: "(reported beside it: RV-guarded updates of distinct Leases, same concurrency)"},
	tailGoal(goal{figure: "guarded_update_ms", key: "guarded_p99_over_unguarded_p99",
		value: func(r report) string {
			return latText(r.GuardedUpdateMS) + " vs unguarded " + latText(r.UnguardedUpdateMS)
		},
		cmp: atMost, limit: 1.3, target: "p99 <= %gx unguarded (webhook mode)"},
		func(r report) latency { return r.GuardedUpdateMS }, func(r report) latency { return r.UnguardedUpdateMS }),
	tailGoal(goal{figure: "guarded_update_cel_ms (1 lock bound)", key: "guarded_cel_p99_over_unguarded_p99",
		value: func(r report) string {
			return latText(r.GuardedUpdateCELMS) + " vs unguarded " + latText(r.UnguardedUpdateCELMS)
		},
		target: "(reported: CEL mode, the lock written to the only one bound)"},
		func(r report) latency { return r.GuardedUpdateCELMS }, func(r report) latency { return r.UnguardedUpdateCELMS }),
	celGoal(10, 1.3),
	celGoal(5000, 2),
	tailGoal(goal{figure: "unguarded_update_cel_ms, 5,000 locks bound", key: "unguarded_cel_5000_bindings_p99_over_unguarded_p99",
		value: func(r report) string {
			if r.UnguardedUpdateCELByBindings["bindings_5000"].N == 0 {
				return "not measured (quick run: 10 and 1,000 locks only)"
			}
			return latText(r.UnguardedUpdateCELByBindings["bindings_5000"]) + "; 1 bound: " + latText(r.UnguardedUpdateCELMS)
		},
		target:  "(reported: what a write outside any lock pays for the bindings)",
		skipped: func(r report) bool { return r.UnguardedUpdateCELByBindings["bindings_5000"].N == 0 }},
		func(r report) latency { return r.UnguardedUpdateCELByBindings["bindings_5000"] }, func(r report) latency { return r.UnguardedUpdateCELMS }),
	{figure: "webhook_handler_mean_ms", value: func(r report) string {
		return fmt.Sprintf("%.3f (the webhook server's: %.3f; the apiserver's call to it: %.3f)", r.WebhookHandlerMeanMS, r.WebhookServerMeanMS, r.WebhookCallMeanMS)
	}, target: "(where the guarded cost goes: the handler, the server around it, the whole call as the apiserver times it)"},
	{figure: "stale_refused_after_release_ms", value: latOf(func(r report) latency { return r.StaleRefusedAfterReleaseMS }),
		target: "(reported: release -> the old epoch refused)"},
	{figure: "current_staleness_window_ms", value: latOf(func(r report) latency { return r.CurrentStalenessWindowMS }),
		target: "(reported: refusal minus the new holder seen Held; <= 0 is no window)"},
	{figure: "rss_mib_10k", key: "rss_mib_over_150",
		value: func(r report) string {
			return fmt.Sprintf("%.1f MiB (%d claims: %d over %d locks, %d from earlier steps; correct=%v)",
				r.RSSMiB10k, r.ScaleClaims, r.ScaleClaims-r.ScaleEarlierClaims, r.ScaleLocks, r.ScaleEarlierClaims, r.ScaleCorrect)
		},
		num: func(r report) float64 { return r.RSSMiB10k }, den: constant(150), cmp: atMost, limit: 1, target: "<= %g MiB, all correct",
		also: func(r report) bool { return r.ScaleCorrect }},
	{figure: "rss_mib_50k", key: "rss_mib_50k_over_600",
		value: func(r report) string {
			if r.RSSMiB50k == 0 || len(r.ScaleCurve) == 0 {
				return "not measured (BENCH_SCALE_CURVE=1 runs the curve)"
			}
			last := r.ScaleCurve[len(r.ScaleCurve)-1]
			return fmt.Sprintf("%.1f MiB (%d claims / %d locks, correct)", r.RSSMiB50k, last.Claims, last.Locks)
		},
		num: func(r report) float64 { return r.RSSMiB50k }, den: constant(600), cmp: atMost, limit: 1, target: "<= %g MiB, all correct",
		skipped: func(r report) bool { return r.RSSMiB50k == 0 }},
	{figure: "scale_curve handoff at 50,000 claims", key: "scale_50k_handoff_max_over_floor_p99",
		value: func(r report) string {
			if r.RSSMiB50k == 0 {
				return "not measured (BENCH_SCALE_CURVE=1 runs the curve)"
			}
			last := r.ScaleCurve[len(r.ScaleCurve)-1]
			return fmt.Sprintf("max %.2f (n=10, once the queue drained, %.1f s after the step; behind its backlog: max %.2f); the run's floor p99 %.2f",
				last.HandoffP99MS, last.QueueDrainS, last.HandoffBehindBacklogMaxMS, r.FloorMS.P99)
		},
		num: func(r report) float64 {
			if r.RSSMiB50k == 0 {
				return 0
			}
			return r.ScaleCurve[len(r.ScaleCurve)-1].HandoffP99MS
		},
		den: func(r report) float64 { return r.FloorMS.P99 }, cmp: atMost, limit: 3.5,
		target:  "p99 <= %gx the floor p99, the chart's defaults [on the max: n < 200; the run's floor]",
		skipped: func(r report) bool { return r.RSSMiB50k == 0 }},
}, semaphoreGoals()...)

// notMeasured are the design's goals this harness does not measure yet;
// the printed report lists them under the table.
var notMeasured = []string{}

// steadyNotRun: the steady step did not run (a renewal always writes).
func steadyNotRun(r report) bool { return r.WritesPerRenewal == 0 }

// p50Goal sets g's ratio to num's p50 over den's.
func p50Goal(g goal, num, den func(report) latency) goal {
	g.num, g.den = p50(num), p50(den)
	return g
}

// tailGoal sets g's ratio to num's tail over den's (den nil: g's own den).
func tailGoal(g goal, num, den func(report) latency) goal {
	g.num, g.tails = tail(num), []func(report) latency{num}
	if den != nil {
		g.den, g.tails = tail(den), append(g.tails, den)
	}
	return g
}

// handoffGoal judges a handoff on the clock a queued waiter goes by: the
// release until its claim shows Held. (A claim that entered the queue at
// its head, shown Next, also watches the Lease and may learn sooner: the
// lease_seen rows. The waiters behind the head are not marked as they move
// up, which would cost a status write per handoff.)
func handoffGoal(w string, limit float64, note string) goal {
	l := func(r report) latency { return r.HandoffMS[w] }
	return tailGoal(goal{figure: "handoff_ms " + w, key: "handoff_p99_over_floor_p99_" + w, value: vsFloor(l, "handoff_"+w),
		cmp: atMost, limit: limit, target: "p99 <= %gx its phase's floor p99" + note}, l, phaseFloor("handoff_"+w))
}

// leaseSeenGoal reports a handoff's clock stopped by a watch of the Lease
// naming the next waiter (what a waiter shown Next sees).
func leaseSeenGoal(w string) goal {
	l := func(r report) latency { return r.HandoffLeaseSeenMS[w] }
	return tailGoal(goal{figure: "handoff_lease_seen_ms " + w, key: "handoff_lease_seen_p99_over_floor_p99_" + w, value: vsFloor(l, "handoff_"+w),
		target: "(diagnostic: until a watch of the Lease sees it name the next waiter, what a waiter shown Next sees)"}, l, phaseFloor("handoff_"+w))
}

func writesGoal(figure, key string, w func(report) float64, bound float64, target string) goal {
	return goal{figure: figure, key: key, value: func(r report) string { return fmt.Sprint(w(r)) },
		num: w, den: constant(bound), cmp: atMost, limit: 1, target: target}
}

// celGoal: CEL mode's guarded update with n locks bound, against the
// unguarded update interleaved with it.
func celGoal(n int, limit float64) goal {
	k := fmt.Sprintf("bindings_%d", n)
	g := func(r report) latency { return r.GuardedUpdateCELByBindings[k] }
	u := func(r report) latency { return r.UnguardedUpdateCELByBindings[k] }
	return tailGoal(goal{figure: fmt.Sprintf("guarded_update_cel_ms, %s locks bound", commas(n)), key: fmt.Sprintf("guarded_cel_%d_bindings_p99_over_unguarded_p99", n),
		value: func(r report) string {
			if g(r).N == 0 {
				return "not measured (quick run: 10 and 1,000 locks only)"
			}
			return latText(g(r)) + " vs unguarded " + latText(u(r))
		},
		cmp: atMost, limit: limit, target: "p99 <= %gx unguarded (CEL mode, same locks bound)",
		skipped: func(r report) bool { return g(r).N == 0 }}, g, u)
}

func commas(n int) string {
	if n < 1000 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%d,%03d", n/1000, n%1000)
}

// chainGoal reports a chain of requests' server time (requestcost.go) over
// the floor request's; no goal, but the latency goals above it cannot be
// lower than it.
func chainGoal(figure, key, phase string, chain []string, skip ...string) goal {
	return goal{figure: figure, key: key, value: chainText(phase, chain, skip...),
		num: func(r report) float64 { return chainMS(r, phase, chain, skip...) }, den: floorServerMS,
		target: "(diagnostic: over the floor request's server time; the requests alone, before any watch delivery)"}
}

// ratio is num/den, NaN when either is NaN or den is 0 (and when the row
// has no ratio).
func (g goal) ratio(r report) float64 {
	if g.num == nil {
		return math.NaN()
	}
	a, b := g.num(r), g.den(r)
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// met judges the goal on r; judged is false for a reported-only figure.
func (g goal) met(r report) (met, judged bool) {
	if g.skipped != nil && g.skipped(r) {
		return true, false
	}
	x := g.ratio(r)
	switch g.cmp {
	case atMost:
		met = x <= g.limit
	case atLeast:
		met = x >= g.limit
	case exactly:
		met = x == g.limit
	default:
		return true, false
	}
	if g.also != nil {
		met = met && g.also(r)
	}
	return met, true
}

// onMax is true when a tail the ratio takes is a maximum (fewer than 200
// samples) in a figure this run measured.
func (g goal) onMax(r report) bool {
	if g.skipped != nil && g.skipped(r) {
		return false
	}
	for _, l := range g.tails {
		if x := l(r); x.N > 0 && x.onMax() {
			return true
		}
	}
	return false
}

// bound is the goal's limit in the figure's own unit: limit times a
// constant denominator (100 ms, 2 writes, 150 MiB), else the limit itself
// (a multiple of another measured figure).
func (g goal) bound() float64 {
	if g.den != nil {
		if d := g.den(report{}); d != 0 {
			return g.limit * d
		}
	}
	return g.limit
}

// goalText is the goal as printed, saying when it was taken on a max.
func (g goal) goalText(r report) string {
	t := g.target
	if g.cmp != reported {
		t = fmt.Sprintf(t, g.bound())
	}
	if g.onMax(r) {
		t += " [on the max: n < 200]"
	}
	return t
}

// ratios writes every keyed goal's ratio into r.Ratios (0 when it has
// none: JSON has no NaN).
func ratios(r *report) {
	for _, g := range goals {
		if g.key != "" {
			x := g.ratio(*r)
			if math.IsNaN(x) {
				x = 0
			}
			r.Ratios[g.key] = round2(x)
		}
	}
}

func etcdMutexMS(r report) latency        { return r.EtcdMutexHandoffMS }
func gracefulMS(r report) latency         { return r.GracefulHandoffMS }
func clientgoGracefulMS(r report) latency { return r.ClientgoGracefulHandoffMS }
func electionTakeoverMS(r report) latency { return r.ElectionTakeoverOvershootMS }

func constant(c float64) func(report) float64 { return func(report) float64 { return c } }

func p50(l func(report) latency) func(report) float64 {
	return func(r report) float64 { return l(r).P50 }
}
func tail(l func(report) latency) func(report) float64 {
	return func(r report) float64 { return l(r).tail() }
}
func latOf(l func(report) latency) func(report) string {
	return func(r report) string { return latText(l(r)) }
}

// vsFloor prints a latency and the floor of its phase.
func vsFloor(l func(report) latency, phase string) func(report) string {
	return func(r report) string { return latText(l(r)) + "; floor " + latText(r.FloorByPhaseMS[phase]) }
}

func phaseFloor(phase string) func(report) latency {
	return func(r report) latency { return r.FloorByPhaseMS[phase] }
}

func floorMS(r report) latency         { return r.FloorMS }
func grantNewMS(r report) latency      { return r.GrantNewMS }
func grantExistingMS(r report) latency { return r.GrantExistingMS }
func grantNewLeaseMS(r report) latency { return r.GrantLeaseSeenMS }
func grantExistingLeaseMS(r report) latency {
	return r.GrantExistingLeaseSeenMS
}
func takeoverMS(r report) latency { return r.TakeoverOvershootMS }

// semaphoreGoals are the semaphore step's rows (semaphore.go): reported
// only, since DESIGN §7 sets no goal for a semaphore. Each semaphore
// figure over its phase's floor and over the mutex measured beside it in
// the same phase, p50 and tail; the mutex's own over the floor.
func semaphoreGoals() []goal {
	grant := func(k string) func(report) latency { return func(r report) latency { return r.SemaphoreGrantMS[k] } }
	handoff := func(k string) func(report) latency { return func(r report) latency { return r.SemaphoreHandoffMS[k] } }
	admission := func(k string) func(report) latency {
		return func(r report) latency { return r.SemaphoreAdmissionMS[k] }
	}
	var out []goal
	for k := 0; k < semaphoreMax; k++ {
		key := fmt.Sprintf("permits_held_%d", k)
		out = append(out, semaphoreRows(fmt.Sprintf("semaphore_grant_ms %s", key), "semaphore_grant_"+key, "semaphore_grant",
			fmt.Sprintf("claim created on an existing %d-permit lock with %d held -> Held", semaphoreMax, k), grant(key), grant("mutex"), nil)...)
	}
	out = append(out, mutexRows("semaphore_grant_ms mutex", "semaphore_grant_mutex", "semaphore_grant",
		"claim created on an existing free mutex lock -> Held, beside the semaphore's", grant("mutex"))...)
	out = append(out, semaphoreRows("semaphore_handoff_ms", "semaphore_handoff", "semaphore_handoff",
		fmt.Sprintf("one of %d holders deletes its claim -> the 1 waiter Held", semaphoreMax), handoff("semaphore"), handoff("mutex"), nil)...)
	out = append(out, mutexRows("semaphore_handoff_ms mutex", "semaphore_handoff_mutex", "semaphore_handoff",
		"the holder deletes its claim -> the 1 waiter Held, beside the semaphore's", handoff("mutex"))...)
	withUnguarded := func(r report) string {
		return latText(r.SemaphoreAdmissionMS["semaphore"]) + "; mutex " + latText(r.SemaphoreAdmissionMS["mutex"]) +
			"; unguarded " + latText(r.SemaphoreAdmissionMS["unguarded"])
	}
	out = append(out, semaphoreRows("semaphore_admission_ms", "semaphore_admission", "semaphore_admission",
		"fenced ConfigMap update presenting a live permit's epoch, webhook mode", admission("semaphore"), admission("mutex"), withUnguarded)...)
	out = append(out, mutexRows("semaphore_admission_ms mutex", "semaphore_admission_mutex", "semaphore_admission",
		"the same on a mutex lock's object, its holder's epoch, interleaved", admission("mutex"))...)
	return out
}

// semaphoreRows: a semaphore figure's p50 and tail over its phase's floor
// and over the mutex's (beside: the value printed on the mutex rows; nil,
// the two latencies).
func semaphoreRows(figure, key, phase, what string, sem, mutex func(report) latency, beside func(report) string) []goal {
	if beside == nil {
		beside = func(r report) string { return latText(sem(r)) + "; mutex " + latText(mutex(r)) }
	}
	rows := mutexRows(figure, key, phase, what, sem)
	return append(rows,
		p50Goal(goal{figure: figure + " p50 / mutex", key: key + "_p50_over_mutex_p50", value: unmeasured(sem, beside),
			target: "(reported: " + what + "; over the mutex's p50, same phase)", skipped: notRun(sem)}, sem, mutex),
		tailGoal(goal{figure: figure + " p99 / mutex", key: key + "_p99_over_mutex_p99", value: unmeasured(sem, beside),
			target: "(reported: " + what + "; over the mutex's p99, same phase)", skipped: notRun(sem)}, sem, mutex))
}

// mutexRows: a figure's p50 and tail over its phase's floor.
func mutexRows(figure, key, phase, what string, l func(report) latency) []goal {
	return []goal{
		p50Goal(goal{figure: figure + " p50 / floor", key: key + "_p50_over_floor_p50", value: unmeasured(l, vsFloor(l, phase)),
			target: "(reported: " + what + "; over its phase's floor p50)", skipped: notRun(l)}, l, phaseFloor(phase)),
		tailGoal(goal{figure: figure + " p99 / floor", key: key + "_p99_over_floor_p99", value: unmeasured(l, vsFloor(l, phase)),
			target: "(reported: " + what + "; over its phase's floor p99)", skipped: notRun(l)}, l, phaseFloor(phase)),
	}
}

// notRun: the figure has no samples (its step did not run).
func notRun(l func(report) latency) func(report) bool {
	return func(r report) bool { return l(r).N == 0 }
}

// unmeasured prints value, or that the step did not run.
func unmeasured(l func(report) latency, value func(report) string) func(report) string {
	return func(r report) string {
		if l(r).N == 0 {
			return "not measured (the semaphore step did not run)"
		}
		return value(r)
	}
}

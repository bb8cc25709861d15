// Command bench measures fencekeeper against the floor (one
// resourceVersion-guarded Lease update on the same apiserver, same run) and
// against client-go leader election, on a fresh control plane and manager
// process of its own. It reports; it does not fail on timing (make bench).
//
// main.go runs the steps in order; each measurement lives in the file named
// after it (floor, grant, handoff, writes, takeover, graceful, throughput and
// chainfloor, admission, semaphore, celmode, staleness, scale), the goals in
// goals.go and the output in report.go.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

type params struct {
	floorN, grantN, handoffRounds, takeoverRuns, throughputCycles, guardedN, scaleClaims, scaleLocks int
	ttl                                                                                              time.Duration
}

var (
	quickParams = params{floorN: 100, grantN: 30, handoffRounds: 10, takeoverRuns: 5, throughputCycles: 300, guardedN: 100, scaleClaims: 2000, scaleLocks: 1000, ttl: 2 * time.Second}
	// The full run's grants and handoffs are 200 each: enough for a p99.
	fullParams = params{floorN: 500, grantN: 200, handoffRounds: 200, takeoverRuns: 20, throughputCycles: 1000, guardedN: 500, scaleClaims: 10000, scaleLocks: 5000, ttl: 2 * time.Second}
)

func main() {
	// client-go's leader election logs every acquisition; the report is
	// the output.
	klog.SetLogger(logr.Discard())
	logf.SetLogger(logr.Discard()) // the fenced election's clients
	quick := os.Getenv("BENCH_QUICK") == "1"
	p := fullParams
	if quick {
		p = quickParams
	}
	only, err := parseOnly(os.Getenv("BENCH_ONLY"))
	if err == nil {
		err = os.MkdirAll(".bench", 0o755) // the report and any profile go there
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := run(quick, p, only); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func step(name string) func() {
	start := time.Now()
	fmt.Fprintf(os.Stderr, ">> %s ...", name)
	return func() { fmt.Fprintf(os.Stderr, " %.1fs\n", time.Since(start).Seconds()) }
}

func run(quick bool, p params, only steps) error {
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
	r := report{Quick: quick, Only: only.names(), HandoffMS: map[string]latency{}, Ratios: map[string]float64{}, RequestCostMS: map[string]map[string]float64{},
		HandoffLeaseSeenMS: map[string]latency{}, FloorByPhaseMS: map[string]latency{},
		GuardedUpdateCELByBindings: map[string]latency{}, UnguardedUpdateCELByBindings: map[string]latency{},
		SemaphoreGrantMS: map[string]latency{}, SemaphoreGrantLeaseSeenMS: map[string]latency{}, SemaphoreHandoffMS: map[string]latency{},
		SemaphoreHandoffLeaseSeenMS: map[string]latency{}, SemaphoreAdmissionMS: map[string]latency{}}

	done = step("warm-up")
	if _, err := measureGrant(ctx, c, cl, 5, false); err != nil {
		return err
	}
	if _, err := measureFloor(ctx, c, 20); err != nil {
		return err
	}
	resetFloorPool()
	done()

	done = step("floor")
	if r.RequestCostMS["floor"], err = costAround(cl, func() (err error) {
		r.FloorByPhaseMS["floor"], err = measureFloor(ctx, c, p.floorN)
		return err
	}); err != nil {
		return err
	}
	done()

	if only.want("grant") {
		for _, phase := range []string{"grant_new", "grant_existing"} {
			done = step(strings.ReplaceAll(phase, "_", " on ") + " locks (jittered, a floor round trip between grants)")
			t, err := measureGrant(ctx, c, cl, p.grantN, phase == "grant_existing")
			if err != nil {
				return err
			}
			r.FloorByPhaseMS[phase], r.RequestCostMS[phase] = t.floor, t.cost
			writes := round2(t.writes / float64(p.grantN))
			if phase == "grant_existing" {
				r.GrantExistingMS, r.GrantExistingLeaseSeenMS, r.WritesPerGrantExisting = t.held, t.named, writes
			} else {
				r.GrantNewMS, r.GrantMS, r.GrantLeaseSeenMS, r.WritesPerGrantNew, r.WritesPerGrant = t.held, t.held, t.named, writes, writes
			}
			done()
		}
	}

	if only.want("handoff") {
		for _, waiters := range []int{1, 10, 1000} {
			done = step(fmt.Sprintf("handoff with %d waiters", waiters))
			profile := ""
			if waiters == 1000 && os.Getenv("BENCH_HANDOFF_PROFILE") == "1" {
				profile = ".bench/handoff-cpu.pprof"
			}
			t, err := measureHandoff(ctx, c, cl, waiters, p.handoffRounds, profile)
			if err != nil {
				return err
			}
			k := fmt.Sprintf("waiters_%d", waiters)
			r.HandoffMS[k], r.HandoffLeaseSeenMS[k] = t.held, t.named
			r.FloorByPhaseMS["handoff_"+k], r.RequestCostMS["handoff_"+k] = t.floor, t.cost
			if waiters == 1000 {
				r.WritesPerHandoff = round2(t.writes / float64(p.handoffRounds))
			}
			done()
		}
	}

	if only.want("etcd-mutex") {
		done = step("handoff on etcd's concurrency.Mutex (the peer), same etcd")
		// A p50 peer: 50 rounds suffice.
		if r.EtcdMutexHandoffMS, err = measureEtcdMutexHandoff(ctx, cl.env.ControlPlane.Etcd.URL.String(), min(p.handoffRounds, 50)); err != nil {
			return err
		}
		done()
	}

	if only.want("resync") {
		done = step(fmt.Sprintf("no-op resync (%v sync period)", syncPeriod))
		if r.NoopResyncWrites, err = measureNoopResync(cl, syncPeriod); err != nil {
			return err
		}
		done()
	}

	if only.want("steady") {
		done = step(fmt.Sprintf("steady state: pods holding leases, library holders renewing (%d each, %v)", steadyLocks, steadyWindow))
		if r.PodHeldSteadyWrites, err = measurePodHeldWrites(ctx, cl, c); err != nil {
			return err
		}
		if r.WritesPerRenewal, err = measureWritesPerRenewal(ctx, cl, cl.admin, c); err != nil {
			return err
		}
		done()
	}

	if only.want("takeover") {
		done = step("takeover (fencekeeper and client-go leader election)")
		if r.TakeoverOvershootMS, err = measureTakeover(ctx, c, p.takeoverRuns, p.ttl, false); err != nil {
			return err
		}
		if r.ClientgoTakeoverOvershootMS, r.ClientgoTakeoverBeforeTTLShare, err = measureClientGoTakeover(ctx, cl.admin, p.takeoverRuns, p.ttl); err != nil {
			return err
		}
		if r.ElectionTakeoverOvershootMS, r.ElectionTakeoverPhasesMS, err = measureElectionTakeover(ctx, cl.admin, p.takeoverRuns, p.ttl, false); err != nil {
			return err
		}
		if r.TakeoverBurstOvershootMS, err = measureTakeover(ctx, c, p.takeoverRuns, p.ttl, true); err != nil {
			return err
		}
		if r.ElectionTakeoverBurstOvershootMS, r.ElectionTakeoverBurstPhasesMS, err = measureElectionTakeover(ctx, cl.admin, p.takeoverRuns, p.ttl, true); err != nil {
			return err
		}
		done()
	}

	if only.want("graceful") {
		done = step(fmt.Sprintf("graceful handoff (fenced election and client-go ReleaseOnCancel, TTL %v)", gracefulTTL))
		if r.GracefulHandoffMS, r.ClientgoGracefulHandoffMS, err = gracefulHandoffs(ctx, cl.admin, p.takeoverRuns); err != nil {
			return err
		}
		done()
	}

	if only.want("throughput") {
		const conc = 16
		done = step(fmt.Sprintf("throughput: grant cycles, the chain floor, the Lease floor (%d at once)", conc))
		before := cl.snapshot()
		apiserverProfile := cl.apiserverProfile(ctx, os.Getenv("BENCH_APISERVER_PROFILE") == "1", ".bench/apiserver-cpu.pprof")
		managerProfile := make(chan error, 1)
		if os.Getenv("BENCH_THROUGHPUT_PROFILE") == "1" {
			go func() { managerProfile <- cl.profile("profile", 4, ".bench/throughput-cpu.pprof") }()
		} else {
			managerProfile <- nil
		}
		if r.GrantsPerS, err = grantThroughput(ctx, c, p.throughputCycles, conc); err != nil {
			return err
		}
		if err := apiserverProfile(); err != nil {
			fmt.Fprintln(os.Stderr, "bench: kube-apiserver CPU profile:", err)
		}
		if err := <-managerProfile; err != nil {
			fmt.Fprintln(os.Stderr, "bench: manager CPU profile:", err)
		}
		r.ThroughputBreakdown = since(before, cl.snapshot(), cl.lockWorkers)
		before = cl.snapshot()
		if r.ChainFloorGrantsPerS, err = chainFloor(ctx, cl.admin, p.throughputCycles, conc, false); err != nil {
			return err
		}
		r.ChainFloorThroughputBreakdown = since(before, cl.snapshot(), cl.lockWorkers)
		before = cl.snapshot()
		if r.ChainFloorWithEventsGrantsPerS, err = chainFloor(ctx, cl.admin, p.throughputCycles, conc, true); err != nil {
			return err
		}
		r.ChainFloorWithEventsThroughputBreakdown = since(before, cl.snapshot(), cl.lockWorkers)
		before = cl.snapshot()
		if r.FloorUpdatesPerS, err = floorThroughput(ctx, c, p.throughputCycles, conc); err != nil {
			return err
		}
		r.FloorThroughputBreakdown = since(before, cl.snapshot(), cl.lockWorkers)
		done()
	}

	if only.want("admission") {
		done = step("admission cost")
		handlerMS, serverMS, callMS, err := cl.admissionMeansMS(func() (err error) {
			r.GuardedUpdateMS, r.UnguardedUpdateMS, err = guardedVsUnguarded(ctx, c, p.guardedN)
			return err
		})
		if err != nil {
			return err
		}
		r.WebhookHandlerMeanMS, r.WebhookServerMeanMS, r.WebhookCallMeanMS = round2(handlerMS), round2(serverMS), round2(callMS)
		done()
	}

	if only.want("semaphore") {
		// Reported figures (DESIGN §7 sets no goal): a 3-permit lock beside
		// a mutex, each phase interleaving the two against its own floor.
		done = step(fmt.Sprintf("semaphore: grants on existing locks, %d permits and a mutex (0..%d permits held; jittered, a floor round trip between grants)", semaphoreMax, semaphoreMax-1))
		if r.SemaphoreGrantMS, r.SemaphoreGrantLeaseSeenMS, r.FloorByPhaseMS["semaphore_grant"], err = measureSemaphoreGrant(ctx, c, p.grantN); err != nil {
			return err
		}
		done()
		done = step(fmt.Sprintf("semaphore: handoff, %d holders and 1 waiter, beside a mutex's 1 and 1 (jittered)", semaphoreMax))
		if r.SemaphoreHandoffMS, r.SemaphoreHandoffLeaseSeenMS, r.FloorByPhaseMS["semaphore_handoff"], err = measureSemaphoreHandoff(ctx, c, p.handoffRounds); err != nil {
			return err
		}
		done()
		done = step("semaphore: admission cost, a live permit's epoch vs a mutex holder's (webhook mode)")
		if r.SemaphoreAdmissionMS, r.FloorByPhaseMS["semaphore_admission"], err = measureSemaphoreAdmission(ctx, c, p.guardedN); err != nil {
			return err
		}
		done()
	}

	if only.want("cel") {
		counts := []int{10, 100, 1000, 5000}
		if quick {
			counts = []int{10, 1000}
		}
		done = step(fmt.Sprintf("admission cost in CEL mode (a second control plane; then %v locks bound)", counts))
		if r.GuardedUpdateCELMS, r.UnguardedUpdateCELMS, r.CELByBindings, err = celAdmission(ctx, p.guardedN, counts); err != nil {
			return err
		}
		for _, pt := range r.CELByBindings {
			k := fmt.Sprintf("bindings_%d", pt.Bindings)
			r.GuardedUpdateCELByBindings[k], r.UnguardedUpdateCELByBindings[k] = pt.GuardedMS, pt.UnguardedMS
		}
		done()
	}

	if only.want("staleness") {
		done = step("current staleness window: the old holder's epoch after a handoff")
		if r.StaleRefusedAfterReleaseMS, r.CurrentStalenessWindowMS, err = measureStaleness(ctx, c, p.grantN); err != nil {
			return err
		}
		done()
	}

	// floor_ms: every floor round trip so far (the scale curve's handoffs
	// at tens of thousands of claims left out).
	r.FloorMS = floorOverall()
	if only.want("scale") {
		done = step(fmt.Sprintf("scale: %d claims over %d locks (CPU profile during it)", p.scaleClaims, p.scaleLocks))
		profDone := make(chan error, 1)
		go func() { profDone <- cl.profile("profile", 10, ".bench/cpu.pprof") }()
		// The cluster holds scaleClaims claims when the RSS is read, the
		// earlier steps' (their queues and holders) included, as the scale
		// curve counts them: the step adds the rest, two per lock.
		var earlier fkv1.FencedLeaseList
		if err := c.List(ctx, &earlier); err != nil {
			return err
		}
		add := max(p.scaleClaims-len(earlier.Items), 2)
		locks := max(add*p.scaleLocks/p.scaleClaims, 1)
		var detail string
		r.RSSMiB10k, r.ScaleCorrect, detail, err = scale(ctx, c, cl, add, locks, 32)
		if err != nil {
			return err
		}
		r.ScaleClaims, r.ScaleEarlierClaims, r.ScaleLocks = len(earlier.Items)+add, len(earlier.Items), locks
		if err := <-profDone; err != nil {
			fmt.Fprintln(os.Stderr, "bench: CPU profile:", err)
		}
		_ = cl.profile("heap", 0, ".bench/heap.pprof")
		done()
		fmt.Fprintln(os.Stderr, "   ", detail)

		if os.Getenv("BENCH_SCALE_CURVE") == "1" {
			done = step("scale curve: 1k, 5k, 10k, 25k, 50k claims (two per lock)")
			if r.ScaleCurve, err = scaleCurve(ctx, c, cl, []int{1000, 5000, 10000, 25000, 50000}); err != nil {
				return err
			}
			if n := len(r.ScaleCurve); n > 0 && r.ScaleCurve[n-1].Claims >= 50000 && r.ScaleCurve[n-1].Correct && r.ScaleCurve[n-1].Error == "" {
				r.RSSMiB50k = r.ScaleCurve[n-1].RSSMiB
			}
			done()
		}
	}

	if err := writeReport(&r); err != nil {
		return err
	}
	printTable(os.Stdout, r)
	if only.want("scale") {
		printProfiles()
	}
	return nil
}

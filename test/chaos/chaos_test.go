package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/manager"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
	"github.com/fencekeeper/fencekeeper/webhook"
)

// Window is the staleness window of policy current the checker allows: how
// long after a newer grant was observed a write of an older epoch may still
// be accepted (docs/fencing.md measures a few milliseconds past the grant's
// commit; the slack covers the watch delivery of both events on a busy
// 2-core machine).
const Window = 2 * time.Second

// Settings of a chaos session, from the environment (make chaos sets them).
type settings struct {
	budget   time.Duration // stop starting runs after this (0: no limit)
	runs     int           // run exactly this many (0: as many as the budget allows)
	seed     uint64        // first run's seed; run i uses seed+i
	parallel int
	outDir   string
	// cel: CHAOS_FENCING_MODE=cel runs the fencing rules as the CEL-mode
	// admission policies instead of the webhook.
	cel bool
	// leaderElection: CHAOS_LEADER_ELECTION=1 runs the two managers under
	// leader election, as the chart does: the leader's webhook answers from
	// its cache while it vouches, and the faults move the leadership.
	leaderElection bool
}

func readSettings(t *testing.T) settings {
	s := settings{budget: 60 * time.Second, parallel: 2, outDir: filepath.Join(envtestutil.RepoRoot(), ".chaos"),
		seed: uint64(time.Now().UnixNano() % 1_000_000)}
	if v := os.Getenv("CHAOS_BUDGET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_BUDGET=%q: %v", v, err)
		}
		s.budget = d
	}
	for name, dst := range map[string]*int{"CHAOS_RUNS": &s.runs, "CHAOS_PARALLEL": &s.parallel} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a whole number", name, v)
			}
			*dst = n
		}
	}
	switch v := os.Getenv("CHAOS_FENCING_MODE"); v {
	case "", "webhook":
	case "cel":
		s.cel = true
	default:
		t.Fatalf("CHAOS_FENCING_MODE=%q: use webhook or cel", v)
	}
	switch v := os.Getenv("CHAOS_LEADER_ELECTION"); v {
	case "", "0":
	case "1":
		s.leaderElection = true
	default:
		t.Fatalf("CHAOS_LEADER_ELECTION=%q: use 0 or 1", v)
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		s.seed = n
		if s.runs == 0 {
			s.runs = 1
		}
	}
	if s.runs > 0 && os.Getenv("CHAOS_BUDGET") == "" {
		s.budget = 0
	}
	s.parallel = max(s.parallel, 1)
	return s
}

// Summary is what a session reports (written to .chaos/summary.json).
type Summary struct {
	FirstSeed     uint64           `json:"firstSeed"`
	Runs          int              `json:"runs"`
	Faults        map[string]int64 `json:"faults"`
	Grants        int64            `json:"grants"`
	ProcessRuns   int64            `json:"kubectlFenceRuns"`
	ProcessWrites int              `json:"writesAcceptedFromProcesses"`
	Accepted      int64            `json:"writesAccepted"`
	RefusedStale  int64            `json:"writesRefusedStale"`
	RefusedOther  int64            `json:"writesRefusedOther"`
	Conflicts     int64            `json:"writesConflicted"`
	ByMethod      map[string]int64 `json:"writesByMethod"`
	InsideWindow  int              `json:"staleAcceptedInsideWindow"`
	Violations    int              `json:"violations"`
	Seconds       float64          `json:"seconds"`
	Semaphore     SemaphoreSummary `json:"semaphore"`
}

// SemaphoreSummary is what a run reports of its semaphore lock
// (SemaphoreLock, SemaphoreCapacity permits; its own workers).
type SemaphoreSummary struct {
	Lock           string           `json:"lock"`
	Capacity       int              `json:"capacity"`
	Workers        int              `json:"workers"`
	Acquired       int64            `json:"permitsAcquired"`
	Permits        int              `json:"permitsInHistory"`
	MaxLive        int              `json:"maxPermitsListed"`
	MaxHeld        int              `json:"maxClaimsHeld"`
	Accepted       int64            `json:"writesAccepted"`
	RefusedStale   int64            `json:"writesRefusedStale"`
	RefusedOther   int64            `json:"writesRefusedOther"`
	Conflicts      int64            `json:"writesConflicted"`
	ReplyLost      int64            `json:"repliesLost"`
	ByMethod       map[string]int64 `json:"writesByMethod"`
	InsideWindow   int              `json:"staleAcceptedInsideWindow"`
	Regranted      int              `json:"permitsRegrantedToAClaimWhosePermitEnded"`
	Pauses         int64            `json:"holderPauses"`
	OutOfOrder     int64            `json:"outOfOrderDeliveries"`
	Forged         int64            `json:"forgedNextEpoch"`
	MonotonicTried int64            `json:"monotonicAsked"`
	Breaks         int64            `json:"forcedUnlocks"`
	BreaksAsked    int64            `json:"forcedUnlocksAsked"`
}

// TestMain lets the test binary be the command of the process workers.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == WriterCommand {
		os.Exit(RunWriter())
	}
	os.Exit(m.Run())
}

func TestChaos(t *testing.T) {
	s := readSettings(t)
	ctx := context.Background()
	startEnv := envtestutil.StartAdmissionEnv
	if s.cel {
		startEnv = envtestutil.StartCELEnv
	}
	env, err := startEnv(ctx, []string{"configmaps"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Env.Stop() })
	admin, err := client.NewWithWatch(env.Admin, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	logs, err := os.Create(filepath.Join(s.outDir, "managers.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	logf.SetLogger(zap.New(zap.WriteTo(logs)))

	nem, err := startNemesis(ctx, env, admin, s.seed, s.leaderElection, logs)
	if err != nil {
		t.Fatal(err)
	}
	workerCfgs := make([]*rest.Config, 3)
	for i := range workerCfgs {
		u, err := env.Env.AddUser(envtest.User{Name: fmt.Sprintf("chaos-worker-%d", i), Groups: []string{"system:masters"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		workerCfgs[i] = u.Config()
	}
	// The semaphore's holders: one more than it has permits, each a user of
	// its own (rule 9 binds a permit's epoch to its claim's creator).
	semCfgs := make([]*rest.Config, SemaphoreCapacity+1)
	for i := range semCfgs {
		u, err := env.Env.AddUser(envtest.User{Name: fmt.Sprintf("chaos-semaphore-worker-%d", i), Groups: []string{"system:masters"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		semCfgs[i] = u.Config()
	}

	plugin, err := envtestutil.BuildBinary("./cmd/kubectl-fence")
	if err != nil {
		t.Fatal(err)
	}
	pu, err := env.Env.AddUser(envtest.User{Name: "chaos-process-worker", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pkc, err := pu.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	procs := processSetup{plugin: plugin, kubeconfig: filepath.Join(t.TempDir(), "process-worker.kubeconfig")}
	if err := os.WriteFile(procs.kubeconfig, pkc, 0o600); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	sum := Summary{FirstSeed: s.seed, ByMethod: map[string]int64{}}
	var mu sync.Mutex
	counts, semCounts := &Counters{}, &Counters{}
	sum.Semaphore = SemaphoreSummary{Lock: SemaphoreLock, Capacity: SemaphoreCapacity, Workers: len(semCfgs), ByMethod: map[string]int64{}}
	next := 0
	var wg sync.WaitGroup
	for p := 0; p < s.parallel; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				done := (s.runs > 0 && i >= s.runs) || (s.budget > 0 && time.Since(start) > s.budget)
				if !done {
					next++
				}
				mu.Unlock()
				if done {
					return
				}
				seed := s.seed + uint64(i)
				v, st, sst, err := runOnce(ctx, admin, env.Env.ControlPlane.Etcd.URL.String(), procs, workerCfgs, semCfgs, seed, counts, semCounts, s.outDir)
				mu.Lock()
				sum.Runs++
				sum.InsideWindow += st.InsideWindow
				sum.Semaphore.Permits += sst.Permits
				sum.Semaphore.InsideWindow += sst.InsideWindow
				sum.Semaphore.Regranted += sst.Regranted
				sum.Semaphore.MaxLive = max(sum.Semaphore.MaxLive, sst.MaxLive)
				sum.Semaphore.MaxHeld = max(sum.Semaphore.MaxHeld, sst.MaxHeld)
				sum.ProcessWrites += st.ByWriter["p1"]
				sum.Violations += len(v)
				mu.Unlock()
				if err != nil {
					t.Errorf("run with seed %d: %v", seed, err)
				}
				if len(v) > 0 {
					t.Errorf("run with seed %d: %d violations (replay: make chaos CHAOS_SEED=%d; timeline in .chaos/run-%d.txt):\n%s",
						seed, len(v), seed, seed, v[0])
				}
			}
		}()
	}
	wg.Wait()
	sum.Faults = nem.stop()
	sum.Seconds = time.Since(start).Seconds()
	sum.Grants, sum.Accepted, sum.RefusedStale = counts.Grants.Load(), counts.Accepted.Load(), counts.RefusedStale.Load()
	sum.RefusedOther, sum.Conflicts = counts.RefusedOther.Load(), counts.Conflicts.Load()
	sum.Faults["holder-pause"] = counts.Pauses.Load()
	sum.Faults["out-of-order-delivery"] = counts.OutOfOrder.Load()
	sum.Faults["reply-lost"] = counts.ReplyLost.Load()
	sum.Faults["forged-next-epoch"] = counts.Forged.Load()
	sum.Faults["process-holder-pause"] = counts.ProcessPauses.Load()
	sum.Faults["forced-unlock"] = counts.Breaks.Load()
	sum.Faults["forced-unlock-asked"] = counts.BreaksAsked.Load()
	sum.ProcessRuns = counts.ProcessRuns.Load()
	for i, m := range Methods {
		sum.ByMethod[m] = counts.ByMethod[i].Load()
		sum.Semaphore.ByMethod[m] = semCounts.ByMethod[i].Load()
	}
	ss := &sum.Semaphore
	ss.Acquired, ss.Accepted, ss.RefusedStale, ss.RefusedOther = semCounts.Grants.Load(), semCounts.Accepted.Load(), semCounts.RefusedStale.Load(), semCounts.RefusedOther.Load()
	ss.Conflicts, ss.ReplyLost, ss.Pauses, ss.OutOfOrder = semCounts.Conflicts.Load(), semCounts.ReplyLost.Load(), semCounts.Pauses.Load(), semCounts.OutOfOrder.Load()
	ss.Forged, ss.MonotonicTried, ss.Breaks, ss.BreaksAsked = semCounts.Forged.Load(), semCounts.MonotonicTried.Load(), semCounts.Breaks.Load(), semCounts.BreaksAsked.Load()
	out, _ := json.MarshalIndent(sum, "", "  ")
	_ = os.WriteFile(filepath.Join(s.outDir, "summary.json"), out, 0o644)
	t.Logf("chaos summary:\n%s", out)

	// A run that injected nothing, or in which no stale write was ever tried,
	// proves nothing: make sure the faults actually bit.
	if sum.Runs == 0 || sum.Accepted == 0 {
		t.Fatalf("no run wrote anything: %s", out)
	}
	if sum.Faults["holder-pause"] == 0 || sum.RefusedStale == 0 {
		t.Errorf("no holder was paused past its lease, or no stale write was refused: the runs tested nothing: %s", out)
	}
	if sum.Runs >= 4 && sum.Faults["forced-unlock"] == 0 {
		t.Errorf("%d runs and no lock was ever broken: the forced-unlock path was not tested: %s", sum.Runs, out)
	}
	// The semaphore: its holders must have held permits side by side, and
	// (in webhook mode: CEL mode refuses every write to a semaphore's
	// objects) written with them.
	if ss.Acquired == 0 || (!s.cel && ss.Accepted == 0) {
		t.Errorf("no permit of the semaphore was held, or no write with one was accepted: the semaphore was not tested: %s", out)
	}
	if sum.Runs >= 4 && ss.MaxLive < 2 {
		t.Errorf("%d runs and the semaphore never listed two permits at once: %s", sum.Runs, out)
	}
}

// runOnce is one seeded run in a namespace of its own: three workers on one
// lock, and len(semCfgs) workers on a semaphore lock of SemaphoreCapacity
// permits, for a few seconds, their histories checked.
func runOnce(ctx context.Context, admin client.WithWatch, etcdURL string, procs processSetup, cfgs, semCfgs []*rest.Config, seed uint64, counts, semCounts *Counters, outDir string) ([]Violation, Stats, SemStats, error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	// The nemesis may be restarting kube-apiserver or etcd: wait for it.
	var ns string
	var err error
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		if ns, err = envtestutil.NewNamespace(ctx, admin, fmt.Sprintf("chaos-%d", seed)); err == nil {
			break
		}
		if time.Since(start) > time.Minute {
			return nil, Stats{}, SemStats{}, fmt.Errorf("creating the run's namespace: %w", err)
		}
	}
	lock := "report"
	ttl := time.Duration(2+rng.IntN(2)) * time.Second
	duration := time.Duration(6+rng.IntN(4)) * time.Second
	var rec, semRec *Recorder
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		if rec == nil {
			rec, err = Record(ctx, etcdURL, envtestutil.Scheme(), ns, lock)
		}
		if rec != nil {
			if semRec, err = RecordSemaphore(ctx, etcdURL, envtestutil.Scheme(), ns, SemaphoreLock); err == nil {
				break
			}
		}
		if time.Since(start) > time.Minute {
			if rec != nil {
				_, _ = rec.Stop()
			}
			return nil, Stats{}, SemStats{}, fmt.Errorf("recording: %w", err)
		}
	}

	wctx, cancel := context.WithTimeout(ctx, duration)
	var wg sync.WaitGroup
	var bmu sync.Mutex
	var beliefs, semBeliefs []Belief
	believe := func(b Belief) { bmu.Lock(); beliefs = append(beliefs, b); bmu.Unlock() }
	semBelieve := func(b Belief) { bmu.Lock(); semBeliefs = append(semBeliefs, b); bmu.Unlock() }
	for i, cfg := range cfgs {
		f := NewFaults(nil, rng.Uint64(), 0.05, 0.1, 300*time.Millisecond)
		wcfg := rest.CopyConfig(cfg)
		wcfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
		c, err := client.NewWithWatch(wcfg, client.Options{Scheme: lease.Scheme()})
		if err != nil {
			cancel()
			return nil, Stats{}, SemStats{}, err
		}
		w := &Worker{Name: fmt.Sprintf("w%d", i+1), NS: ns, Lock: lock, TTL: ttl, Client: c,
			Lease: lease.NewClientFrom(c, ns), Faults: f, Rng: rand.New(rand.NewPCG(rng.Uint64(), 2)), Count: counts, Believe: believe}
		wg.Add(1)
		go func() { defer wg.Done(); w.Run(wctx) }()
	}
	pw := &ProcessWorker{Name: "p1", NS: ns, Lock: lock, TTL: ttl, Plugin: procs.plugin, Kubeconfig: procs.kubeconfig,
		Rng: rand.New(rand.NewPCG(rng.Uint64(), 4)), Pauses: &counts.ProcessPauses, Runs: &counts.ProcessRuns}
	wg.Add(1)
	go func() { defer wg.Done(); pw.Run(wctx) }()
	br := &Breaker{NS: ns, Lock: lock, Plugin: procs.plugin, Kubeconfig: procs.kubeconfig,
		Rng: rand.New(rand.NewPCG(rng.Uint64(), 5)), Asked: &counts.BreaksAsked}
	wg.Add(1)
	go func() { defer wg.Done(); br.Run(wctx) }()
	// The semaphore's holders: the same faults (pauses, lost replies,
	// delays, late out-of-order writes, forged tokens, forced unlocks of a
	// permit) and the nemesis's, from the library with MaxHolders.
	for i, cfg := range semCfgs {
		f := NewFaults(nil, rng.Uint64(), 0.05, 0.1, 300*time.Millisecond)
		wcfg := rest.CopyConfig(cfg)
		wcfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
		c, err := client.NewWithWatch(wcfg, client.Options{Scheme: lease.Scheme()})
		if err != nil {
			cancel()
			wg.Wait()
			return nil, Stats{}, SemStats{}, err
		}
		w := &Worker{Name: fmt.Sprintf("s%d", i+1), NS: ns, Lock: SemaphoreLock, TTL: ttl, Client: c,
			Lease: lease.NewClientFrom(c, ns), Faults: f, Rng: rand.New(rand.NewPCG(rng.Uint64(), 6)), Count: semCounts, Believe: semBelieve,
			MaxHolders: SemaphoreCapacity, Objects: ObjectsSemaphore}
		wg.Add(1)
		go func() { defer wg.Done(); w.Run(wctx) }()
	}
	sbr := &Breaker{NS: ns, Lock: SemaphoreLock, Plugin: procs.plugin, Kubeconfig: procs.kubeconfig,
		Rng: rand.New(rand.NewPCG(rng.Uint64(), 7)), Asked: &semCounts.BreaksAsked, Permits: livePermits(admin, ns, SemaphoreLock)}
	wg.Add(1)
	go func() { defer wg.Done(); sbr.Run(wctx) }()
	wg.Wait()
	cancel()
	time.Sleep(time.Second) // the last states reach the recorder
	h, rerrs := rec.Stop()
	sh, serrs := semRec.Stop()
	rerrs = append(rerrs, serrs...)
	v, st := Check(h, Window)
	sv, sst := CheckSemaphore(sh, SemaphoreCapacity, Window)
	v = append(v, sv...)
	bmu.Lock()
	v = append(v, CheckBeliefs(h, beliefs, ttl+Window)...)
	v = append(v, CheckPermitBeliefs(sh, semBeliefs, ttl+Window)...)
	counts.Breaks.Add(int64(Broken(h)))
	semCounts.Breaks.Add(int64(Broken(sh)))
	bmu.Unlock()
	if len(v) > 0 {
		writeTimeline(filepath.Join(outDir, fmt.Sprintf("run-%d.txt", seed)), seed, ttl, append(h, sh...), v)
	}
	if len(rerrs) > 0 {
		return v, st, sst, fmt.Errorf("the history is incomplete: %v", rerrs)
	}
	_ = admin.Delete(ctx, namespaceObj(ns))
	return v, st, sst, nil
}

// livePermits reads the epochs of the live permits of a semaphore lock
// from its Lease (for the breaker: which permit to break).
func livePermits(c client.Client, ns, lock string) func(context.Context) []int64 {
	return func(ctx context.Context) []int64 {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var l coordinationv1.Lease
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &l); err != nil {
			return nil
		}
		var out []int64
		for _, p := range fkv1.ReadLedger(&l, lock).Permits {
			out = append(out, p.Epoch)
		}
		return out
	}
}

func writeTimeline(path string, seed uint64, ttl time.Duration, h []Event, v []Violation) {
	sort.SliceStable(h, func(i, j int) bool { return h[i].RV < h[j].RV })
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run seed=%d ttl=%v window=%v\n\nviolations:\n", seed, ttl, Window)
	for _, x := range v {
		fmt.Fprintf(&b, "  %s\n", x)
	}
	b.WriteString("\nhistory (resourceVersion order; time since the first event):\n")
	for _, e := range h {
		fmt.Fprintf(&b, "  %8.3fs  %s\n", e.At.Sub(h[0].At).Seconds(), e)
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}

// nemesis injects faults for the whole session: SIGSTOP and SIGKILL of the
// webhook-serving manager process, restarts of a second, in-process
// authority (two authorities, no leader election, throughout), restarts of
// kube-apiserver and of etcd (SIGKILL, same command line and data), and
// pauses of etcd (every commit waits).
type nemesis struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	faults map[string]int64
}

func startNemesis(ctx context.Context, env *envtestutil.AdmissionEnv, admin client.Client, seed uint64, leaderElection bool, logs *os.File) (*nemesis, error) {
	dir, err := os.MkdirTemp("", "fencekeeper-chaos-")
	if err != nil {
		return nil, err
	}
	// The manager process reaches the apiserver through a proxy the nemesis
	// can partition (CHAOS_PARTITIONS=1; see docs/reliability.md).
	server, err := url.Parse(env.Admin.Host)
	if err != nil {
		return nil, err
	}
	proxy, err := fault.NewProxy(server.Host)
	if err != nil {
		return nil, err
	}
	partitions := os.Getenv("CHAOS_PARTITIONS") == "1"
	var procArgs []string
	secondOpts := envtestutil.ManagerOptions{}
	if env.CEL {
		// CHAOS_FENCING_MODE=cel: both managers apply the CEL-mode policies
		// and keep the bindings; admission runs in the apiserver.
		procArgs = []string{"--fencing-mode=cel", "--guarded-resources=configmaps", "--excluded-namespaces=kube-system," + envtestutil.ManagerNamespace}
		if secondOpts.CEL, err = webhook.ParseGuardedResources([]string{"configmaps"}); err != nil {
			return nil, err
		}
	}
	if leaderElection {
		// Both managers stand for one leadership (short timings, so a
		// SIGSTOP or a partition of a few seconds moves it); the one that
		// loses it exits, and is started again below.
		procArgs = append(procArgs, "--leader-elect", "--leader-election-namespace="+envtestutil.ManagerNamespace,
			"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms")
		secondOpts.LeaderElection = &types.NamespacedName{Namespace: envtestutil.ManagerNamespace, Name: manager.LeaderElectionID}
		secondOpts.SingleAuthority = true
	}
	proc, err := envtestutil.StartManagerProcessVia(ctx, env.Env, admin, dir, logs, proxy, procArgs...)
	if err != nil {
		return nil, err
	}
	second, err := envtestutil.StartManager(env.Manager, secondOpts)
	if err != nil {
		proc.Kill()
		return nil, err
	}
	apiserver, err := fault.FindControlPlaneProcess("kube-apiserver", logs)
	if err != nil {
		return nil, err
	}
	etcd, err := fault.FindControlPlaneProcess("etcd", logs)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	n := &nemesis{cancel: cancel, done: make(chan struct{}), faults: map[string]int64{}}
	rng := rand.New(rand.NewPCG(seed, 3))
	go func() {
		defer close(n.done)
		defer func() {
			proxy.Heal()
			proc.Stop()
			proxy.Close()
			_ = second.Stop()
			apiserver.Stop()
			etcd.Stop()
		}()
		for {
			sleep(ctx, time.Duration(1000+rng.IntN(2000))*time.Millisecond)
			if ctx.Err() != nil {
				return
			}
			if proc.Exited() {
				// It lost its leadership (or crashed): a Deployment restarts it.
				n.count("manager-exited-restart")
				if proc, err = envtestutil.StartManagerProcessVia(context.Background(), env.Env, admin, dir, logs, proxy, procArgs...); err != nil {
					panic(fmt.Sprintf("restarting the manager process: %v", err))
				}
			}
			if second.Exited() {
				n.count("authority-exited-restart")
				if second, err = envtestutil.StartManager(env.Manager, secondOpts); err != nil {
					panic(fmt.Sprintf("restarting the in-process authority: %v", err))
				}
			}
			kinds := 7
			if partitions {
				kinds = 8
			}
			switch k := rng.IntN(kinds); k {
			case 0:
				n.count("manager-sigstop")
				_ = proc.Signal(syscall.SIGSTOP)
				sleep(ctx, time.Duration(300+rng.IntN(5000))*time.Millisecond)
				_ = proc.Signal(syscall.SIGCONT)
			case 1:
				n.count("manager-sigkill")
				proc.Kill()
				if proc, err = envtestutil.StartManagerProcessVia(context.Background(), env.Env, admin, dir, logs, proxy, procArgs...); err != nil {
					panic(fmt.Sprintf("restarting the manager process: %v", err))
				}
			case 2:
				n.count("authority-restart")
				_ = second.Stop()
				sleep(ctx, time.Duration(rng.IntN(2000))*time.Millisecond)
				if second, err = envtestutil.StartManager(env.Manager, secondOpts); err != nil {
					panic(fmt.Sprintf("restarting the in-process authority: %v", err))
				}
			case 3:
				n.count("apiserver-restart")
				if err := apiserver.Restart(time.Duration(rng.IntN(1000)) * time.Millisecond); err != nil {
					panic(err)
				}
				_ = fault.WaitAnswering(context.Background(), admin) // runs wait for it too
			case 4:
				n.count("etcd-restart")
				if err := etcd.Restart(time.Duration(rng.IntN(1000)) * time.Millisecond); err != nil {
					panic(err)
				}
				_ = fault.WaitAnswering(context.Background(), admin) // runs wait for it too
			case 5:
				n.count("etcd-pause")
				etcd.Pause(time.Duration(200+rng.IntN(3000)) * time.Millisecond)
			case 7:
				// The manager process loses the apiserver (its webhook is still
				// called): its cache freezes while the other authority grants.
				n.count("manager-partition")
				proxy.Partition()
				sleep(ctx, time.Duration(300+rng.IntN(5000))*time.Millisecond)
				proxy.Heal()
			}
		}
	}()
	return n, nil
}

func (n *nemesis) count(kind string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults[kind]++
}

func (n *nemesis) stop() map[string]int64 {
	n.cancel()
	<-n.done
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]int64{}
	for k, v := range n.faults {
		out[k] = v
	}
	return out
}

func namespaceObj(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// processSetup is what the process workers need: the kubectl-fence binary
// and a kubeconfig of their own user.
type processSetup struct{ plugin, kubeconfig string }

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fencekeeper/fencekeeper/internal/manager"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// cluster is the bench's own control plane (etcd, kube-apiserver) and a
// manager process, all fresh.
type cluster struct {
	env     *envtest.Environment
	admin   *rest.Config
	manager *exec.Cmd
	pprof   string
	probe   string
	metrics string
	// systemLeaseWrites counts writes to Leases in kube-system (the
	// apiserver's own identity heartbeat), which the metrics also count.
	systemLeaseWrites atomic.Int64
	dir               string
	metricsC          *http.Client
	// lockWorkers is the manager's --lock-concurrency.
	lockWorkers int
}

// managerMemLimit is the soft memory limit the manager gives itself under
// the chart's defaults: 80% (--memory-limit-ratio) of its 768Mi container
// limit. The bench's manager runs outside a container, so it is set here.
const managerMemLimit = "614MiB"

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startCluster(ctx context.Context, syncPeriod time.Duration) (*cluster, error) {
	a, err := envtestutil.StartAdmissionEnv(ctx, []string{"configmaps"})
	if err != nil {
		return nil, err
	}
	c := &cluster{env: a.Env, admin: a.Admin}
	c.dir, _ = os.MkdirTemp("", "fencekeeper-bench-")
	mu, err := a.Env.AddUser(envtest.User{Name: envtestutil.ManagerUser, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kc, err := mu.KubeConfig()
	if err != nil {
		return nil, err
	}
	kcPath := filepath.Join(c.dir, "manager.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return nil, err
	}
	c.pprof, c.probe, c.metrics = freeAddr(), freeAddr(), freeAddr()
	wh := a.Env.WebhookInstallOptions
	c.manager = exec.Command(filepath.Join(envtestutil.RepoRoot(), "bin", "manager"),
		"--kubeconfig", kcPath, "--metrics-bind-address", c.metrics, "--health-probe-bind-address", c.probe,
		"--pprof-bind-address", c.pprof, "--webhook-port", strconv.Itoa(wh.LocalServingPort),
		"--webhook-cert-dir", wh.LocalServingCertDir, "--sync-period", syncPeriod.String(), "--zap-log-level", "error",
		// The 1,000-waiter handoff queues 1,000 waiters plus one per round.
		"--max-waiters-per-lock", "5000",
		// The only manager: its webhook answers from its cache while the
		// authority vouches, as the chart's leader does.
		"--single-authority")
	c.lockWorkers = manager.DefaultConcurrency
	if v := os.Getenv("BENCH_LOCK_CONCURRENCY"); v != "" {
		// Measure another --lock-concurrency than the manager's default.
		c.manager.Args = append(c.manager.Args, "--lock-concurrency", v)
		if c.lockWorkers, err = strconv.Atoi(v); err != nil || c.lockWorkers < 1 {
			return nil, fmt.Errorf("BENCH_LOCK_CONCURRENCY=%q: want a positive whole number", v)
		}
	}
	logp := filepath.Join(c.dir, "manager.log")
	if v := os.Getenv("BENCH_MANAGER_LOG"); v != "" {
		// Keep the manager's log, at info level (grants, ends), there.
		logp = v
		c.manager.Args = append(c.manager.Args, "--zap-log-level", "info", "--zap-time-encoding", "rfc3339nano")
	}
	logf, _ := os.Create(logp)
	c.manager.Stdout, c.manager.Stderr = logf, logf
	c.manager.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// As the chart runs it: a soft memory limit below the container's.
	limit := managerMemLimit
	if v := os.Getenv("BENCH_GOMEMLIMIT"); v != "" {
		limit = v
	}
	c.manager.Env = append(os.Environ(), "GOMEMLIMIT="+limit)
	if err := c.manager.Start(); err != nil {
		return nil, fmt.Errorf("starting bin/manager (run make build): %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + c.probe + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("manager not ready after 60s; log in %s", c.dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.watchSystemLeases(ctx); err != nil {
		return nil, err
	}
	tr, err := rest.TransportFor(c.admin)
	if err != nil {
		return nil, err
	}
	c.metricsC = &http.Client{Transport: tr}
	return c, nil
}

func (c *cluster) stop() {
	if c.manager != nil && c.manager.Process != nil {
		_ = c.manager.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = c.manager.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.manager.Process.Kill()
		}
	}
	_ = c.env.Stop()
	_ = os.RemoveAll(c.dir)
}

// rssMiB reads the manager's resident set size.
func (c *cluster) rssMiB() float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.manager.Process.Pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(sc.Text())[1], 64)
			return kb / 1024
		}
	}
	return -1
}

// writes counts the apiserver's own record of mutating requests to Leases
// and FencedLease status (what the manager writes), from apiserver_request_total,
// less the apiserver's identity heartbeats and the bench's floor Leases.
func (c *cluster) writes() (leases, claimStatus float64) {
	if !c.eachRequestTotal(func(l map[string]string, v float64) {
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		default:
			return
		}
		if l["dry_run"] != "" {
			return
		}
		switch {
		case l["resource"] == "leases":
			leases += v
		case l["resource"] == "fencedleases" && l["subresource"] == "status":
			claimStatus += v
		}
	}) {
		return -1, -1
	}
	leases -= float64(c.systemLeaseWrites.Load() + floorWrites.Load())
	return
}

// mutations counts every mutating request the apiserver served (any
// resource, dry runs left out), less its identity heartbeats and the
// bench's floor Leases.
func (c *cluster) mutations() float64 {
	var n float64
	if !c.eachRequestTotal(func(l map[string]string, v float64) {
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
			if l["dry_run"] == "" {
				n += v
			}
		}
	}) {
		return -1
	}
	return n - float64(c.systemLeaseWrites.Load()+floorWrites.Load())
}

// eachRequestTotal calls f with the labels and value of every
// apiserver_request_total sample; false when the metrics cannot be read.
func (c *cluster) eachRequestTotal(f func(labels map[string]string, v float64)) bool {
	return c.eachApiserverSample(map[string]func(map[string]string, float64){"apiserver_request_total": f})
}

// eachApiserverSample reads kube-apiserver's /metrics once and calls, for
// every sample of a metric named in fs, that metric's function with the
// sample's labels and value; false when the metrics cannot be read.
func (c *cluster) eachApiserverSample(fs map[string]func(labels map[string]string, v float64)) bool {
	resp, err := c.metricsC.Get(strings.TrimSuffix(c.admin.Host, "/") + "/metrics")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: reading apiserver metrics:", err)
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "bench: reading apiserver metrics:", resp.Status, c.admin.Host)
	}
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		f := fs[name]
		if !ok || f == nil {
			continue
		}
		labels, val, _ := strings.Cut(rest, "} ")
		v, _ := strconv.ParseFloat(val, 64)
		f(parseLabels(labels), v)
	}
	return true
}

func (c *cluster) watchSystemLeases(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.admin)
	if err != nil {
		return err
	}
	w, err := cs.CoordinationV1().Leases("kube-system").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified || ev.Type == watch.Added || ev.Type == watch.Deleted {
				c.systemLeaseWrites.Add(1)
			}
		}
	}()
	return nil
}

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			out[k] = strings.Trim(v, `"`)
		}
	}
	return out
}

// apiserverProfile, when on, starts a 2 s CPU profile of kube-apiserver
// (its /debug/pprof, as the admin) and returns the wait for it to be
// written to path.
func (c *cluster) apiserverProfile(ctx context.Context, on bool, path string) func() error {
	if !on {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		cs, err := kubernetes.NewForConfig(c.admin)
		if err != nil {
			done <- err
			return
		}
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "2").DoRaw(ctx)
		if err != nil {
			done <- err
			return
		}
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		done <- os.WriteFile(path, raw, 0o644)
	}()
	return func() error { return <-done }
}

// profile fetches a pprof profile from the manager into path.
func (c *cluster) profile(kind string, seconds int, path string) error {
	url := "http://" + c.pprof + "/debug/pprof/" + kind
	if seconds > 0 {
		url += "?seconds=" + strconv.Itoa(seconds)
	}
	resp, err := (&http.Client{Timeout: time.Duration(seconds+30) * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// handlerTotals reads the manager's fencekeeper_admission_duration_seconds
// histogram: the fencing handler's own time, summed over every request.
// The server's: controller-runtime's webhook latency for /fence, which
// adds reading and decoding the AdmissionReview and writing the reply.
func (c *cluster) handlerTotals() (sum, count, serverSum, serverCount float64) {
	m := c.managerSums([]metricSum{
		{"sum", "fencekeeper_admission_duration_seconds_sum", ""},
		{"count", "fencekeeper_admission_duration_seconds_count", ""},
		{"server_sum", "controller_runtime_webhook_latency_seconds_sum", `webhook="/fence"`},
		{"server_count", "controller_runtime_webhook_latency_seconds_count", `webhook="/fence"`},
	})
	return m["sum"], m["count"], m["server_sum"], m["server_count"]
}

// webhookCallTotals reads kube-apiserver's
// apiserver_admission_webhook_admission_duration_seconds for the fencing
// webhook (fenced.fencekeeper.io): the call as the apiserver times it,
// summed over every request.
func (c *cluster) webhookCallTotals() (sum, count float64) {
	pick := func(into *float64) func(map[string]string, float64) {
		return func(l map[string]string, v float64) {
			if l["name"] == "fenced.fencekeeper.io" {
				*into += v
			}
		}
	}
	c.eachApiserverSample(map[string]func(map[string]string, float64){
		"apiserver_admission_webhook_admission_duration_seconds_sum":   pick(&sum),
		"apiserver_admission_webhook_admission_duration_seconds_count": pick(&count),
	})
	return sum, count
}

// admissionMeansMS is, over the admission requests measure made, the
// webhook handler's mean time, the webhook server's (decoding and
// encoding included), and the apiserver's mean time calling the webhook
// (-1: none seen).
func (c *cluster) admissionMeansMS(measure func() error) (handler, server, call float64, _ error) {
	sum0, count0, ssum0, scount0 := c.handlerTotals()
	csum0, ccount0 := c.webhookCallTotals()
	if err := measure(); err != nil {
		return 0, 0, 0, err
	}
	sum, count, ssum, scount := c.handlerTotals()
	csum, ccount := c.webhookCallTotals()
	mean := func(s0, s, n0, n float64) float64 {
		if n <= n0 {
			return -1
		}
		return (s - s0) / (n - n0) * 1000
	}
	return mean(sum0, sum, count0, count), mean(ssum0, ssum, scount0, scount), mean(csum0, csum, ccount0, ccount), nil
}

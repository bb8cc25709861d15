// Command devcluster runs fencekeeper's local control plane for `make run`
// and `make dev-up`: etcd and kube-apiserver from bin/ (via envtest, on
// loopback), the CRDs from config/crd, an admin kubeconfig in the state
// directory, and optionally bin/manager as a child process. SIGINT or SIGTERM
// stops everything it started.
//
// With --bare (BARE=1; `make helm-local`) it installs nothing and runs the
// pods of fencekeeper's Deployment, once the Helm chart has created it, as
// bin/manager processes (hack/devcluster/localpods): no kubelet runs here.
// The apiserver always resolves the Services it calls (the chart's webhook)
// through their EndpointSlices (--enable-aggregator-routing).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fencekeeper/fencekeeper/hack/devcluster/localpods"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/proc"
	"github.com/fencekeeper/fencekeeper/webhook"
)

type options struct {
	dir, manager          string
	podBinary             string // what runs the chart's pods (bare mode)
	apiPort               int
	metricsAddr, probeAdr string
	guarded, fencingMode  string
	bare, full            bool
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", ".dev", "State directory: kubeconfig, logs, ready marker.")
	flag.StringVar(&o.manager, "manager", "", "Path of bin/manager to run against the control plane (empty: control plane only).")
	flag.IntVar(&o.apiPort, "apiserver-port", envInt("APISERVER_PORT", 16443), "kube-apiserver port on 127.0.0.1 (env APISERVER_PORT).")
	flag.StringVar(&o.metricsAddr, "manager-metrics-address", envStr("MANAGER_METRICS_ADDRESS", "127.0.0.1:18080"), "Manager metrics address (env MANAGER_METRICS_ADDRESS).")
	flag.StringVar(&o.probeAdr, "manager-probe-address", envStr("MANAGER_PROBE_ADDRESS", "127.0.0.1:18081"), "Manager health probe address (env MANAGER_PROBE_ADDRESS).")
	flag.StringVar(&o.guarded, "guarded-resources", envStr("GUARDED_RESOURCES", strings.Join(webhook.DefaultGuardedResources, ",")),
		"Kinds the fencing webhook guards, RESOURCE[.GROUP],... (every version of each; env GUARDED_RESOURCES).")
	flag.StringVar(&o.fencingMode, "fencing-mode", envStr("FENCING_MODE", "webhook"),
		"How fenced writes are checked: webhook (the fencing webhook) or cel (admission policies inside the apiserver) (env FENCING_MODE).")
	flag.BoolVar(&o.bare, "bare", os.Getenv("BARE") == "1",
		"Control plane only: no CRD, webhook, policy or manager (to try the Helm chart; env BARE=1). The pods of fencekeeper's Deployment (the chart's) run as --manager processes.")
	flag.BoolVar(&o.full, "full", os.Getenv("CLUSTER") == "full",
		"Also run kube-controller-manager (garbage collection, namespaces, Deployments, node lifecycle), kube-scheduler and kwok with two fake nodes, so pods of real Deployments are scheduled and become Running (env CLUSTER=full).")
	flag.Parse()
	if o.bare {
		o.podBinary, o.manager = o.manager, ""
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "devcluster: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	dir, _ := filepath.Abs(o.dir)
	ready := filepath.Join(dir, "ready")
	_ = os.Remove(ready)
	// Whatever ends this run, nothing may show it as ready afterwards.
	defer func() { _ = os.Remove(ready) }()
	if err := portsFree(o); err != nil {
		return err
	}

	env, err := envtestutil.New()
	if err != nil {
		return err
	}
	if o.bare {
		env.CRDDirectoryPaths = nil
	}
	// The Services the apiserver calls (the chart's webhook) are reached
	// through their EndpointSlices: no kube-proxy routes a cluster IP here.
	// This devcluster's own manager's webhook is configured by URL.
	localpods.ConfigureAPIServer(env)
	if o.fencingMode != "webhook" && o.fencingMode != "cel" {
		return fmt.Errorf("FENCING_MODE (--fencing-mode) must be webhook or cel, not %q", o.fencingMode)
	}
	if o.manager != "" {
		// CEL mode keeps only the webhook for the scale subresource.
		if err := envtestutil.WithWebhook(env, strings.Split(o.guarded, ","), o.fencingMode == "cel"); err != nil {
			return err
		}
	}
	api := env.ControlPlane.GetAPIServer()
	api.Address = "127.0.0.1"
	api.Port = strconv.Itoa(o.apiPort)
	fmt.Printf(">> starting etcd and kube-apiserver (127.0.0.1:%d) from %s\n", o.apiPort, envtestutil.BinDir())
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	// envtest starts etcd and kube-apiserver in process groups of their
	// own, without a parent-death signal: if this process is killed before
	// it can stop them, dev-down finds them in this file.
	children := filepath.Join(dir, "children")
	if err := recordChildren(children); err != nil {
		fmt.Fprintf(os.Stderr, "devcluster: recording etcd's and kube-apiserver's pids for dev-down: %v\n", err)
	}
	// Deferred before the control plane's stop, so it runs after it.
	defer func() { _ = os.Remove(children) }()
	mode := filepath.Join(dir, "mode")
	defer func() { _ = os.Remove(mode) }()
	defer func() {
		fmt.Println(">> stopping the control plane")
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "devcluster: stopping the control plane: %v\n", err)
		}
	}()

	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kubeconfig, err := writeKubeconfig(admin, dir, "kubeconfig")
	if err != nil {
		return err
	}
	if o.bare {
		fmt.Printf(">> bare control plane (nothing installed); admin kubeconfig: %s\n", kubeconfig)
		if !o.full {
			defer startLocalPods(ctx, o, cfg, dir, children)()
		}
	} else {
		fmt.Printf(">> CRDs installed from config/crd; admin kubeconfig: %s\n", kubeconfig)
	}

	if o.full {
		cl, err := envtestutil.StartCluster(env, envtestutil.ClusterOptions{Dir: dir, NodeMonitorGracePeriod: 40 * time.Second})
		if err != nil {
			return fmt.Errorf("starting kube-controller-manager, kube-scheduler and kwok: %w", err)
		}
		defer cl.Stop()
		c, err := client.New(cfg, client.Options{})
		if err != nil {
			return err
		}
		for _, n := range []string{"kwok-node-0", "kwok-node-1"} {
			if _, err := envtestutil.AddNode(ctx, c, n); err != nil {
				return err
			}
		}
		fmt.Printf(">> kube-controller-manager, kube-scheduler and kwok running (logs in %s); fake nodes kwok-node-0, kwok-node-1 are Ready\n", dir)
	}

	var managerDone chan error
	if o.manager != "" {
		mu, err := env.AddUser(envtest.User{Name: envtestutil.ManagerUser, Groups: []string{"system:masters"}}, nil)
		if err != nil {
			return err
		}
		mkc, err := writeKubeconfig(mu, dir, "manager.kubeconfig")
		if err != nil {
			return err
		}
		if err := envtestutil.InstallLeaseGuard(ctx, cfg, mu.Config(), envtestutil.ManagerUser); err != nil {
			return fmt.Errorf("installing the managed-Lease guard: %w", err)
		}
		how := "fencing webhook registered for " + o.guarded
		if o.fencingMode == "cel" {
			how = "CEL mode: the manager applies the fencing admission policies for " + o.guarded + " (and serves the webhook for their scale subresource)"
		}
		fmt.Printf(">> managed-Lease guard installed (only %q may rewrite managed Leases); %s\n", envtestutil.ManagerUser, how)
		cmd, err := startManager(o, mkc, &env.WebhookInstallOptions)
		if err != nil {
			return err
		}
		managerDone = make(chan error, 1)
		go func() { managerDone <- cmd.Wait() }()
		defer stopProcess(cmd, managerDone)
		if err := waitReady(ctx, "http://"+o.probeAdr+"/readyz", managerDone); err != nil {
			return err
		}
		fmt.Printf(">> manager running (pid %d; metrics http://%s/metrics)\n", cmd.Process.Pid, o.metricsAddr)
	}

	// Again, with the manager (and kube-controller-manager and kwok): they
	// die with this process, but dev-down need not rely on it.
	if err := recordChildren(children); err != nil {
		fmt.Fprintf(os.Stderr, "devcluster: recording the pids of its processes for dev-down: %v\n", err)
	}
	m := "manager"
	if o.bare {
		m = "bare"
	}
	if o.full {
		m += " full"
	}
	if err := os.WriteFile(mode, []byte(m+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(ready, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf(`
fencekeeper's local control plane is up. In another shell:

    export KUBECONFIG=%s
    kubectl get fencedleases -A      # bin/kubectl is v1.37.2

Press Ctrl-C (or run 'make dev-down' for dev-up) to stop everything.
`, kubeconfig)

	select {
	case <-ctx.Done():
		fmt.Println("\n>> shutting down")
		return nil
	case err := <-managerDone:
		managerDone <- err // for the deferred stopProcess
		return fmt.Errorf("the manager exited: %w", err)
	}
}

// startLocalPods runs the pods of fencekeeper's Deployment, when the Helm
// chart creates one, as processes of o.podBinary (localpods); stop stops
// them.
func startLocalPods(ctx context.Context, o options, cfg *rest.Config, dir, children string) (stop func()) {
	if o.podBinary == "" {
		fmt.Println(">> no --manager binary: the chart's pods will not run here")
		return func() {}
	}
	ip := envtestutil.AdvertiseAddress()
	if ip == "" {
		fmt.Println(">> no non-loopback IPv4 address on an interface that is up (an EndpointSlice refuses loopback): the chart's pods will not run here")
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := localpods.Run(pctx, localpods.Options{
			Config: cfg, Binary: o.podBinary, HostIP: ip, Dir: filepath.Join(dir, "pods"), Log: os.Stdout,
			OnProcess: func() {
				if err := recordChildren(children); err != nil {
					fmt.Fprintf(os.Stderr, "devcluster: recording the pids of its processes for dev-down: %v\n", err)
				}
			},
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "devcluster: the chart's pods will not run here: %v\n", err)
		}
	}()
	fmt.Printf(">> fencekeeper's Deployment (label %s), once installed, runs here: its pods as %s processes (pod IP %s, ports of their own; output in %s), its Services' EndpointSlices point at them\n",
		localpods.DefaultSelector, o.podBinary, ip, filepath.Join(dir, "pods"))
	return func() {
		cancel()
		<-done
	}
}

func writeKubeconfig(user *envtest.AuthenticatedUser, dir, name string) (string, error) {
	b, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, b, 0o600)
}

func startManager(o options, kubeconfig string, wh *envtest.WebhookInstallOptions) (*exec.Cmd, error) {
	args := []string{"--kubeconfig", kubeconfig, "--metrics-bind-address", o.metricsAddr, "--health-probe-bind-address", o.probeAdr,
		"--fencing-mode", o.fencingMode,
		// The only manager here: its webhook may trust its cache while its
		// authority vouches for it (as the chart's leader does).
		"--single-authority"}
	args = append(args, "--webhook-port", strconv.Itoa(wh.LocalServingPort), "--webhook-cert-dir", wh.LocalServingCertDir)
	if o.fencingMode == "cel" {
		args = append(args, "--guarded-resources", o.guarded, "--excluded-namespaces", "kube-system,"+envtestutil.ManagerNamespace)
	}
	cmd := exec.Command(o.manager, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// The manager dies with us even if we are killed without a chance to
	// stop it. Its own process group keeps a terminal's Ctrl-C away from it:
	// we stop it ourselves, after the reply to Ctrl-C is under way, so its
	// exit is not mistaken for a crash.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w (run 'make build')", o.manager, err)
	}
	return cmd, nil
}

func stopProcess(cmd *exec.Cmd, done chan error) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		reportExit(err)
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		reportExit(<-done)
	}
}

func reportExit(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "devcluster: the manager exited: %v\n", err)
	}
}

func waitReady(ctx context.Context, url string, exited chan error) error {
	deadline := time.After(60 * time.Second)
	for {
		if resp, err := http.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("the manager exited before becoming ready: %w", err)
		case <-deadline:
			return errors.New("the manager did not become ready within 60s (see its log above)")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// portsFree fails with the fix when a fixed port is taken.
func portsFree(o options) error {
	addrs := map[string]string{fmt.Sprintf("127.0.0.1:%d", o.apiPort): "APISERVER_PORT"}
	if o.manager != "" {
		addrs[o.metricsAddr] = "MANAGER_METRICS_ADDRESS"
		addrs[o.probeAdr] = "MANAGER_PROBE_ADDRESS"
	}
	for addr, env := range addrs {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s is already in use (is another 'make run' or 'make dev-up' running? "+
				"'make dev-down' stops the background one; or set %s to another address): %v", addr, env, err)
		}
		_ = l.Close()
	}
	return nil
}

func envStr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return def
}

var recording sync.Mutex

// recordChildren writes "PID COMM STARTTIME" for each of this process's
// children to path, for hack/dev-down.sh: it kills a listed pid only while
// the process with that pid has the same name and start time, so a pid
// reused since is left alone. The list is replaced whole (a rename), never
// left half written.
func recordChildren(path string) error {
	recording.Lock() // the chart's pods start and stop at any time
	defer recording.Unlock()
	children, err := proc.Children(os.Getpid())
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, c := range children {
		fmt.Fprintf(&b, "%d %s %s\n", c.Pid, c.Comm, c.StartTime())
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

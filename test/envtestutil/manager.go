package envtestutil

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/fencekeeper/fencekeeper/controllers/lock"
	"github.com/fencekeeper/fencekeeper/internal/manager"
	"github.com/fencekeeper/fencekeeper/webhook"
)

// Scheme knows the built-in kinds and fencekeeper's.
func Scheme() *runtime.Scheme { return manager.Scheme() }

// ManagerOptions configure an in-process manager.
type ManagerOptions struct {
	// WrapTransport wraps the manager's HTTP transport (to count its writes).
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// ForeignLeaseRecheck for the lock controller (0: its default).
	ForeignLeaseRecheck time.Duration
	// Webhook, when set, serves the fencing webhook where envtest registered it.
	Webhook *envtest.WebhookInstallOptions
	// SyncPeriod of the cache (0: controller-runtime's default).
	SyncPeriod time.Duration
	// ExpiredClaimRetention turns the clean-up of Expired claims on (0: off).
	ExpiredClaimRetention time.Duration
	// MaxWaitersPerLock for the lock controller (0: its default).
	MaxWaitersPerLock int
	// Namespaces, when set, limits the manager's cache to them (a manager
	// that sees only one test's objects).
	Namespaces []string
	// CEL, when set, runs CEL enforcement mode for these kinds (policies
	// and per-lock bindings); with Webhook also set, the manager serves the
	// scale webhook of that mode too.
	CEL []webhook.GuardedResource
	// SingleAuthority: this manager is the only lock authority running
	// (the manager's --single-authority): its webhook may answer rule 4
	// from its cache while its authority vouches. Leave it off wherever a
	// test runs several managers.
	SingleAuthority bool
	// LeaderElection, when set, runs the manager under leader election on
	// this Lease (short timings, released on Stop), as the chart runs its
	// replicas: only the leader reconciles locks.
	LeaderElection *types.NamespacedName
}

// Manager is one fencekeeper manager running in the test process, the way a
// separate replica would run: its own cache, clock and memory (and leader
// election only when asked).
type Manager struct {
	Mgr ctrl.Manager
	// Authority is this manager's lock authority.
	Authority *lock.Reconciler
	cancel    context.CancelFunc
	done      ended
}

// StartManager starts a manager and waits for its caches (and webhook server).
func StartManager(cfg *rest.Config, o ManagerOptions) (*Manager, error) {
	mcfg := rest.CopyConfig(cfg)
	mcfg.QPS, mcfg.Burst = 1000, 2000
	if o.WrapTransport != nil {
		mcfg.WrapTransport = o.WrapTransport
	}
	relists := lock.NewRelists()
	opts := ctrl.Options{
		Scheme:                 Scheme(),
		Cache:                  manager.CacheOptions(relists),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	}
	var leadership *manager.LeadershipLock
	if le := o.LeaderElection; le != nil {
		leaseDuration, renewDeadline, retryPeriod := 4*time.Second, 3*time.Second, 200*time.Millisecond
		var err error
		if leadership, err = manager.NewLeaderElectionLock(mcfg, le.Namespace, le.Name, renewDeadline, nil); err != nil {
			return nil, err
		}
		opts.LeaderElection, opts.LeaderElectionReleaseOnCancel, opts.LeaderElectionResourceLockInterface = true, true, leadership
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &leaseDuration, &renewDeadline, &retryPeriod
	}
	if o.SyncPeriod > 0 {
		opts.Cache.SyncPeriod = &o.SyncPeriod
	}
	if len(o.Namespaces) > 0 {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.Namespaces {
			opts.Cache.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if o.Webhook != nil {
		opts.WebhookServer = crwebhook.NewServer(crwebhook.Options{
			Host: o.Webhook.LocalServingHost, Port: o.Webhook.LocalServingPort, CertDir: o.Webhook.LocalServingCertDir,
		})
	}
	mgr, err := ctrl.NewManager(mcfg, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var authority *lock.Reconciler
	wiring := manager.Options{
		OnAuthority: func(r *lock.Reconciler) { authority = r },
		Concurrency: 4, ForeignLeaseRecheck: o.ForeignLeaseRecheck, Webhook: o.Webhook != nil, ForTests: true,
		ExpiredClaimRetention: o.ExpiredClaimRetention, MaxWaitersPerLock: o.MaxWaitersPerLock,
		FencingMode: fencingMode(o.CEL), Guarded: o.CEL, ExcludedNamespaces: []string{"kube-system", ManagerNamespace},
		SingleAuthority: o.SingleAuthority, Relists: relists,
	}
	if leadership != nil {
		wiring.Leadership = leadership
	}
	if err := manager.Setup(ctx, mgr, wiring); err != nil {
		cancel()
		return nil, err
	}
	m := &Manager{Mgr: mgr, Authority: authority, cancel: cancel, done: newEnded()}
	go func() { m.done <- mgr.Start(ctx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		_ = m.Stop()
		return nil, fmt.Errorf("manager caches did not sync")
	}
	if o.Webhook != nil {
		deadline := time.Now().Add(30 * time.Second)
		for mgr.GetWebhookServer().StartedChecker()(nil) != nil {
			if time.Now().After(deadline) {
				_ = m.Stop()
				return nil, fmt.Errorf("webhook server did not start")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return m, nil
}

func fencingMode(cel []webhook.GuardedResource) string {
	if len(cel) > 0 {
		return manager.FencingModeCEL
	}
	return manager.FencingModeWebhook
}

// Exited reports whether the manager has stopped by itself (under leader
// election, it stops when it loses its leadership).
func (m *Manager) Exited() bool {
	exited, _ := m.done.peek()
	return exited
}

// Stop stops the manager and waits for it to finish; it returns the error
// the manager stopped with.
func (m *Manager) Stop() error {
	m.cancel()
	if stopped, err := m.done.wait(30 * time.Second); stopped {
		return err
	}
	return fmt.Errorf("manager did not stop within 30s")
}

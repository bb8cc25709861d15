// Command manager runs fencekeeper's lease authority (the controller that
// grants FencedLeases and issues epochs) and the fencing admission webhook,
// or in CEL mode keeps the fencing admission policies and their bindings.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/fencekeeper/fencekeeper/controllers/lock"
	"github.com/fencekeeper/fencekeeper/internal/manager"
	fencewebhook "github.com/fencekeeper/fencekeeper/webhook"
)

func main() {
	var (
		metricsAddr, probeAddr string
		leaderElect            bool
		singleAuthority        bool
		leaderElectNamespace   string
		leaseDuration          time.Duration
		renewDeadline          time.Duration
		retryPeriod            time.Duration
		concurrency            int
		webhookPort            int
		webhookCertDir         string
		enableWebhook          bool
		certs                  certOptions
		syncPeriod             time.Duration
		pprofAddr              string
		expiredRetention       time.Duration
		maxWaiters             int
		fencingMode            string
		guarded                string
		excludedNamespaces     string
		memoryLimitRatio       float64
		gcTarget               int
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; \"0\" disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz endpoints bind to.")
	flag.BoolVar(&leaderElect, "leader-elect", false,
		"Elect one active manager. For efficiency only: grants stay safe with several managers active at once.")
	flag.BoolVar(&singleAuthority, "single-authority", false,
		"This manager runs alone (one replica, no --leader-elect): its webhook may answer the current-holder rule from its cache while its lock authority vouches for it. "+
			"Implied by --leader-elect. Without either, the webhook reads the lock's Lease live on every fenced write, since another replica may have granted an epoch its cache has not seen. "+
			"Never set it where two managers can run at once (several replicas, or a rolling update of one: use the Recreate strategy).")
	flag.StringVar(&leaderElectNamespace, "leader-election-namespace", "",
		"Namespace of the leader-election Lease (default: the pod's namespace, required out of cluster).")
	flag.DurationVar(&leaseDuration, "leader-elect-lease-duration", 15*time.Second,
		"How long a standby waits, after the last renewal it saw, before it takes the leadership.")
	flag.DurationVar(&renewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"How long the leader keeps trying to renew before it gives up its term; it also vouches for its cache only within this long of its last renewal. Must be less than the lease duration.")
	flag.DurationVar(&retryPeriod, "leader-elect-retry-period", 2*time.Second,
		"How often the leader renews, and a standby tries to take over. Must be less than the renew deadline.")
	flag.IntVar(&concurrency, "lock-concurrency", manager.DefaultConcurrency, "Locks reconciled in parallel.")
	flag.BoolVar(&enableWebhook, "enable-fencing-webhook", true, "Serve the fencing admission webhook (in --fencing-mode=cel it answers only for the scale subresource).")
	flag.StringVar(&fencingMode, "fencing-mode", envOr("FENCING_MODE", manager.FencingModeWebhook),
		"How fenced writes are checked: \"webhook\" (the fencing admission webhook) or \"cel\" (admission policies inside the apiserver, which the manager applies and binds per lock, plus the webhook for the scale subresource; default $FENCING_MODE or webhook).")
	flag.StringVar(&guarded, "guarded-resources", "configmaps",
		"Comma-separated kinds the CEL-mode policies guard, RESOURCE[.GROUP], every version of each (--fencing-mode=cel; in webhook mode the webhook configuration lists them).")
	flag.StringVar(&excludedNamespaces, "excluded-namespaces", "kube-system",
		"Comma-separated namespaces the CEL-mode policies never check (--fencing-mode=cel; add the manager's own).")
	flag.IntVar(&webhookPort, "webhook-port", 9443, "Port the webhook server listens on.")
	flag.StringVar(&webhookCertDir, "webhook-cert-dir", "",
		"Directory with the webhook serving certificate (tls.crt, tls.key); default: controller-runtime's <tmp>/k8s-webhook-server/serving-certs.")
	flag.BoolVar(&certs.enabled, "cert-rotation", false,
		"Provision and rotate the webhook serving certificate in a Secret and keep the webhook configuration's caBundle current.")
	flag.StringVar(&certs.namespace, "cert-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the certificate Secret and webhook Service (default $POD_NAMESPACE).")
	flag.StringVar(&certs.secret, "cert-secret-name", "fencekeeper-webhook-cert", "Secret holding the webhook certificate.")
	flag.StringVar(&certs.service, "webhook-service-name", "fencekeeper-webhook-service", "Service in front of the webhook (the certificate's DNS name).")
	flag.StringVar(&certs.webhookConfig, "webhook-config-name", "fencekeeper-fencing", "MutatingWebhookConfiguration (the fencing webhook) whose caBundle is kept current.")
	flag.DurationVar(&syncPeriod, "sync-period", 10*time.Hour, "How often the informer caches resync (every object is reconciled again).")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "Address for net/http/pprof (empty: off).")
	flag.IntVar(&maxWaiters, "max-waiters-per-lock", 1000,
		"Waiting claims one lock accepts; a new claim beyond it is turned away (phase Expired, reason QueueFull). 0: no limit. Pods' claims are never turned away.")
	flag.DurationVar(&expiredRetention, "expired-claim-retention", 24*time.Hour,
		"How long an Expired claim is kept after it ended before it is deleted (0: keep Expired claims until someone deletes them). Claims a Pod owns go with the pod.")
	flag.Float64Var(&memoryLimitRatio, "memory-limit-ratio", 0.8,
		"Share of the container's memory limit (its cgroup's) used as the Go runtime's soft memory limit when GOMEMLIMIT is not set, so the garbage collector works before the container limit and not all the time. 0: leave the runtime's default.")
	flag.IntVar(&gcTarget, "gc-percent", 50,
		"The Go garbage collector's target percentage when GOGC is not set: the heap may grow this much above what is live before a collection. 0: leave the runtime's default (100).")
	opts := zap.Options{Development: false}
	opts.BindFlags(flag.CommandLine)
	// --kubeconfig is registered by controller-runtime's config package.
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	// Flags are checked before anything connects, so a typo fails at once.
	if expiredRetention < 0 {
		log.Error(nil, "--expired-claim-retention must be 0 (keep Expired claims) or positive", "got", expiredRetention.String())
		os.Exit(1)
	}
	if memoryLimitRatio < 0 || memoryLimitRatio > 1 {
		log.Error(nil, "--memory-limit-ratio must be between 0 (off) and 1", "got", memoryLimitRatio)
		os.Exit(1)
	}
	if limit := applySoftMemoryLimit(memoryLimitRatio); limit > 0 {
		log.Info("soft memory limit set from the container's memory limit", "GOMEMLIMIT", limit, "ratio", memoryLimitRatio)
	}
	if gcTarget < 0 {
		log.Error(nil, "--gc-percent must be 0 (the runtime's default) or positive", "got", gcTarget)
		os.Exit(1)
	}
	if p := applyGCPercent(gcTarget); p > 0 {
		log.Info("garbage collector target set", "GOGC", p)
	}
	if maxWaiters < 0 {
		log.Error(nil, "--max-waiters-per-lock must be 0 (no limit) or positive", "got", maxWaiters)
		os.Exit(1)
	}
	if leaderElect {
		if err := manager.ValidateLeaderElection(leaseDuration, renewDeadline, retryPeriod); err != nil {
			log.Error(err, "invalid leader-election timing")
			os.Exit(1)
		}
	}
	if maxWaiters == 0 {
		maxWaiters = -1 // Setup's "no limit"
	}
	wiring := manager.Options{Concurrency: concurrency, Webhook: enableWebhook, ExpiredClaimRetention: expiredRetention, MaxWaitersPerLock: maxWaiters,
		FencingMode: fencingMode, SingleAuthority: leaderElect || singleAuthority, Relists: lock.NewRelists()}
	switch fencingMode {
	case manager.FencingModeWebhook:
	case manager.FencingModeCEL:
		var err error
		if wiring.Guarded, err = fencewebhook.ParseGuardedResources(splitList(guarded)); err != nil {
			log.Error(err, "invalid --guarded-resources")
			os.Exit(1)
		}
		wiring.ExcludedNamespaces = splitList(excludedNamespaces)
		// The fencing rules run inside the apiserver; the webhook server
		// still answers for the scale subresource (the chart registers only
		// that webhook in this mode).
	default:
		log.Error(nil, "invalid --fencing-mode (or $FENCING_MODE): use webhook or cel", "got", fencingMode)
		os.Exit(1)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: no Kubernetes connection: %v\n(set --kubeconfig or KUBECONFIG, or run in a cluster)\n", err)
		os.Exit(1)
	}
	if webhookCertDir == "" {
		webhookCertDir = filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")
	}
	certs.certDir = webhookCertDir
	cacheOpts := manager.CacheOptions(wiring.Relists)
	cacheOpts.SyncPeriod = &syncPeriod
	if certs.enabled {
		// The rotator reads its Secret through the cache: watch only that one.
		cacheOpts.ByObject[&corev1.Secret{}] = cache.ByObject{
			Namespaces: map[string]cache.Config{certs.namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", certs.secret),
		}
	}
	mopts := ctrl.Options{
		Scheme:                 manager.Scheme(),
		Cache:                  cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		PprofBindAddress:       pprofAddr,
		WebhookServer:          webhook.NewServer(webhook.Options{Port: webhookPort, CertDir: webhookCertDir}),
	}
	if leaderElect {
		leadership, err := leaderElection(cfg, leaderElectNamespace, renewDeadline)
		if err != nil {
			log.Error(err, "unable to set up leader election")
			os.Exit(1)
		}
		wiring.Leadership = leadership
		mopts.LeaderElection, mopts.LeaderElectionResourceLockInterface = true, leadership
		// The lock above is the one used; the ID still names the elector
		// (its metrics).
		mopts.LeaderElectionID, mopts.LeaderElectionNamespace = manager.LeaderElectionID, leaderElectNamespace
		mopts.LeaseDuration, mopts.RenewDeadline, mopts.RetryPeriod = &leaseDuration, &renewDeadline, &retryPeriod
		// Losing leadership ends the process; a new term starts clean.
		mopts.LeaderElectionReleaseOnCancel = true
	}
	mgr, err := ctrl.NewManager(cfg, mopts)
	if err != nil {
		log.Error(err, "unable to create manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if enableWebhook {
		ready, err := setupCertRotation(mgr, certs)
		if err != nil {
			log.Error(err, "unable to set up webhook certificate rotation")
			os.Exit(1)
		}
		// The webhook server starts only once its certificate exists.
		wiring.WebhookReady = ready
		server := mgr.GetWebhookServer
		if err := mgr.AddReadyzCheck("webhook", readyAfter(ready, func(r *http.Request) error {
			return server().StartedChecker()(r)
		})); err != nil {
			log.Error(err, "unable to add webhook ready check")
			os.Exit(1)
		}
	}
	if err := manager.Setup(ctx, mgr, wiring); err != nil {
		log.Error(err, "unable to set up the controllers")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "unable to add health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "unable to add ready check")
		os.Exit(1)
	}
	log.Info("starting manager", "leaderElection", leaderElect)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped with an error")
		os.Exit(1)
	}
}

// leaderElection returns the leader-election lock (its Lease in namespace,
// by default the pod's), with an Event recorder for its transitions.
func leaderElection(cfg *rest.Config, namespace string, renewDeadline time.Duration) (*manager.LeadershipLock, error) {
	if namespace == "" {
		ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			return nil, fmt.Errorf("--leader-election-namespace is required out of cluster: %w", err)
		}
		namespace = strings.TrimSpace(string(ns))
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(manager.Scheme(), corev1.EventSource{Component: manager.LeaderElectionID})
	return manager.NewLeaderElectionLock(cfg, namespace, manager.LeaderElectionID, renewDeadline, recorder)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

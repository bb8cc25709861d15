// Package manager wires fencekeeper's manager: the lock authority
// (controllers/lock), the pod bridge (controllers/podlease), the clean-up of
// expired claims (controllers/claimcleanup), the CEL-mode controllers
// (controllers/celmode) and the fencing admission webhook (webhook), with
// the scheme, the cache options and the leader-election lock they run
// under. cmd/manager and the test helpers both call Setup, so the tests run
// the wiring users run.
package manager

import (
	"context"
	"fmt"
	"math"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	crmanager "sigs.k8s.io/controller-runtime/pkg/manager"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	celctrl "github.com/fencekeeper/fencekeeper/controllers/celmode"
	"github.com/fencekeeper/fencekeeper/controllers/claimcleanup"
	"github.com/fencekeeper/fencekeeper/controllers/lock"
	"github.com/fencekeeper/fencekeeper/controllers/podlease"
	"github.com/fencekeeper/fencekeeper/webhook"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// DefaultConcurrency is the manager's default --lock-concurrency.
const DefaultConcurrency = 4

// Fencing modes (docs/design.md §3).
const (
	FencingModeWebhook = "webhook"
	FencingModeCEL     = "cel"
)

// EventSource is the reporting controller name on fencekeeper's Events.
const EventSource = "fencekeeper"

// Options configure what Setup wires.
type Options struct {
	// Concurrency is how many locks (and pods) are reconciled in parallel
	// (the manager's --lock-concurrency, DefaultConcurrency unless set).
	Concurrency int
	// Clock for lease expiry (default: the real monotonic clock).
	Clock clock.PassiveClock
	// ForeignLeaseRecheck: how often a lock blocked by a Lease fencekeeper
	// does not manage is looked at again (0: the default).
	ForeignLeaseRecheck time.Duration
	// ExpiredClaimRetention: how long an Expired claim is kept after it
	// ended before it is deleted (0: kept until someone deletes it).
	ExpiredClaimRetention time.Duration
	// MaxWaitersPerLock: new claims beyond it are turned away (QueueFull);
	// 0 means lock.DefaultMaxWaiters, negative means no limit.
	MaxWaitersPerLock int
	// Webhook serves the fencing admission webhook on the manager's webhook
	// server. With WebhookReady set, it is registered once that channel
	// closes (the serving certificate exists).
	Webhook      bool
	WebhookReady <-chan struct{}
	// FencingMode is FencingModeWebhook (default) or FencingModeCEL: the
	// fencing rules as admission policies inside the apiserver, whose
	// policies the manager applies for Guarded (outside ExcludedNamespaces)
	// and whose per-lock bindings it keeps.
	FencingMode        string
	Guarded            []webhook.GuardedResource
	ExcludedNamespaces []string
	// SingleAuthority says this process's lock authority is the only one
	// that can grant: leader election is on (only the leader reconciles
	// locks), or one manager runs alone. Only then does its webhook answer
	// rule 4 from its cache when the authority vouches for it; otherwise it
	// reads every lock's Lease live, because another authority may have
	// granted (or broken, or released) what this cache has not seen yet,
	// for as long as this replica's watch lags (a stalled watch or a
	// partition: up to a TTL, or for pod holders as long as it lasts).
	SingleAuthority bool
	// Leadership, with leader election, tells whether this process's term
	// is certainly still its own (LeadershipLock.Current): the authority
	// vouches for nothing outside it (a leader paused past its lease).
	Leadership lock.Leadership
	// Relists, when set, is the one given to CacheOptions: every list of
	// the Lease informer then starts a new term of the lock authority (no
	// grant until its epoch floor is read).
	Relists *lock.Relists
	// OnAuthority, when set, is given the lock authority (tests read its
	// state: several managers in one process share the metrics registry).
	OnAuthority func(*lock.Reconciler)
	// ForTests lets several managers run in one process (no controller name
	// validation) and lets reconciler panics fail the test.
	ForTests bool
}

// Scheme knows the built-in kinds and fencekeeper's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(fkv1.AddToScheme(s))
	return s
}

// CacheOptions restricts the Lease informer to Leases fencekeeper manages, so
// node heartbeat and leader-election Leases never enter the cache. Pods are
// cached stripped to what the pod-lease decisions need: a few hundred bytes
// per pod. With relists (the same as Options.Relists), every list of the
// Lease informer starts a new term of the lock authority.
func CacheOptions(relists *lock.Relists) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{fkv1.LabelManagedBy: fkv1.ManagedByValue})
	var newInformer func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer
	if relists != nil {
		newInformer = relists.NewInformer
	}
	return cache.Options{NewInformer: newInformer, ByObject: map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Label: labels.SelectorFromSet(labels.Set{fkv1.LabelManagedBy: fkv1.ManagedByValue})},
		&corev1.Pod{}:           {Transform: podlease.StripPod},
		&corev1.Node{}:          {Transform: podlease.StripNode},
		// CEL mode's policies and bindings: only the ones fencekeeper owns.
		&admissionregistrationv1.ValidatingAdmissionPolicy{}:        {Label: managed},
		&admissionregistrationv1.MutatingAdmissionPolicy{}:          {Label: managed},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}: {Label: managed},
		&admissionregistrationv1.MutatingAdmissionPolicyBinding{}:   {Label: managed},
	}}
}

// Setup registers the lock authority, the pod bridge and (optionally) the
// fencing webhook with mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, o Options) error {
	copts := controller.Options{MaxConcurrentReconciles: max(o.Concurrency, 1)}
	if o.ForTests {
		copts.SkipNameValidation, copts.RecoverPanic = ptr.To(true), ptr.To(false)
	}
	recorder := mgr.GetEventRecorder(EventSource)
	authority := lock.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), recorder,
		lock.Options{Clock: o.Clock, ForeignLeaseRecheck: o.ForeignLeaseRecheck, MaxWaiters: o.MaxWaitersPerLock, Leadership: o.Leadership, Relists: o.Relists})
	if err := authority.SetupWithManager(ctx, mgr, copts); err != nil {
		return err
	}
	if o.OnAuthority != nil {
		o.OnAuthority(authority)
	}
	if err := podlease.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), recorder, o.Leadership).SetupWithManager(ctx, mgr, copts); err != nil {
		return err
	}
	if o.ExpiredClaimRetention > 0 {
		if err := claimcleanup.NewReconciler(mgr.GetClient(), o.ExpiredClaimRetention, nil).SetupWithManager(mgr, copts); err != nil {
			return err
		}
	}
	switch o.FencingMode {
	case "", FencingModeWebhook:
		// A switch from CEL mode leaves its policies behind: remove them
		// (an apiserver without MutatingAdmissionPolicy never ran CEL mode).
		if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: admissionregistrationv1.GroupName, Kind: "MutatingAdmissionPolicy"}, "v1"); err == nil {
			if err := celctrl.NewCleanupReconciler(mgr.GetClient()).SetupWithManager(mgr, copts); err != nil {
				return err
			}
		}
	case FencingModeCEL:
		// The webhook still serves the scale subresource (a Scale carries
		// no labels for a policy binding to select).
		if err := setupCELMode(mgr, o, copts); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown fencing mode %q: use %q or %q", o.FencingMode, FencingModeWebhook, FencingModeCEL)
	}
	var vouch webhook.Authority
	if o.SingleAuthority {
		if err := vouchWhileActing(mgr, authority); err != nil {
			return err
		}
		// The authority vouches only during its term, and with leader
		// election only while its leadership is certain.
		vouch = authority
	}
	if !o.Webhook {
		return nil
	}
	if o.WebhookReady == nil {
		webhook.SetupWithManager(mgr, vouch)
		return nil
	}
	go func() {
		select {
		case <-o.WebhookReady:
			webhook.SetupWithManager(mgr, vouch)
		case <-ctx.Done():
		}
	}()
	return nil
}

// vouchWhileActing adds the runnable that marks this process's term as the
// only authority: with leader election it runs only while this replica
// leads (a replica that stops leading stops vouching at once, while the
// next leader grants). A new term's cache may trail the previous leader's
// writes, so nothing is decided on it, or vouched for, until it has caught
// up with the Leases as they are now (CatchUp).
func vouchWhileActing(mgr ctrl.Manager, authority *lock.Reconciler) error {
	return mgr.Add(crmanager.RunnableFunc(func(ctx context.Context) error {
		defer authority.EndTerm()
		if err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 5 * time.Second, Steps: math.MaxInt32},
			func(ctx context.Context) (bool, error) {
				if err := authority.CatchUp(ctx); err != nil {
					ctrl.LoggerFrom(ctx).Error(err, "catching up with the managed Leases; retrying")
					return false, nil
				}
				return true, nil
			}); err != nil {
			return nil // stopped before it caught up: it never vouched
		}
		<-ctx.Done()
		return nil
	}))
}

// setupCELMode runs the reconcilers that keep the CEL-mode admission
// policies applied (put back when deleted or edited) and the per-lock
// bindings.
func setupCELMode(mgr ctrl.Manager, o Options, copts controller.Options) error {
	policies, err := celmode.Render(celmode.Options{Guarded: o.Guarded, ExcludedNamespaces: o.ExcludedNamespaces})
	if err != nil {
		return err
	}
	if err := celctrl.NewPoliciesReconciler(mgr.GetClient(), policies).SetupWithManager(mgr, copts); err != nil {
		return err
	}
	return celctrl.NewBindingReconciler(mgr.GetClient()).SetupWithManager(mgr, copts)
}

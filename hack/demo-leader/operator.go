package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/hack/internal/demokit"
	"github.com/fencekeeper/fencekeeper/pkg/election"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// The sample operator: a range allocator in the cilium pattern. Each "node"
// (a ConfigMap labelled demo.fencekeeper.io/node) gets a /24 from 10.0.0.0/16,
// recorded in a fenced ConfigMap cidr-<node>. The allocator keeps the used
// ranges in memory, loaded when its term starts: exactly the in-memory view
// a paused leader wakes up with. docs/leader-election.md shows the lines
// that make its leader election fenced.
const (
	lockName  = "range-allocator"
	nodeLabel = "demo.fencekeeper.io/node"
	cidrOf    = "demo.fencekeeper.io/cidr-of"
)

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
}

func runOperator(args []string) error {
	fs := flag.NewFlagSet("operator", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	namespace := fs.String("namespace", "", "namespace of the lock, the nodes and the allocations")
	identity := fs.String("identity", "", "this replica's holder identity")
	ttl := fs.Duration("ttl", 3*time.Second, "lease TTL")
	think := fs.Duration("think", 0, "time an allocation takes between choosing a range and recording it")
	_ = fs.Parse(args)
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	who := *identity

	lock, err := election.New(cfg, election.Config{Namespace: *namespace, Name: lockName, Identity: who, TTL: *ttl,
		OnTransition: func(t lease.Transition) {
			if t.To == lease.Suspect || t.To == lease.Lost {
				demokit.Emit(who, "state "+string(t.To), 0, t.Reason)
			}
		}})
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, lock.ManagerOptions(ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{*namespace: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	}))
	if err != nil {
		return err
	}

	// The Lock leaves the queue cleanly when the manager stops.
	if err := mgr.Add(lock); err != nil {
		return err
	}
	a := &allocator{Client: mgr.GetClient(), live: mgr.GetAPIReader(), lock: lock, who: who, think: *think}
	if err := ctrl.NewControllerManagedBy(mgr).Named("allocator").
		For(&corev1.ConfigMap{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			_, isNode := o.GetLabels()[nodeLabel]
			return isNode
		}))).Complete(a); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		epoch, err := lock.Epoch()
		if err != nil {
			return err
		}
		demokit.Emit(who, "leading", epoch, "term granted by the authority")
		return nil
	})); err != nil {
		return err
	}
	demokit.Emit(who, "candidate", 0, "queued for lock "+*namespace+"/"+lockName)
	err = mgr.Start(ctrl.SetupSignalHandler())
	// A lost election stops the manager at once, without waiting for the
	// reconcile in flight. Let the allocation in flight report its outcome
	// (its write is refused: the term ended) before the process exits; on a
	// busy machine the resumed reconcile can be slower than the elector's
	// RenewDeadline.
	finished := make(chan struct{})
	go func() { a.mu.Lock(); a.mu.Unlock(); close(finished) }() //nolint:staticcheck // waiting for the holder, not guarding anything
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
	}
	return err
}

// allocator reconciles nodes into ranges.
type allocator struct {
	client.Client
	live  client.Reader // the apiserver itself, not the cache
	lock  *election.Lock
	who   string
	think time.Duration

	mu   sync.Mutex
	used map[int]string // range index -> node; nil until loaded this term
}

func cidrName(node string) string { return "cidr-" + node }

func cidrText(i int) string { return fmt.Sprintf("10.0.%d.0/24", i) }

func (a *allocator) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var epoch int64 // the term this replica acts under, even once it ended
	if t := a.lock.Term(); t != nil {
		epoch = t.Epoch
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.load(ctx, req.Namespace); err != nil {
		return ctrl.Result{}, err
	}
	var node, alloc corev1.ConfigMap
	nodeErr := a.Get(ctx, req.NamespacedName, &node)
	allocErr := a.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: cidrName(req.Name)}, &alloc)
	switch {
	case apierrors.IsNotFound(nodeErr) && allocErr == nil:
		// The node is gone: free its range (the gate marks, then deletes).
		if err := a.Delete(ctx, &alloc); err != nil {
			return ctrl.Result{}, a.refused(req.Name, epoch, err)
		}
		a.free(req.Name)
		demokit.Emit(a.who, "freed", epoch, alloc.Data["cidr"]+" of "+req.Name)
		return ctrl.Result{}, nil
	case apierrors.IsNotFound(nodeErr) || allocErr == nil:
		return ctrl.Result{}, client.IgnoreNotFound(nodeErr)
	case nodeErr != nil:
		return ctrl.Result{}, nodeErr
	case !apierrors.IsNotFound(allocErr):
		return ctrl.Result{}, allocErr
	}
	i := a.lowestFree()
	a.used[i] = req.Name
	demokit.Emit(a.who, "chose", epoch, cidrText(i)+" for "+req.Name)
	time.Sleep(a.think) // the work between deciding and recording: a pause here is the dangerous one
	alloc = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: cidrName(req.Name),
		Labels: map[string]string{fkv1.LabelLock: lockName, cidrOf: req.Name}},
		Data: map[string]string{"node": req.Name, "cidr": cidrText(i)}}
	if err := a.Create(ctx, &alloc); err != nil {
		delete(a.used, i)
		return ctrl.Result{}, a.refused(req.Name, epoch, err)
	}
	demokit.Emit(a.who, "allocated", epoch, cidrText(i)+" to "+req.Name)
	return ctrl.Result{}, nil
}

// load reads the used ranges once per term, live: the cache may not show
// the last allocations of the previous leader yet, and the uniqueness of a
// range spans several objects (fencing orders the writes of each object).
func (a *allocator) load(ctx context.Context, ns string) error {
	if a.used != nil {
		return nil
	}
	var list corev1.ConfigMapList
	if err := a.live.List(ctx, &list, client.InNamespace(ns), client.HasLabels{cidrOf}); err != nil {
		return err
	}
	a.used = map[int]string{}
	for _, cm := range list.Items {
		if i, ok := rangeIndex(cm.Data["cidr"]); ok {
			a.used[i] = cm.Data["node"]
		}
	}
	return nil
}

func rangeIndex(cidr string) (int, bool) {
	parts := strings.Split(strings.TrimSuffix(cidr, ".0/24"), ".")
	if len(parts) != 3 {
		return 0, false
	}
	i, err := strconv.Atoi(parts[2])
	return i, err == nil
}

func (a *allocator) lowestFree() int {
	i := 1
	for a.used[i] != "" {
		i++
	}
	return i
}

func (a *allocator) free(node string) {
	for i, n := range a.used {
		if n == node {
			delete(a.used, i)
		}
	}
}

// refused reports a write the gate or the object turned away.
func (a *allocator) refused(node string, epoch int64, err error) error {
	switch {
	case errors.Is(err, election.ErrNotLeading):
		demokit.Emit(a.who, "refused by gate", epoch, node+": "+err.Error())
	case lease.IsStaleEpoch(err):
		demokit.Emit(a.who, "refused by object", epoch, node+": "+err.Error())
	default:
		demokit.Emit(a.who, "write failed", epoch, node+": "+err.Error())
	}
	return err
}

func operatorMain() {
	who := "operator"
	for i, a := range os.Args {
		if a == "--identity" && i+1 < len(os.Args) {
			who = os.Args[i+1]
		}
	}
	if err := runOperator(os.Args[2:]); err != nil {
		demokit.Emit(who, "exited", 0, err.Error())
		os.Exit(1)
	}
	demokit.Emit(who, "exited", 0, "clean shutdown")
}

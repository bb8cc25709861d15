package celmode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	celctrl "github.com/fencekeeper/fencekeeper/controllers/celmode"
	"github.com/fencekeeper/fencekeeper/internal/manager"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

// forged is an epoch nobody was issued: accepted, it would freeze the
// object for every holder.
const forged = "9223372036854775807"

// skewedClock is the manager's clock running ahead of the apiserver's.
type skewedClock struct{ ahead time.Duration }

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.ahead) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

type bed struct {
	env     *envtestutil.AdmissionEnv
	admin   client.WithWatch
	manager client.Client
}

// startBed starts a control plane with the lease guard and a manager
// running only the CEL-mode policies and bindings, whose clock is ahead by
// skew; both are stopped when the spec ends.
func startBed(skew time.Duration) *bed {
	GinkgoHelper()
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	ctx := context.Background()
	env, err := envtestutil.StartCELEnv(ctx, []string{"configmaps"})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = env.Env.Stop() })
	b := &bed{env: env}
	b.admin, err = client.NewWithWatch(env.Admin, client.Options{Scheme: envtestutil.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	b.manager, err = client.New(env.Manager, client.Options{Scheme: envtestutil.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	mcfg := rest.CopyConfig(env.Manager)
	mcfg.QPS, mcfg.Burst = 1000, 2000
	mgr, err := ctrl.NewManager(mcfg, ctrl.Options{Scheme: envtestutil.Scheme(), Cache: manager.CacheOptions(nil),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	Expect(err).NotTo(HaveOccurred())
	Expect(mgr.GetFieldIndexer().IndexField(ctx, &fkv1.FencedLease{}, fkv1.IndexLockName, func(o client.Object) []string {
		return []string{o.(*fkv1.FencedLease).Spec.LockName}
	})).To(Succeed())
	guarded, err := webhook.ParseGuardedResources([]string{"configmaps"})
	Expect(err).NotTo(HaveOccurred())
	policies, err := celmode.Render(celmode.Options{Guarded: guarded, ExcludedNamespaces: []string{"kube-system", envtestutil.ManagerNamespace}})
	Expect(err).NotTo(HaveOccurred())
	copts := controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: ptr.To(true)}
	Expect(celctrl.NewPoliciesReconciler(mgr.GetClient(), policies).SetupWithManager(mgr, copts)).To(Succeed())
	Expect(celctrl.NewBindingReconciler(mgr.GetClient(), celctrl.WithClock(skewedClock{ahead: skew})).SetupWithManager(mgr, copts)).To(Succeed())
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	DeferCleanup(func() { cancel(); <-done })
	// The policies are in force: an empty lock label is refused.
	ns := b.namespace()
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		last = b.admin.Create(ctx, configMap(ns, "policy-probe", "", nil), client.DryRunAll)
		return reasonOf(last) == fkv1.AdmissionEmptyLockLabel, nil
	}); err != nil {
		Fail(fmt.Sprintf("the CEL-mode policies are not enforced: %v", last))
	}
	return b
}

func (b *bed) namespace() string {
	GinkgoHelper()
	ns, err := envtestutil.NewNamespace(context.Background(), b.admin, "celbinding")
	Expect(err).NotTo(HaveOccurred())
	return ns
}

// grant creates lock's managed Lease in ns, as the manager does on a first
// grant (last epoch issued 3, held by nobody).
func (b *bed) grant(ns, lock string) *coordinationv1.Lease {
	GinkgoHelper()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock,
		Labels:      map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock},
		Annotations: map[string]string{fkv1.AnnotationEpoch: "3"}}}
	Expect(b.manager.Create(context.Background(), l)).To(Succeed())
	return l
}

// fire writes to objects of lock in ns through c, presenting the forged
// epoch, as fast as it can. Strict: it updates ConfigMap "target" (which
// must exist) and creates others, and every write must be refused,
// whatever state the bindings are in. Otherwise (c is an apiserver that
// validates nothing) it only creates, and a write is wrong only if the
// object it stores takes the forged epoch as its watermark. Either way
// every version of every object in ns is watched, and none may carry the
// forged watermark.
type fire struct {
	stop, done chan struct{}
	halting    sync.Once
	strict     bool
	mu         sync.Mutex
	accepted   []string
	last       fkv1.AdmissionReason
	writes     int
}

func (b *bed) fire(ctx context.Context, c client.Client, ns, lock, prefix string, strict bool) *fire {
	GinkgoHelper()
	f := &fire{stop: make(chan struct{}), done: make(chan struct{}), strict: strict}
	w, err := b.admin.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && cm.Annotations[fkv1.AnnotationFencedEpoch] == forged {
				f.record(fmt.Sprintf("watch: %s %s/%s resourceVersion %s carries fenced-epoch %s", ev.Type, cm.Namespace, cm.Name, cm.ResourceVersion, forged))
			}
		}
	}()
	go func() {
		defer close(f.done)
		defer func() { w.Stop(); <-watched }()
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				return
			default:
			}
			if strict {
				var cur corev1.ConfigMap
				if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "target"}, &cur); err != nil {
					f.record("reading target: " + err.Error())
					return
				}
				if cur.Annotations == nil {
					cur.Annotations = map[string]string{}
				}
				cur.Annotations[fkv1.AnnotationEpoch] = forged
				cur.Data = map[string]string{"n": fmt.Sprint(i)}
				f.judge("update", c.Update(ctx, &cur), &cur)
			}
			cm := configMap(ns, fmt.Sprintf("%s-%d", prefix, i), lock, map[string]string{fkv1.AnnotationEpoch: forged})
			f.judge("create", c.Create(ctx, cm), cm)
		}
	}()
	return f
}

func (f *fire) judge(what string, err error, cm *corev1.ConfigMap) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes++
	if err == nil && (f.strict || cm.Annotations[fkv1.AnnotationFencedEpoch] == forged) {
		f.accepted = append(f.accepted, fmt.Sprintf("%s of %s presenting epoch %s accepted: stored fenced-epoch %q", what, cm.Name, forged, cm.Annotations[fkv1.AnnotationFencedEpoch]))
		return
	}
	if err != nil {
		f.last = reasonOf(err)
	}
}

func (f *fire) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.accepted = append(f.accepted, s)
}

// halt stops the writes, if cease has not, and waits until they have
// stopped: deferred by whoever starts a fire, so that a spec that fails
// before its cease leaves no writes running.
func (f *fire) halt() {
	f.halting.Do(func() { close(f.stop) })
	<-f.done
}

// cease stops the writes and checks that none was accepted, and that the
// last was refused for the right reason (want; "" for any).
func (f *fire) cease(want fkv1.AdmissionReason) {
	GinkgoHelper()
	f.halt()
	f.mu.Lock()
	defer f.mu.Unlock()
	GinkgoWriter.Printf("%d writes presented epoch %s; accepted: %d; the last was refused with %q\n", f.writes, forged, len(f.accepted), f.last)
	// The first five, then how many more.
	accepted := f.accepted
	if len(accepted) > 5 {
		accepted = append(accepted[:5:5], fmt.Sprintf("... %d more", len(f.accepted)-5))
	}
	Expect(accepted).To(BeEmpty(), "forged writes accepted")
	Expect(f.writes).To(BeNumerically(">=", 20), "only %d forged writes were sent", f.writes)
	if want != "" {
		Expect(f.last).To(Equal(want), "the last forged write was refused with %q, want %q", f.last, want)
	}
}

// watchCreated returns a channel that receives, the moment a watch shows
// the object of list's kind named name get an event of type typ (from now
// on), what check returns then.
func (b *bed) watchCreated(ctx context.Context, list client.ObjectList, name string, typ watch.EventType, check func() string) <-chan string {
	GinkgoHelper()
	// From the list's resourceVersion: a watch from "now" would start with
	// an ADDED event for an object that exists already.
	Expect(b.admin.List(ctx, list, client.MatchingFields{"metadata.name": name})).To(Succeed())
	rv := list.GetResourceVersion()
	w, err := b.admin.Watch(ctx, list, client.MatchingFields{"metadata.name": name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	Expect(err).NotTo(HaveOccurred())
	out := make(chan string, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type == typ {
				out <- check()
				return
			}
		}
	}()
	return out
}

// probe sends FencingInForce's write through the test's client: the
// reason it is refused with ("" if accepted).
func (b *bed) probe(ctx context.Context, ns, lock string, ann map[string]string) fkv1.AdmissionReason {
	cm := configMap(ns, "", lock, ann)
	cm.GenerateName = "probe-"
	return reasonOf(b.admin.Create(ctx, cm, client.DryRunAll))
}

var _ = Describe("CEL mode's per-lock bindings, with the manager's clock 10 s ahead of the apiserver's", func() {
	// With the manager's clock 10 s ahead of the apiserver's, a new lock's
	// mutating binding is created only once the apiserver enforces its
	// fencing binding (a probe sent the moment the mutating binding appears
	// is refused by the fencing binding), and a forged epoch presented all
	// the while is never accepted: no version of any object carries it.
	// Several locks at once, each from its first Lease.
	It("creates the mutating binding only once the apiserver enforces the fencing binding", func() {
		b := startBed(10 * time.Second)
		ctx := context.Background()
		var wg sync.WaitGroup
		var bound atomic.Int32
		for i := range 3 {
			lock := fmt.Sprintf("skew-%d", i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				b.bindUnderFire(ctx, lock)
				bound.Add(1)
			}()
		}
		wg.Wait()
		if bound.Load() != 3 {
			return // a lock failed: the spec has failed
		}

		By("someone deletes the fencing binding: the manager creates it again, and the mutating binding, " +
			"proven against the one deleted, is deleted and created again only once the new one is in force")
		const lock = "skew-0"
		key := client.ObjectKey{Name: celmode.BindingName(lock)}
		var old admissionregistrationv1.ValidatingAdmissionPolicyBinding
		Expect(b.admin.Get(ctx, key, &old)).To(Succeed())
		var leases coordinationv1.LeaseList
		err := b.admin.List(ctx, &leases, client.MatchingLabels{fkv1.LabelLock: lock})
		Expect(err).NotTo(HaveOccurred(), "the Lease of %s", lock)
		Expect(leases.Items).To(HaveLen(1), "the Lease of %s", lock)
		ns := leases.Items[0].Namespace
		recreated := b.watchCreated(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBindingList{}, celmode.BindingName(lock), watch.Added, func() string {
			return string(b.probe(ctx, ns, lock, nil))
		})
		Expect(b.admin.Delete(ctx, &old)).To(Succeed())
		select {
		case got := <-recreated:
			Expect(got).To(Equal(string(fkv1.AdmissionMissingEpoch)),
				"the mutating binding was created again while the apiserver did not enforce the new fencing binding: a probe then got %q", got)
		case <-time.After(60 * time.Second):
			Fail("the mutating binding proven against the deleted fencing binding was never replaced")
		}
		var v admissionregistrationv1.ValidatingAdmissionPolicyBinding
		var m admissionregistrationv1.MutatingAdmissionPolicyBinding
		Expect(errors.Join(b.admin.Get(ctx, key, &v), b.admin.Get(ctx, key, &m))).To(Succeed())
		if v.UID == old.UID || m.Annotations[celmode.ProvenAnnotation] != string(v.UID) {
			Fail(fmt.Sprintf("after the fencing binding was re-created (uid %s -> %s), the mutating binding records %q", old.UID, v.UID, m.Annotations[celmode.ProvenAnnotation]))
		}

		By("a lock whose only Lease is in a namespace the policies exclude gets its validating bindings, " +
			"but no mutating one (there it would do nothing, and no probe can prove anything there) " +
			"until a Lease comes where the policies check: then it is proven and bound")
		const excluded = "excluded-only"
		b.grant(envtestutil.ManagerNamespace, excluded)
		ekey := client.ObjectKey{Name: celmode.BindingName(excluded)}
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return b.admin.Get(ctx, ekey, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}) == nil, nil
		}); err != nil {
			Fail(fmt.Sprintf("lock %s got no validating binding", excluded))
		}
		time.Sleep(2 * time.Second)
		err = b.admin.Get(ctx, ekey, &admissionregistrationv1.MutatingAdmissionPolicyBinding{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(),
			"lock %s with a Lease only where the policies do not check: mutating binding %v, want not found", excluded, err)
		ns2 := b.namespace()
		created := b.watchCreated(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBindingList{}, celmode.BindingName(excluded), watch.Added, func() string {
			return string(b.probe(ctx, ns2, excluded, nil))
		})
		b.grant(ns2, excluded)
		select {
		case got := <-created:
			Expect(got).To(Equal(string(fkv1.AdmissionMissingEpoch)),
				"lock %s: the mutating binding came while the fencing binding was not in force: a probe then got %q", excluded, got)
		case <-time.After(60 * time.Second):
			Fail(fmt.Sprintf("lock %s: no mutating binding after a Lease came where the policies check", excluded))
		}
	})

	// A second apiserver instance that does not enforce the fencing binding
	// (here: it runs no validating admission policy at all, the extreme of a
	// lagging watch) holds the mutating binding back, however long, while
	// the first instance enforces it, with the manager's clock 10 s ahead.
	// Writes presenting the forged epoch go to both instances all the while:
	// the first refuses every one; the second admits them (it validates
	// nothing), but no object ever takes the forged epoch as its watermark,
	// since no instance runs the mutating binding. Once the second instance
	// is gone, the mutating binding comes.
	It("waits for every apiserver instance to enforce the fencing binding before creating the mutating binding", func() {
		b := startBed(10 * time.Second)
		ctx := context.Background()
		second, err := envtestutil.StartSecondAPIServer(ctx, b.env.Admin,
			map[string]string{"disable-admission-plugins": "ServiceAccount,ValidatingAdmissionPolicy"}, nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = second.Stop(context.Background()) })
		viaSecond, err := client.New(second.Config, client.Options{Scheme: envtestutil.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		const lock = "lagging"
		ns := b.namespace()
		Expect(b.admin.Create(ctx, configMap(ns, "target", lock, nil))).To(Succeed())
		f1 := b.fire(ctx, b.admin, ns, lock, "first", true)
		defer f1.halt()
		f2 := b.fire(ctx, viaSecond, ns, lock, "second", false)
		defer f2.halt()
		created := b.watchCreated(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBindingList{}, celmode.BindingName(lock), watch.Added, func() string {
			return string(b.probe(ctx, ns, lock, nil))
		})
		b.grant(ns, lock)
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return b.probe(ctx, ns, lock, nil) == fkv1.AdmissionMissingEpoch, nil
		}); err != nil {
			Fail(fmt.Sprintf("the first apiserver never enforced the fencing binding of %s", lock))
		}
		time.Sleep(5 * time.Second)
		err = b.admin.Get(ctx, client.ObjectKey{Name: celmode.BindingName(lock)}, &admissionregistrationv1.MutatingAdmissionPolicyBinding{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(),
			"while an instance does not enforce the fencing binding, the mutating binding of %s: %v, want not found", lock, err)
		By("the second instance leaves (it is no longer listed, and stops)")
		f2.cease("")
		Expect(second.Stop(ctx)).To(Succeed())
		select {
		case got := <-created:
			Expect(got).To(Equal(string(fkv1.AdmissionMissingEpoch)),
				"the mutating binding was created while the apiserver did not enforce the fencing binding: a probe then got %q", got)
		case <-time.After(60 * time.Second):
			Fail(fmt.Sprintf("the mutating binding of %s was never created", lock))
		}
		time.Sleep(2 * time.Second)
		f1.cease(fkv1.AdmissionFutureEpoch)
	})

	// A lock no claim or managed Lease names any more loses its bindings;
	// where a Lease of that name remains (someone else's), the mutating
	// binding goes first and the validating one only once the apiserver no
	// longer runs the mutating one (a probe sent the moment the validating
	// binding is deleted shows the mutating one gone), and no forged write
	// is ever accepted there.
	It("deletes the validating binding only once the apiserver no longer runs the mutating one", func() {
		b := startBed(10 * time.Second)
		ctx := context.Background()
		var wg sync.WaitGroup
		for i := range 5 {
			lock := fmt.Sprintf("gone-%d", i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				b.unbindUnderFire(ctx, lock)
			}()
		}
		wg.Wait()
	})
})

// bindUnderFire grants lock in a new namespace while forged writes come,
// and checks the order of its bindings. It may run in a goroutine of its
// own (which defers GinkgoRecover).
func (b *bed) bindUnderFire(ctx context.Context, lock string) {
	ns := b.namespace()
	// Created before the lock has bindings (none checks it yet).
	Expect(b.admin.Create(ctx, configMap(ns, "target", lock, nil))).To(Succeed())
	f := b.fire(ctx, b.admin, ns, lock, "forged", true)
	defer f.halt()
	created := b.watchCreated(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBindingList{}, celmode.BindingName(lock), watch.Added, func() string {
		return string(b.probe(ctx, ns, lock, nil))
	})
	b.grant(ns, lock)
	select {
	case got := <-created:
		Expect(got).To(Equal(string(fkv1.AdmissionMissingEpoch)),
			"lock %s: the mutating binding was created while the apiserver did not enforce the fencing binding: a probe then got %q, want %q", lock, got, fkv1.AdmissionMissingEpoch)
	case <-time.After(60 * time.Second):
		Fail(fmt.Sprintf("lock %s: the mutating binding was never created", lock))
	}
	// Writes keep coming while the mutating binding loads.
	time.Sleep(2 * time.Second)
	f.cease(fkv1.AdmissionFutureEpoch)
	var v admissionregistrationv1.ValidatingAdmissionPolicyBinding
	var m admissionregistrationv1.MutatingAdmissionPolicyBinding
	key := client.ObjectKey{Name: celmode.BindingName(lock)}
	Expect(errors.Join(b.admin.Get(ctx, key, &v), b.admin.Get(ctx, key, &m))).To(Succeed())
	Expect(m.Annotations[celmode.ProvenAnnotation]).To(Equal(string(v.UID)),
		"lock %s: the mutating binding records proof for %q, want the validating binding's uid %s", lock, m.Annotations[celmode.ProvenAnnotation], v.UID)
	var target corev1.ConfigMap
	Expect(b.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "target"}, &target)).To(Succeed())
	Expect(target.Annotations[fkv1.AnnotationFencedEpoch]).NotTo(Equal(forged), "lock %s: target stores fenced-epoch %s", lock, forged)
}

// unbindUnderFire binds lock where someone else's Lease of that name
// remains, then ends the lock's managed Lease while forged writes come,
// and checks the order in which its bindings go. It may run in a goroutine
// of its own (which defers GinkgoRecover).
func (b *bed) unbindUnderFire(ctx context.Context, lock string) {
	granted, foreign := b.namespace(), b.namespace()
	Expect(b.admin.Create(ctx, configMap(foreign, "target", lock, nil))).To(Succeed())
	// Someone else's Lease of the same name: the per-lock bindings take it
	// as their parameter too.
	Expect(b.admin.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: foreign, Name: lock}})).To(Succeed())
	lease := b.grant(granted, lock)
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		err := b.admin.Get(ctx, client.ObjectKey{Name: celmode.BindingName(lock)}, &admissionregistrationv1.MutatingAdmissionPolicyBinding{})
		return err == nil, nil
	}); err != nil {
		Fail(fmt.Sprintf("lock %s was never bound", lock))
	}
	// Both bindings in force: the token is consumed, the forged epoch
	// refused (the Lease is not the manager's: no epoch was issued).
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return b.probe(ctx, foreign, lock, map[string]string{fkv1.AnnotationEpoch: forged}) == fkv1.AdmissionFutureEpoch &&
			b.probe(ctx, foreign, lock, map[string]string{fkv1.AnnotationFencedEpoch: "0"}) == fkv1.AdmissionMissingEpoch, nil
	}); err != nil {
		Fail(fmt.Sprintf("lock %s: the bindings are not in force", lock))
	}
	f := b.fire(ctx, b.admin, foreign, lock, "forged", true)
	defer f.halt()
	// The moment the fencing binding is deleted, the apiserver must no
	// longer run the mutating one: a malformed watermark must not be
	// removed (which the fencing binding, still loaded for a moment, would
	// then refuse as MissingEpoch instead of MalformedEpoch).
	gone := b.watchCreated(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBindingList{}, celmode.BindingName(lock), watch.Deleted, func() string {
		return string(b.probe(ctx, foreign, lock, map[string]string{fkv1.AnnotationFencedEpoch: "0"}))
	})
	// The manager deletes a Lease only with its namespace; the lease guard
	// lets its identity do it at any time.
	Expect(b.manager.Delete(ctx, lease)).To(Succeed())
	select {
	case got := <-gone:
		Expect(got).NotTo(Equal(string(fkv1.AdmissionMissingEpoch)),
			"lock %s: the fencing binding was deleted while the apiserver still ran the mutating binding (a probe then got %q)", lock, got)
	case <-time.After(60 * time.Second):
		Fail(fmt.Sprintf("lock %s: the fencing binding was never deleted", lock))
	}
	time.Sleep(2 * time.Second)
	f.cease("")
	for _, o := range celmode.Bindings(lock).Objects() {
		err := b.admin.Get(ctx, client.ObjectKeyFromObject(o), o)
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "lock %s: binding %T %s: %v, want not found", lock, o, o.GetName(), err)
	}
}

func configMap(ns, name, lock string, ann map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{fkv1.LabelLock: lock}, Annotations: ann},
		Data:       map[string]string{"report": "v"},
	}
}

// reasonOf is the fencing reason of a policy's denial; "" for nil, "?(…)"
// for any other error.
func reasonOf(err error) fkv1.AdmissionReason {
	if err == nil {
		return ""
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		if r := fkv1.PolicyDenialReason(se.Status().Message); r != "" {
			return r
		}
	}
	return fkv1.AdmissionReason(fmt.Sprintf("?(%v)", strings.TrimSpace(err.Error())))
}

package admission_test

import (
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var _ = Describe("Fencing admission", func() {
	var (
		ns  string
		mgr *envtestutil.Manager
	)
	BeforeEach(func() {
		ns = newNamespace()
		mgr = startManager()
		DeferCleanup(func() {
			if mgr != nil {
				Expect(mgr.Stop()).To(Succeed())
			}
		})
	})

	It("replays the report story: W1's late write after W2's takeover is denied and W2's report survives", func() {
		lock := "report-2026-07"
		history := watchConfigMaps(ns)
		DeferCleanup(history.stop)

		w1 := acquire(ns, "w1", lock, "W1", 2)
		e1 := w1.Status.Epoch
		By("W1 publishes a first version and fences two more reports with its epoch")
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 by W1", nil))).To(Succeed())
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "report-2026-06", lock, w1.Status.Epoch, "june by W1", nil))).To(Succeed())
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "report-2026-05", lock, w1.Status.Epoch, "may by W1",
			map[string]string{fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic}))).To(Succeed())

		By("W1 pauses (no renewals); its lease expires and W2 takes over with the next epoch")
		w2 := acquire(ns, "w2", lock, "W2", 300)
		Expect(w2.Status.Epoch).To(Equal(e1 + 1))
		waitPhase(w1, fkv1.PhaseExpired)
		Expect(publish(ns, lock, w2.Status.Epoch, "v12 by W2")).To(Succeed())

		By("W1 resumes and publishes its old result with its old epoch")
		err := publish(ns, lock, w1.Status.Epoch, "v11' by W1")
		Expect(err).To(HaveOccurred())
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a stale epoch is a 403, never a 409 Conflict (which clients retry): %v", err)
		Expect(err.Error()).To(ContainSubstring(fmt.Sprintf(
			"stale epoch %d for lock %s/%s: object already accepted epoch %d (current holder W2, epoch %d)", e1, ns, lock, e1+1, e1+1)))
		Expect(configMapData(ns, lock)).To(Equal("v12 by W2"))

		By("on a report W2 has not touched, policy current denies W1 and monotonic lets it through")
		err = publish(ns, "report-2026-06", w1.Status.Epoch, "june again by W1")
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("stale epoch %d for lock %s/%s: it is not the lock's current epoch (current holder W2, epoch %d)", e1, ns, lock, e1+1)))
		Expect(configMapData(ns, "report-2026-06")).To(Equal("june by W1"))
		Expect(publish(ns, "report-2026-05", w1.Status.Epoch, "may again by W1")).To(Succeed())

		By("the watched history of the report never shows W1's data after W2's")
		Eventually(history.count, 5*time.Second).Should(BeNumerically(">=", 2))
		seenW2 := false
		for _, cm := range history.versions(lock) {
			if strings.Contains(cm.Data["report.csv"], "W2") {
				seenW2 = true
			}
			if seenW2 {
				Expect(cm.Data["report.csv"]).NotTo(ContainSubstring("W1"), "W1's write landed after W2's")
			}
		}
		Expect(seenW2).To(BeTrue())
	})

	It("guards a custom resource the same way through update, JSON patch, merge patch and server-side apply", func() {
		lock := "report-crd"
		w1 := acquire(ns, "w1", lock, "W1", 300)
		release(w1)
		w2 := acquire(ns, "w2", lock, "W2", 300)
		Expect(w2.Status.Epoch).To(Equal(w1.Status.Epoch + 1))
		e1, e2 := epochString(w1.Status.Epoch), epochString(w2.Status.Epoch)

		report := newReport(ns, "report-2026-07", lock, w2.Status.Epoch, "v12 by W2")
		Expect(k8s.Create(ctx, report)).To(Succeed())
		key := client.ObjectKeyFromObject(report)

		stale := map[string]func(epoch string, body string) error{
			"update": func(epoch, body string) error {
				r := getReport(ns, report.GetName())
				r.SetAnnotations(map[string]string{fkv1.AnnotationEpoch: epoch})
				Expect(unstructured.SetNestedField(r.Object, body, "spec", "body")).To(Succeed())
				return k8s.Update(ctx, r)
			},
			"json patch": func(epoch, body string) error {
				p := fmt.Sprintf(`[{"op":"replace","path":"/metadata/annotations/fencekeeper.io~1epoch","value":%q},{"op":"replace","path":"/spec/body","value":%q}]`, epoch, body)
				return k8s.Patch(ctx, emptyReport(key), client.RawPatch(types.JSONPatchType, []byte(p)))
			},
			"merge patch": func(epoch, body string) error {
				p := fmt.Sprintf(`{"metadata":{"annotations":{"fencekeeper.io/epoch":%q}},"spec":{"body":%q}}`, epoch, body)
				return k8s.Patch(ctx, emptyReport(key), client.RawPatch(types.MergePatchType, []byte(p)))
			},
			"server-side apply": func(epoch, body string) error {
				r := newReport(ns, report.GetName(), lock, 0, body)
				r.SetAnnotations(map[string]string{fkv1.AnnotationEpoch: epoch})
				return k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(r), client.FieldOwner("worker"), client.ForceOwnership)
			},
		}
		for _, how := range []string{"update", "json patch", "merge patch", "server-side apply"} {
			err := stale[how](e1, "stale by W1 via "+how)
			Expect(err).To(HaveOccurred(), how)
			Expect(err.Error()).To(ContainSubstring("stale epoch "+e1+" for lock "+ns+"/"+lock+": object already accepted epoch "+e2), how)
			Expect(bodyOf(ns, report.GetName())).NotTo(ContainSubstring("W1"), how)

			Expect(stale[how](e2, "v13 by W2 via "+how)).To(Succeed(), how)
			Expect(bodyOf(ns, report.GetName())).To(Equal("v13 by W2 via "+how), how)
		}
		By("status is not content: a status update with no epoch passes")
		r := getReport(ns, report.GetName())
		Expect(unstructured.SetNestedField(r.Object, "Published", "status", "phase")).To(Succeed())
		Expect(k8s.Status().Update(ctx, r)).To(Succeed())
	})

	It("never shows epoch N accepted after N+1 when two writers race over many rounds", func() {
		lock := "race"
		const rounds = 12
		By(fmt.Sprintf("issuing %d epochs", 2*rounds))
		var last *fkv1.FencedLease
		var base int64
		for i := 1; i <= 2*rounds; i++ {
			if last != nil {
				release(last)
			}
			last = acquire(ns, fmt.Sprintf("c%02d", i), lock, fmt.Sprintf("W%d", i), 300)
			if i == 1 {
				base = last.Status.Epoch
				// Created under the first epoch while it is current (a create is always checked as current).
				// Old epochs from claims since released: this test is about
				// ordering, so the object accepts them from any identity.
				Expect(k8s.Create(ctx, fencedConfigMap(ns, "race", lock, base, fmt.Sprintf("epoch %d", base),
					map[string]string{fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic,
						fkv1.AnnotationFenceIdentity: fkv1.FenceIdentityAny}))).To(Succeed())
			}
		}
		Expect(last.Status.Epoch).To(Equal(base + 2*rounds - 1))
		history := watchConfigMaps(ns)
		DeferCleanup(history.stop)

		// The writers send merge patches with no resourceVersion: optimistic
		// concurrency does not order them, only the check inside the
		// apiserver's compare-and-swap loop does.
		denied := 0
		for r := 1; r <= rounds; r++ {
			var wg sync.WaitGroup
			results := make([][]error, 2)
			for i, e := range []int64{base + int64(2*r-2), base + int64(2*r-1)} {
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					for n := 0; n < 3; n++ {
						results[i] = append(results[i], patchBlind(ns, "race", e, fmt.Sprintf("epoch %d", e)))
					}
				}()
			}
			wg.Wait()
			for _, err := range results[1] {
				Expect(err).NotTo(HaveOccurred(), "round %d: the higher epoch must land", r)
			}
			for _, err := range results[0] {
				if err != nil {
					Expect(err.Error()).To(ContainSubstring("stale epoch"))
					denied++
				}
			}
		}
		Expect(denied).To(BeNumerically(">", 0), "no lower-epoch write arrived after a higher one: the race never tested the fence")
		By(fmt.Sprintf("%d of %d lower-epoch writes lost the race and were denied", denied, 3*rounds))
		Eventually(func() string {
			v := history.versions("race")
			if len(v) == 0 {
				return ""
			}
			return v[len(v)-1].Annotations[fkv1.AnnotationFencedEpoch]
		}, 5*time.Second).Should(Equal(epochString(base + 2*rounds - 1)))
		var prev int64
		for _, cm := range history.versions("race") {
			Expect(cm.Annotations).NotTo(HaveKey(fkv1.AnnotationEpoch), "a token was stored")
			e, err := fkv1.ParseEpoch(cm.Annotations[fkv1.AnnotationFencedEpoch])
			Expect(err).NotTo(HaveOccurred())
			Expect(e).To(BeNumerically(">=", prev), "epoch %d accepted after %d", e, prev)
			Expect(cm.Data["report.csv"]).To(Equal(fmt.Sprintf("epoch %d", e)), "data and epoch of one write")
			prev = e
		}
	})

	It("denies a forged epoch from the future, and a write with no or a malformed epoch", func() {
		lock := "forged"
		w := acquire(ns, "w", lock, "W", 300)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "r", lock, w.Status.Epoch, "v1", nil))).To(Succeed())
		err := publish(ns, "r", w.Status.Epoch+1, "forged")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("epoch %d for lock %s/%s was never issued: the last epoch issued is %d", w.Status.Epoch+1, ns, lock, w.Status.Epoch)))

		noEpoch := fencedConfigMap(ns, "r2", lock, 1, "v1", nil)
		delete(noEpoch.Annotations, fkv1.AnnotationEpoch)
		err = k8s.Create(ctx, noEpoch)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("missing epoch for lock " + ns + "/" + lock))

		var cm corev1.ConfigMap
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "r"}, &cm)).To(Succeed())
		cm.Annotations[fkv1.AnnotationEpoch] = "+1"
		cm.Data["report.csv"] = "v2"
		err = k8s.Update(ctx, &cm)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring(`malformed epoch for lock ` + ns + "/" + lock + `: epoch "+1" is not a decimal integer`))

		By("the fencing label cannot be removed")
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "r"}, &cm)).To(Succeed())
		delete(cm.Labels, fkv1.LabelLock)
		err = k8s.Update(ctx, &cm)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("label of a fenced object cannot be removed or changed"))
		Expect(configMapData(ns, "r")).To(Equal("v1"))
	})

	It("lets metadata-only maintenance (garbage collector, finalizers) through without an epoch check, and namespace deletion delete", func() {
		lock := "gc"
		w := acquire(ns, "w", lock, "W", 300)
		owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
		Expect(k8s.Create(ctx, owner)).To(Succeed())
		cm := fencedConfigMap(ns, "owned", lock, w.Status.Epoch, "v1", nil)
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: owner.UID}}
		cm.Finalizers = []string{"example.com/cleanup"}
		Expect(k8s.Create(ctx, cm)).To(Succeed())
		By("the lock moves on, so the object's watermark is stale")
		release(w)
		acquire(ns, "w2", lock, "W2", 300)

		By("the metadata writes the garbage collector and controllers make")
		Expect(k8s.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owned"}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`)))).To(Succeed())
		Expect(k8s.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owned"}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"finance"},"annotations":{"note":"x"}}}`)))).To(Succeed())
		Expect(k8s.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owned"}},
			client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)))).To(Succeed())
		Expect(configMapData(ns, "owned")).To(Equal("v1"))

		By("a plain delete is fenced")
		err := k8s.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owned"}})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(configMapData(ns, "owned")).To(Equal("v1"))

		By("deleting the namespace (replaying the namespace controller, which envtest lacks) deletes fenced objects")
		Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Expect(k8s.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(ns))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "owned"}, &corev1.ConfigMap{}))
		}, 5*time.Second).Should(BeTrue())
	})

	It("never sends unfenced objects to the webhook, and fails closed for fenced ones when it is down", func() {
		By("stopping the manager: the webhook server is down")
		Expect(mgr.Stop()).To(Succeed())
		mgr = nil
		unfenced := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}, Data: map[string]string{"a": "1"}}
		Expect(k8s.Create(ctx, unfenced)).To(Succeed())
		unfenced.Data["a"] = "2"
		Expect(k8s.Update(ctx, unfenced)).To(Succeed())
		err := k8s.Create(ctx, fencedConfigMap(ns, "fenced", "down", 1, "v1", nil))
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("failed calling webhook"))
	})
})

// patchBlind writes data with epoch as a merge patch with no
// resourceVersion precondition.
func patchBlind(ns, name string, epoch int64, data string) error {
	p := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}},"data":{"report.csv":%q}}`, fkv1.AnnotationEpoch, epochString(epoch), data)
	return k8s.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, []byte(p)))
}

func newReport(ns, name, lock string, epoch int64, body string) *unstructured.Unstructured {
	r := envtestutil.Report(ns, name)
	r.SetLabels(map[string]string{fkv1.LabelLock: lock})
	if epoch > 0 {
		r.SetAnnotations(map[string]string{fkv1.AnnotationEpoch: epochString(epoch)})
	}
	r.Object["spec"] = map[string]any{"body": body}
	return r
}

func emptyReport(key client.ObjectKey) *unstructured.Unstructured {
	return envtestutil.Report(key.Namespace, key.Name)
}

func getReport(ns, name string) *unstructured.Unstructured {
	r := emptyReport(client.ObjectKey{Namespace: ns, Name: name})
	ExpectWithOffset(1, k8s.Get(ctx, client.ObjectKeyFromObject(r), r)).To(Succeed())
	return r
}

func bodyOf(ns, name string) string {
	b, _, _ := unstructured.NestedString(getReport(ns, name).Object, "spec", "body")
	return b
}

// history records every version of one kind of object in a namespace,
// as a watch delivers them.
type history[T any] struct {
	mu   sync.Mutex
	all  []T
	stop func()
}

// watchAll starts recording the objects of list's kind in ns.
func watchAll[T any, PT interface {
	*T
	client.Object
}](ns string, list client.ObjectList) *history[T] {
	h := &history[T]{}
	w, err := k8s.Watch(ctx, list, client.InNamespace(ns))
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	h.stop = w.Stop
	go func() {
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(PT); ok {
				h.mu.Lock()
				h.all = append(h.all, *(o.DeepCopyObject().(PT)))
				h.mu.Unlock()
			}
		}
	}()
	return h
}

// snapshot is every version recorded so far, in the order seen.
func (h *history[T]) snapshot() []T {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]T(nil), h.all...)
}

// cmHistory records every version of the ConfigMaps in a namespace.
type cmHistory = history[corev1.ConfigMap]

func watchConfigMaps(ns string) *cmHistory {
	return watchAll[corev1.ConfigMap](ns, &corev1.ConfigMapList{})
}

// count is how many versions were recorded so far.
func (h *history[T]) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.all)
}

// versions are the recorded versions of the object named name.
func (h *history[T]) versions(name string) []T {
	var out []T
	for _, o := range h.snapshot() {
		if any(&o).(client.Object).GetName() == name {
			out = append(out, o)
		}
	}
	return out
}

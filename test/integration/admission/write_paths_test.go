package admission_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// Every way a write reaches the apiserver presents its own epoch: nothing is
// inherited from the stored object, a stale holder is refused on each path,
// and the current holder passes on each.
var _ = Describe("Fencing on every write path", func() {
	var (
		ns         string
		lock       = "report-2026-07"
		w1, w2     *fkv1.FencedLease
		kubeconfig string
	)
	BeforeEach(func() {
		ns = newNamespace()
		mgr := startManager()
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		w1 = acquire(ns, "w1", lock, "W1", 300)
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 by W1", nil))).To(Succeed())
		kubeconfig = writeKubeconfig()
	})

	// handOver releases W1 and grants W2, which writes once.
	handOver := func() {
		release(w1)
		w2 = acquire(ns, "w2", lock, "W2", 300)
		Expect(w2.Status.Epoch).To(Equal(w1.Status.Epoch + 1))
		Expect(publish(ns, lock, w2.Status.Epoch, "v12 by W2")).To(Succeed())
	}

	It("stores the watermark, never the token", func() {
		var cm corev1.ConfigMap
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &cm)).To(Succeed())
		Expect(cm.Annotations).NotTo(HaveKey(fkv1.AnnotationEpoch))
		Expect(cm.Annotations).To(HaveKeyWithValue(fkv1.AnnotationFencedEpoch, epochString(w1.Status.Epoch)))
	})

	It("refuses the paused W1's client.MergeFrom patch from the copy it read before its pause", func() {
		history := watchConfigMaps(ns)
		DeferCleanup(history.stop)
		By("W1 reads the report, then pauses")
		var orig corev1.ConfigMap
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &orig)).To(Succeed())
		stampedOrig := orig.DeepCopy()
		lease.Stamp(stampedOrig, lock, w1.Status.Epoch)

		handOver()

		By("W1 resumes: it stamps its epoch and patches from its copy")
		mine := orig.DeepCopy()
		lease.Stamp(mine, lock, w1.Status.Epoch)
		mine.Data = map[string]string{"report.csv": "v11' by W1"}
		err := k8s.Patch(ctx, mine, client.MergeFrom(&orig))
		Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("stale epoch %d", w1.Status.Epoch))

		By("W1 stamped before copying: the diff drops the token, and the write presents none")
		mine = stampedOrig.DeepCopy()
		mine.Data = map[string]string{"report.csv": "v11'' by W1"}
		err = k8s.Patch(ctx, mine, client.MergeFrom(stampedOrig))
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("missing epoch for lock " + ns + "/" + lock))

		Expect(configMapData(ns, lock)).To(Equal("v12 by W2"))
		expectNoW1AfterW2(history, lock)
	})

	It("refuses kubectl patch and kubectl edit that present no epoch, saying how to fix it", func() {
		out, err := kubectl(kubeconfig, "-n", ns, "patch", "configmap", lock, "--type", "merge", "-p", `{"data":{"report.csv":"edited"}}`)
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("missing epoch for lock " + ns + "/" + lock))
		Expect(out).To(ContainSubstring("re-stamp it on every patch"))

		editor := filepath.Join(GinkgoT().TempDir(), "editor.sh")
		Expect(os.WriteFile(editor, []byte("#!/bin/sh\nsed -i 's/v11 by W1/edited by hand/' \"$1\"\n"), 0o755)).To(Succeed())
		cmd := exec.Command(filepath.Join(envtestutil.BinDir(), "kubectl"), "--kubeconfig", kubeconfig, "-n", ns, "edit", "configmap", lock)
		cmd.Env = append(os.Environ(), "KUBE_EDITOR="+editor, "EDITOR="+editor)
		b, err := cmd.CombinedOutput()
		Expect(err).To(HaveOccurred(), string(b))
		Expect(string(b)).To(ContainSubstring("is invalid"))
		// kubectl edit keeps the refused copy, with the denial as comments at its top.
		_, copyPath, found := strings.Cut(string(b), "stored to \"")
		Expect(found).To(BeTrue(), string(b))
		copyPath, _, _ = strings.Cut(copyPath, "\"")
		kept, err := os.ReadFile(copyPath)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(kept)).To(ContainSubstring("missing epoch for lock " + ns + "/" + lock))
		Expect(configMapData(ns, lock)).To(Equal("v11 by W1"))

		By("the same patch presenting the current epoch passes")
		out, err = kubectl(kubeconfig, "-n", ns, "patch", "configmap", lock, "--type", "merge",
			"-p", fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"data":{"report.csv":"patched by W1"}}`, fkv1.AnnotationEpoch, w1.Status.Epoch))
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(configMapData(ns, lock)).To(Equal("patched by W1"))
	})

	It("refuses the stale holder and accepts the current one on every way of writing", func() {
		handOver()
		history := watchConfigMaps(ns)
		DeferCleanup(history.stop)
		manifest := func(epoch int64, data string) string {
			return fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: %s
  namespace: %s
  labels: {%s: %s}
  annotations: {%s: "%d"}
data: {report.csv: %q}
`, lock, ns, fkv1.LabelLock, lock, fkv1.AnnotationEpoch, epoch, data)
		}
		ways := []struct {
			name  string
			write func(epoch int64, data string) error
		}{
			{"update", func(e int64, d string) error { return publish(ns, lock, e, d) }},
			{"json patch", func(e int64, d string) error {
				p := fmt.Sprintf(`[{"op":"add","path":"/metadata/annotations/fencekeeper.io~1epoch","value":"%d"},{"op":"replace","path":"/data/report.csv","value":%q}]`, e, d)
				return k8s.Patch(ctx, cmRef(ns, lock), client.RawPatch(types.JSONPatchType, []byte(p)))
			}},
			{"merge patch", func(e int64, d string) error {
				p := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"data":{"report.csv":%q}}`, fkv1.AnnotationEpoch, e, d)
				return k8s.Patch(ctx, cmRef(ns, lock), client.RawPatch(types.MergePatchType, []byte(p)))
			}},
			{"strategic merge patch", func(e int64, d string) error {
				p := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"data":{"report.csv":%q}}`, fkv1.AnnotationEpoch, e, d)
				return k8s.Patch(ctx, cmRef(ns, lock), client.RawPatch(types.StrategicMergePatchType, []byte(p)))
			}},
			{"kubectl apply", func(e int64, d string) error { return kubectlApply(kubeconfig, manifest(e, d)) }},
			{"kubectl apply --server-side", func(e int64, d string) error {
				return kubectlApply(kubeconfig, manifest(e, d), "--server-side", "--force-conflicts", "--field-manager", "worker")
			}},
		}
		for _, way := range ways {
			err := way.write(w1.Status.Epoch, "stale by W1 via "+way.name)
			Expect(err).To(HaveOccurred(), way.name)
			Expect(err.Error()).To(ContainSubstring("stale epoch %d", w1.Status.Epoch), way.name)
			Expect(configMapData(ns, lock)).NotTo(ContainSubstring("W1"), way.name)

			Expect(way.write(w2.Status.Epoch, "by W2 via "+way.name)).To(Succeed(), way.name)
			Expect(configMapData(ns, lock)).To(Equal("by W2 via "+way.name), way.name)
			var cm corev1.ConfigMap
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &cm)).To(Succeed())
			Expect(cm.Annotations).NotTo(HaveKey(fkv1.AnnotationEpoch), "%s stored the token", way.name)
		}
		expectNoW1AfterW2(history, lock)
	})

	It("fences DELETE: the stale holder cannot delete, nor delete and re-create; the current holder's marked delete works", func() {
		By("W1 marks the report for deletion while it holds the lock, then pauses")
		mark := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d",%q:"%d"}}}`, fkv1.AnnotationEpoch, w1.Status.Epoch, fkv1.AnnotationDeleteEpoch, w1.Status.Epoch)
		Expect(k8s.Patch(ctx, cmRef(ns, lock), client.RawPatch(types.MergePatchType, []byte(mark)))).To(Succeed())
		release(w1)
		w2 = acquire(ns, "w2", lock, "W2", 300)

		By("W1 resumes and deletes: its mark is not the current epoch")
		err := k8s.Delete(ctx, cmRef(ns, lock))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("stale delete for lock " + ns + "/" + lock))
		Expect(configMapData(ns, lock)).To(Equal("v11 by W1"))

		By("W2's next write drops W1's mark: the delete is refused, saying how to delete")
		Expect(publish(ns, lock, w2.Status.Epoch, "v12 by W2")).To(Succeed())
		var cm corev1.ConfigMap
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lock}, &cm)).To(Succeed())
		Expect(cm.Annotations).NotTo(HaveKey(fkv1.AnnotationDeleteEpoch))
		err = k8s.Delete(ctx, cmRef(ns, lock))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(fkv1.AnnotationDeleteEpoch))

		By("an object never marked is refused as such")
		Expect(k8s.Create(ctx, fencedConfigMap(ns, "unmarked", lock, w2.Status.Epoch, "v1", nil))).To(Succeed())
		err = k8s.Delete(ctx, cmRef(ns, "unmarked"))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("is not marked for deletion"))

		By("re-creating under an old epoch with a relaxed policy is refused (a create is checked as current)")
		stale := fencedConfigMap(ns, "report-2026-08", lock, w1.Status.Epoch, "stale by W1",
			map[string]string{fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic})
		err = k8s.Create(ctx, stale)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)

		By("W2 marks and deletes")
		mark = fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d",%q:"%d"}}}`, fkv1.AnnotationEpoch, w2.Status.Epoch, fkv1.AnnotationDeleteEpoch, w2.Status.Epoch)
		Expect(k8s.Patch(ctx, cmRef(ns, lock), client.RawPatch(types.MergePatchType, []byte(mark)))).To(Succeed())
		Expect(k8s.Delete(ctx, cmRef(ns, lock))).To(Succeed())

		By("W1 cannot re-create it with its old epoch")
		err = k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w1.Status.Epoch, "v11 again by W1",
			map[string]string{fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic}))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("it is not the lock's current epoch"))
	})

	It("fences the scale subresource of a guarded kind: refused without an epoch or with a stale one, accepted with the current one", func() {
		report := newReport(ns, "scaled", lock, w1.Status.Epoch, "v1")
		Expect(unstructured.SetNestedField(report.Object, int64(1), "spec", "replicas")).To(Succeed())
		Expect(k8s.Create(ctx, report)).To(Succeed())
		replicas := func() int64 {
			n, _, _ := unstructured.NestedInt64(getReport(ns, "scaled").Object, "spec", "replicas")
			return n
		}
		scale := func(body string) error {
			return k8s.SubResource("scale").Patch(ctx, emptyReport(client.ObjectKeyFromObject(report)), client.RawPatch(types.MergePatchType, []byte(body)))
		}
		By("kubectl scale presents no epoch")
		out, err := kubectl(kubeconfig, "-n", ns, "scale", "reports.reports.example.com/scaled", "--replicas=3")
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("missing epoch"))
		Expect(replicas()).To(Equal(int64(1)))

		By("the current holder scales, presenting its epoch on the Scale")
		Expect(scale(fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"spec":{"replicas":2}}`, fkv1.AnnotationEpoch, w1.Status.Epoch))).To(Succeed())
		Expect(replicas()).To(Equal(int64(2)))

		By("after the handover, the old holder's scale is refused")
		handOver()
		err = scale(fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"spec":{"replicas":5}}`, fkv1.AnnotationEpoch, w1.Status.Epoch))
		Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "%v", err)
		Expect(replicas()).To(Equal(int64(2)))
		By("the new holder's scale waits for one fenced write of its own: a scale cannot move the watermark")
		err = scale(fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"spec":{"replicas":4}}`, fkv1.AnnotationEpoch, w2.Status.Epoch))
		Expect(err).To(MatchError(ContainSubstring("make one fenced write of the object presenting epoch %d first", w2.Status.Epoch)))
		Expect(replicas()).To(Equal(int64(2)))
		Expect(k8s.Patch(ctx, emptyReport(client.ObjectKeyFromObject(report)), client.RawPatch(types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"spec":{"body":"w2"}}`, fkv1.AnnotationEpoch, w2.Status.Epoch))))).To(Succeed())
		Expect(scale(fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"spec":{"replicas":4}}`, fkv1.AnnotationEpoch, w2.Status.Epoch))).To(Succeed())
		Expect(replicas()).To(Equal(int64(4)))

		By("unfenced objects of the kind scale without an epoch")
		plain := newReport(ns, "plain", lock, 0, "v1")
		plain.SetLabels(nil)
		Expect(k8s.Create(ctx, plain)).To(Succeed())
		Expect(k8s.SubResource("scale").Patch(ctx, emptyReport(client.ObjectKeyFromObject(plain)), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`)))).To(Succeed())
	})

	It("refuses an empty fencing label instead of treating the object as unfenced", func() {
		cm := fencedConfigMap(ns, "empty-label", "", w1.Status.Epoch, "v1", nil)
		err := k8s.Create(ctx, cm)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("must name a lock"))
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}))).To(BeTrue())
	})
})

func cmRef(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// expectNoW1AfterW2 checks the object's watched history: once W2's data is
// there, no later version carries W1's.
func expectNoW1AfterW2(h *cmHistory, name string) {
	seenW2 := false
	for _, cm := range h.versions(name) {
		d := cm.Data["report.csv"]
		if strings.Contains(d, "W2") {
			seenW2 = true
		}
		if seenW2 {
			ExpectWithOffset(1, d).NotTo(ContainSubstring("W1"), "W1's write landed after W2's")
		}
	}
}

var kubeconfigPath string

// writeKubeconfig writes (once) a kubeconfig for the suite's admin user.
func writeKubeconfig() string {
	if kubeconfigPath != "" {
		return kubeconfigPath
	}
	// The same user as the suite's client, which creates the claims: an
	// epoch is accepted only from its holder's identity.
	u, err := testEnv.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	b, err := u.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	dir, err := os.MkdirTemp("", "fencekeeper-kubectl-")
	Expect(err).NotTo(HaveOccurred())
	kubeconfigPath = filepath.Join(dir, "kubeconfig")
	Expect(os.WriteFile(kubeconfigPath, b, 0o600)).To(Succeed())
	return kubeconfigPath
}

func kubectl(kubeconfig string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(envtestutil.BinDir(), "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

func kubectlApply(kubeconfig, manifest string, extra ...string) error {
	cmd := exec.Command(filepath.Join(envtestutil.BinDir(), "kubectl"), append([]string{"--kubeconfig", kubeconfig, "apply", "-f", "-"}, extra...)...)
	cmd.Stdin = strings.NewReader(manifest)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, b)
	}
	return nil
}

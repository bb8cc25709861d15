package election_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/election"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var reports = schema.GroupVersionResource{Group: "reports.example.com", Version: "v1", Resource: "reports"}

// scaledReport is a fenced Report with one replica.
func scaledReport(ns, lock string) *unstructured.Unstructured {
	GinkgoHelper()
	r := fencedReport(ns, lock)
	Expect(unstructured.SetNestedField(r.Object, int64(1), "spec", "replicas")).To(Succeed())
	return r
}

// setPhase sets the status phase on a copy (a create drops status).
func setPhase(r *unstructured.Unstructured, phase string) {
	GinkgoHelper()
	Expect(unstructured.SetNestedField(r.Object, phase, "status", "phase")).To(Succeed())
}

func newScale() *unstructured.Unstructured {
	s := &unstructured.Unstructured{}
	s.SetGroupVersionKind(autoscalingv1.SchemeGroupVersion.WithKind("Scale"))
	return s
}

func setReplicas(scale *unstructured.Unstructured, n int64) {
	GinkgoHelper()
	Expect(unstructured.SetNestedField(scale.Object, n, "spec", "replicas")).To(Succeed())
}

// wantStored checks the stored Report, read live: its replicas, and that a
// scale left the watermark at epoch (a scale cannot move it).
func wantStored(ns, name string, replicas, epoch int64) {
	GinkgoHelper()
	r := envtestutil.Report(ns, name)
	Expect(admin.Get(context.Background(), client.ObjectKeyFromObject(r), r)).To(Succeed())
	got, _, _ := unstructured.NestedInt64(r.Object, "spec", "replicas")
	if got != replicas || watermark(r) != epoch {
		Fail(fmt.Sprintf("stored report: %d replicas under watermark %d, want %d under %d", got, watermark(r), replicas, epoch))
	}
}

// wantPhase checks the stored Report's status phase, read live.
func wantPhase(ns, name, phase string) {
	GinkgoHelper()
	r := envtestutil.Report(ns, name)
	Expect(admin.Get(context.Background(), client.ObjectKeyFromObject(r), r)).To(Succeed())
	got, _, _ := unstructured.NestedString(r.Object, "status", "phase")
	Expect(got).To(Equal(phase), "stored report: status phase %q, want %q", got, phase)
}

// deniedFor reports whether err is the fencing admission's denial for reason.
func deniedFor(err error, reason fkv1.AdmissionReason) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) || se.Status().Details == nil {
		return false
	}
	for _, c := range se.Status().Details.Causes {
		if string(c.Type) == reason.CauseType() {
			return true
		}
	}
	return false
}

// staleScale is the Report's Scale, read live, asking for n replicas and
// carrying epoch as its token: what a caller stamped from Epoch() while the
// term was live.
func staleScale(ns, name string, epoch, n int64) *unstructured.Unstructured {
	GinkgoHelper()
	s := newScale()
	Expect(admin.SubResource("scale").Get(context.Background(), envtestutil.Report(ns, name), s)).To(Succeed())
	s.SetAnnotations(map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(epoch)})
	setReplicas(s, n)
	return s
}

var _ = Describe("Fenced leader election: scales and subresources", func() {
	// The leader scales a fenced object through the gate, naming it without
	// labels, by update and by patch: the gate presents the epoch on the
	// Scale (the object refuses the same Scale without it). Once the term is
	// over, scale and status writes are refused without being sent, even a
	// Scale stamped from Epoch() while the term was live, and the object is
	// left as it was.
	It("the gate presents the epoch on scales and refuses subresource writes after the term", func() {
		ctx := context.Background()
		ns := newNamespace()
		l := startCandidate(ns, "scaler", "replica", 15*time.Second, &journal{})
		e := l.waitLeads(30 * time.Second)
		g := l.mgr.GetClient()
		report := scaledReport(ns, "scaler")
		// The fenced write a scale needs first: it sets the watermark to e.
		Expect(g.Create(ctx, report)).To(Succeed(), "the leader's gated create")
		setPhase(report, "Draft")
		Expect(g.Status().Update(ctx, report)).To(Succeed(), "the leader's status update")
		name := report.GetName()
		byName := func() *unstructured.Unstructured { return envtestutil.Report(ns, name) }
		scales := g.SubResource("scale")

		scale := newScale()
		Expect(scales.Get(ctx, byName(), scale)).To(Succeed())
		unstamped := scale.DeepCopy()
		setReplicas(scale, 2)
		Expect(scales.Update(ctx, byName(), client.WithSubResourceBody(scale))).To(Succeed(), "the leader's scale update")
		wantStored(ns, name, 2, e)

		By("the same Scale without the gate presents no epoch: the token above was the gate's")
		raw, err := client.New(env.Admin, client.Options{Scheme: lease.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		unstamped.SetResourceVersion("")
		setReplicas(unstamped, 7)
		err = raw.SubResource("scale").Update(ctx, byName(), client.WithSubResourceBody(unstamped))
		Expect(deniedFor(err, fkv1.AdmissionMissingEpoch)).To(BeTrue(), "an ungated scale update: want a MissingEpoch denial, got %v", err)
		wantStored(ns, name, 2, e)

		Expect(scales.Patch(ctx, byName(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`)))).To(Succeed(), "the leader's scale merge patch")
		wantStored(ns, name, 3, e)
		By("a patch computed from a copy that shows the same annotations still presents the token")
		base := scale.DeepCopy()
		setReplicas(scale, 4)
		Expect(scales.Patch(ctx, byName(), client.MergeFrom(base), client.WithSubResourceBody(scale))).To(Succeed(), "the leader's client.MergeFrom scale patch")
		wantStored(ns, name, 4, e)

		By("after the term")
		token, err := l.lock.Epoch()
		Expect(err).NotTo(HaveOccurred())
		Expect(l.stop()).To(Succeed())
		sent := l.faults.sent("/reports/")
		stale := staleScale(ns, name, token, 9)
		err = scales.Update(ctx, byName(), client.WithSubResourceBody(stale))
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a scale update stamped with epoch %d after the term: want ErrNotLeading, got %v", token, err)
		err = scales.Patch(ctx, byName(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":9}}`)))
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a scale patch after the term: want ErrNotLeading, got %v", err)
		// Server-side apply of a custom resource's /scale is refused by the
		// apiserver itself ("request to convert CR to an invalid group/version:
		// autoscaling/v1"), so only its refusal after the term is tested here;
		// TestPresentApply covers what the gate sends.
		applied := newScale()
		applied.SetNamespace(ns)
		applied.SetName(name)
		setReplicas(applied, 9)
		err = scales.Apply(ctx, client.ApplyConfigurationFromUnstructured(byName()),
			&client.SubResourceApplyOptions{SubResourceBody: client.ApplyConfigurationFromUnstructured(applied)},
			client.FieldOwner("replica"), client.ForceOwnership)
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a scale apply after the term: want ErrNotLeading, got %v", err)
		labelled := byName()
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(labelled), labelled)).To(Succeed())
		setPhase(labelled, "Stale")
		err = g.Status().Update(ctx, labelled)
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a status update of the labelled object after the term: want ErrNotLeading, got %v", err)
		n := l.faults.sent("/reports/") - sent
		Expect(n).To(BeZero(), "the gate sent %d report writes after the term", n)
		wantStored(ns, name, 4, e)
		wantPhase(ns, name, "Draft")
	})

	// The same through WrapConfig, for client-go clients (here the dynamic
	// client): the leader's Scale bodies and /scale patches carry its epoch;
	// after the term, scale and status writes are refused before sending.
	It("the transport gate presents the epoch on scales and refuses subresource writes after the term", func() {
		ctx := context.Background()
		ns := newNamespace()
		l := startCandidate(ns, "scaler", "replica", 15*time.Second, &journal{})
		e := l.waitLeads(30 * time.Second)
		f := &faultTransport{}
		cfg := rest.CopyConfig(env.Admin)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
		dyn, err := dynamic.NewForConfig(l.lock.WrapConfig(cfg))
		Expect(err).NotTo(HaveOccurred())
		rs := dyn.Resource(reports).Namespace(ns)
		report, err := rs.Create(ctx, scaledReport(ns, "scaler"), metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred(), "the leader's create")
		name := report.GetName()
		setPhase(report, "Draft")
		_, err = rs.UpdateStatus(ctx, report, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred(), "the leader's status update")

		scale, err := rs.Get(ctx, name, metav1.GetOptions{}, "scale")
		Expect(err).NotTo(HaveOccurred())
		setReplicas(scale, 2)
		_, err = rs.Update(ctx, scale, metav1.UpdateOptions{}, "scale")
		Expect(err).NotTo(HaveOccurred(), "the leader's scale update")
		wantStored(ns, name, 2, e)
		_, err = rs.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}, "scale")
		Expect(err).NotTo(HaveOccurred(), "the leader's scale merge patch")
		wantStored(ns, name, 3, e)
		By("the documented limit: a JSON patch gets no token, and the object refuses it")
		jsonPatch := []byte(`[{"op":"replace","path":"/spec/replicas","value":5}]`)
		_, err = rs.Patch(ctx, name, types.JSONPatchType, jsonPatch, metav1.PatchOptions{}, "scale")
		Expect(deniedFor(err, fkv1.AdmissionMissingEpoch)).To(BeTrue(), "a JSON patch of /scale: want a MissingEpoch denial, got %v", err)

		By("after the term")
		token, err := l.lock.Epoch()
		Expect(err).NotTo(HaveOccurred())
		Expect(l.stop()).To(Succeed())
		sent := f.sent("/reports/")
		stale := staleScale(ns, name, token, 9)
		_, err = rs.Update(ctx, stale, metav1.UpdateOptions{}, "scale")
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a scale update stamped with epoch %d after the term: want ErrNotLeading, got %v", token, err)
		_, err = rs.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"replicas":9}}`), metav1.PatchOptions{}, "scale")
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a scale patch after the term: want ErrNotLeading, got %v", err)
		labelled := envtestutil.Report(ns, name)
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(labelled), labelled)).To(Succeed())
		setPhase(labelled, "Stale")
		_, err = rs.UpdateStatus(ctx, labelled, metav1.UpdateOptions{})
		Expect(errors.Is(err, election.ErrNotLeading)).To(BeTrue(), "a status update of the labelled object after the term: want ErrNotLeading, got %v", err)
		n := f.sent("/reports/") - sent
		Expect(n).To(BeZero(), "the transport sent %d report writes after the term", n)
		wantStored(ns, name, 3, e)
		wantPhase(ns, name, "Draft")
	})
})

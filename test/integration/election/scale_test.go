package election_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

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
func scaledReport(t *testing.T, ns, lock string) *unstructured.Unstructured {
	t.Helper()
	r := fencedReport(ns, lock)
	if err := unstructured.SetNestedField(r.Object, int64(1), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	return r
}

// setPhase sets the status phase on a copy (a create drops status).
func setPhase(t *testing.T, r *unstructured.Unstructured, phase string) {
	t.Helper()
	if err := unstructured.SetNestedField(r.Object, phase, "status", "phase"); err != nil {
		t.Fatal(err)
	}
}

func newScale() *unstructured.Unstructured {
	s := &unstructured.Unstructured{}
	s.SetGroupVersionKind(autoscalingv1.SchemeGroupVersion.WithKind("Scale"))
	return s
}

func setReplicas(t *testing.T, scale *unstructured.Unstructured, n int64) {
	t.Helper()
	if err := unstructured.SetNestedField(scale.Object, n, "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
}

// wantStored checks the stored Report, read live: its replicas, and that a
// scale left the watermark at epoch (a scale cannot move it).
func wantStored(t *testing.T, ns, name string, replicas, epoch int64) {
	t.Helper()
	r := envtestutil.Report(ns, name)
	if err := admin.Get(context.Background(), client.ObjectKeyFromObject(r), r); err != nil {
		t.Fatal(err)
	}
	got, _, _ := unstructured.NestedInt64(r.Object, "spec", "replicas")
	if got != replicas || watermark(t, r) != epoch {
		t.Fatalf("stored report: %d replicas under watermark %d, want %d under %d", got, watermark(t, r), replicas, epoch)
	}
}

// wantPhase checks the stored Report's status phase, read live.
func wantPhase(t *testing.T, ns, name, phase string) {
	t.Helper()
	r := envtestutil.Report(ns, name)
	if err := admin.Get(context.Background(), client.ObjectKeyFromObject(r), r); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(r.Object, "status", "phase"); got != phase {
		t.Fatalf("stored report: status phase %q, want %q", got, phase)
	}
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
func staleScale(t *testing.T, ns, name string, epoch, n int64) *unstructured.Unstructured {
	t.Helper()
	s := newScale()
	if err := admin.SubResource("scale").Get(context.Background(), envtestutil.Report(ns, name), s); err != nil {
		t.Fatal(err)
	}
	s.SetAnnotations(map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(epoch)})
	setReplicas(t, s, n)
	return s
}

// The leader scales a fenced object through the gate, naming it without
// labels, by update and by patch: the gate presents the epoch on the Scale (the
// object refuses the same Scale without it). Once the term is over, scale
// and status writes are refused without being sent, even a Scale stamped
// from Epoch() while the term was live, and the object is left as it was.
func testGateScale(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	l := startCandidate(t, ns, "scaler", "replica", 15*time.Second, &journal{})
	e := l.waitLeads(t, 30*time.Second)
	g := l.mgr.GetClient()
	report := scaledReport(t, ns, "scaler")
	// The fenced write a scale needs first: it sets the watermark to e.
	if err := g.Create(ctx, report); err != nil {
		t.Fatalf("the leader's gated create: %v", err)
	}
	setPhase(t, report, "Draft")
	if err := g.Status().Update(ctx, report); err != nil {
		t.Fatalf("the leader's status update: %v", err)
	}
	name := report.GetName()
	byName := func() *unstructured.Unstructured { return envtestutil.Report(ns, name) }
	scales := g.SubResource("scale")

	scale := newScale()
	if err := scales.Get(ctx, byName(), scale); err != nil {
		t.Fatal(err)
	}
	unstamped := scale.DeepCopy()
	setReplicas(t, scale, 2)
	if err := scales.Update(ctx, byName(), client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("the leader's scale update: %v", err)
	}
	wantStored(t, ns, name, 2, e)

	// The same Scale without the gate presents no epoch: the token above
	// was the gate's.
	raw, err := client.New(env.Admin, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	unstamped.SetResourceVersion("")
	setReplicas(t, unstamped, 7)
	if err := raw.SubResource("scale").Update(ctx, byName(), client.WithSubResourceBody(unstamped)); !deniedFor(err, fkv1.AdmissionMissingEpoch) {
		t.Fatalf("an ungated scale update: want a MissingEpoch denial, got %v", err)
	}
	wantStored(t, ns, name, 2, e)

	if err := scales.Patch(ctx, byName(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":3}}`))); err != nil {
		t.Fatalf("the leader's scale merge patch: %v", err)
	}
	wantStored(t, ns, name, 3, e)
	// A patch computed from a copy that shows the same annotations still
	// presents the token.
	base := scale.DeepCopy()
	setReplicas(t, scale, 4)
	if err := scales.Patch(ctx, byName(), client.MergeFrom(base), client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("the leader's client.MergeFrom scale patch: %v", err)
	}
	wantStored(t, ns, name, 4, e)

	token, err := l.lock.Epoch()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.stop(); err != nil {
		t.Fatal(err)
	}
	sent := l.faults.sent("/reports/")
	stale := staleScale(t, ns, name, token, 9)
	if err := scales.Update(ctx, byName(), client.WithSubResourceBody(stale)); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a scale update stamped with epoch %d after the term: want ErrNotLeading, got %v", token, err)
	}
	if err := scales.Patch(ctx, byName(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":9}}`))); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a scale patch after the term: want ErrNotLeading, got %v", err)
	}
	// Server-side apply of a custom resource's /scale is refused by the
	// apiserver itself ("request to convert CR to an invalid group/version:
	// autoscaling/v1"), so only its refusal after the term is tested here;
	// TestPresentApply covers what the gate sends.
	applied := newScale()
	applied.SetNamespace(ns)
	applied.SetName(name)
	setReplicas(t, applied, 9)
	if err := scales.Apply(ctx, client.ApplyConfigurationFromUnstructured(byName()),
		&client.SubResourceApplyOptions{SubResourceBody: client.ApplyConfigurationFromUnstructured(applied)},
		client.FieldOwner("replica"), client.ForceOwnership); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a scale apply after the term: want ErrNotLeading, got %v", err)
	}
	labelled := byName()
	if err := admin.Get(ctx, client.ObjectKeyFromObject(labelled), labelled); err != nil {
		t.Fatal(err)
	}
	setPhase(t, labelled, "Stale")
	if err := g.Status().Update(ctx, labelled); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a status update of the labelled object after the term: want ErrNotLeading, got %v", err)
	}
	if n := l.faults.sent("/reports/") - sent; n != 0 {
		t.Fatalf("the gate sent %d report writes after the term", n)
	}
	wantStored(t, ns, name, 4, e)
	wantPhase(t, ns, name, "Draft")
}

// The same through WrapConfig, for client-go clients (here the dynamic
// client): the leader's Scale bodies and /scale patches carry its epoch;
// after the term, scale and status writes are refused before sending.
func testTransportScale(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	l := startCandidate(t, ns, "scaler", "replica", 15*time.Second, &journal{})
	e := l.waitLeads(t, 30*time.Second)
	f := &faultTransport{}
	cfg := rest.CopyConfig(env.Admin)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
	dyn, err := dynamic.NewForConfig(l.lock.WrapConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	rs := dyn.Resource(reports).Namespace(ns)
	report, err := rs.Create(ctx, scaledReport(t, ns, "scaler"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the leader's create: %v", err)
	}
	name := report.GetName()
	setPhase(t, report, "Draft")
	if _, err := rs.UpdateStatus(ctx, report, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the leader's status update: %v", err)
	}

	scale, err := rs.Get(ctx, name, metav1.GetOptions{}, "scale")
	if err != nil {
		t.Fatal(err)
	}
	setReplicas(t, scale, 2)
	if _, err := rs.Update(ctx, scale, metav1.UpdateOptions{}, "scale"); err != nil {
		t.Fatalf("the leader's scale update: %v", err)
	}
	wantStored(t, ns, name, 2, e)
	if _, err := rs.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}, "scale"); err != nil {
		t.Fatalf("the leader's scale merge patch: %v", err)
	}
	wantStored(t, ns, name, 3, e)
	// The documented limit: a JSON patch gets no token, and the object
	// refuses it.
	jsonPatch := []byte(`[{"op":"replace","path":"/spec/replicas","value":5}]`)
	if _, err := rs.Patch(ctx, name, types.JSONPatchType, jsonPatch, metav1.PatchOptions{}, "scale"); !deniedFor(err, fkv1.AdmissionMissingEpoch) {
		t.Fatalf("a JSON patch of /scale: want a MissingEpoch denial, got %v", err)
	}

	token, err := l.lock.Epoch()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.stop(); err != nil {
		t.Fatal(err)
	}
	sent := f.sent("/reports/")
	stale := staleScale(t, ns, name, token, 9)
	if _, err := rs.Update(ctx, stale, metav1.UpdateOptions{}, "scale"); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a scale update stamped with epoch %d after the term: want ErrNotLeading, got %v", token, err)
	}
	if _, err := rs.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"replicas":9}}`), metav1.PatchOptions{}, "scale"); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a scale patch after the term: want ErrNotLeading, got %v", err)
	}
	labelled := envtestutil.Report(ns, name)
	if err := admin.Get(ctx, client.ObjectKeyFromObject(labelled), labelled); err != nil {
		t.Fatal(err)
	}
	setPhase(t, labelled, "Stale")
	if _, err := rs.UpdateStatus(ctx, labelled, metav1.UpdateOptions{}); !errors.Is(err, election.ErrNotLeading) {
		t.Fatalf("a status update of the labelled object after the term: want ErrNotLeading, got %v", err)
	}
	if n := f.sent("/reports/") - sent; n != 0 {
		t.Fatalf("the transport sent %d report writes after the term", n)
	}
	wantStored(t, ns, name, 3, e)
	wantPhase(t, ns, name, "Draft")
}

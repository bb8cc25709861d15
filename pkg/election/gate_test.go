package election

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	autoscalingv1ac "k8s.io/client-go/applyconfigurations/autoscaling/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A scale apply presents the epoch on what is sent: the body option's
// Scale when there is one (the caller's options kept, the object as given),
// else the apply configuration itself. No server: the apiserver refuses
// server-side apply of a custom resource's /scale, the only scaled kind
// the election tests fence.
func TestPresentApply(t *testing.T) {
	report := &unstructured.Unstructured{}
	report.SetAPIVersion("reports.example.com/v1")
	report.SetKind("Report")
	report.SetNamespace("ops")
	report.SetName("table")
	parent := client.ApplyConfigurationFromUnstructured(report)
	u, err := unstructuredOf(parent)
	if err != nil {
		t.Fatal(err)
	}
	body := autoscalingv1ac.Scale().WithName("table").WithNamespace("ops").WithSpec(autoscalingv1ac.ScaleSpec().WithReplicas(3))
	opts := []client.SubResourceApplyOption{&client.SubResourceApplyOptions{SubResourceBody: body}, client.FieldOwner("replica")}

	obj, got, err := presentApply(parent, u, opts, 42)
	if err != nil {
		t.Fatal(err)
	}
	o := (&client.SubResourceApplyOptions{}).ApplyOpts(got)
	sent, err := unstructuredOf(o.SubResourceBody)
	if err != nil {
		t.Fatal(err)
	}
	replicas, _, _ := unstructured.NestedInt64(sent.Object, "spec", "replicas")
	if sent.GetAnnotations()[fkv1.AnnotationEpoch] != "42" || replicas != 3 || o.FieldManager != "replica" {
		t.Fatalf("with a body option: sent %v, field manager %q", sent.Object, o.FieldManager)
	}
	if obj != parent {
		t.Fatalf("with a body option the object changed: %#v", obj)
	}

	obj, _, err = presentApply(parent, u, nil, 42)
	if err != nil {
		t.Fatal(err)
	}
	if sent, err = unstructuredOf(obj); err != nil || sent.GetAnnotations()[fkv1.AnnotationEpoch] != "42" || sent.GetName() != "table" {
		t.Fatalf("without a body option: sent %v (%v)", sent, err)
	}
}

package fencing

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestStatusWrite(t *testing.T) {
	obj := func(lock string, ann map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetLabels(map[string]string{fkv1.LabelLock: lock, "app": "x"})
		u.SetAnnotations(ann)
		return u
	}
	base := map[string]string{fkv1.AnnotationFencedEpoch: "42", "example.com/note": "a"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range base {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		new     *unstructured.Unstructured
		allowed bool
	}{
		{"nothing of ours changes", obj("r", with("example.com/note", "b")), true},
		{"another annotation removed", obj("r", with("example.com/note", "")), true},
		{"watermark lowered", obj("r", with(fkv1.AnnotationFencedEpoch, "1")), false},
		{"watermark removed", obj("r", with(fkv1.AnnotationFencedEpoch, "")), false},
		{"identity opt-out added", obj("r", with(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)), false},
		{"token added", obj("r", with(fkv1.AnnotationEpoch, "43")), false},
		{"lock label changed", obj("s", base), false},
		{"lock label removed", obj("", base), false},
	} {
		d := StatusWrite(obj("r", base), tc.new)
		if d.Allowed != tc.allowed {
			t.Errorf("%s: allowed %v, want %v (%s)", tc.name, d.Allowed, tc.allowed, d.Message)
		}
		if !d.Allowed && d.Reason != fkv1.AdmissionStatusChangesFencing {
			t.Errorf("%s: reason %s", tc.name, d.Reason)
		}
		// Restoring always yields a write StatusWrite allows, and keeps
		// what is not fencekeeper's.
		restored := RestoreFencingMetadata(obj("r", base), tc.new)
		if d := StatusWrite(obj("r", base), restored); !d.Allowed {
			t.Errorf("%s: after restoring: %s", tc.name, d.Message)
		}
		if got, want := restored.GetAnnotations()["example.com/note"], tc.new.GetAnnotations()["example.com/note"]; got != want {
			t.Errorf("%s: restoring changed another annotation: %q, want %q", tc.name, got, want)
		}
		if restored.GetLabels()["app"] != "x" {
			t.Errorf("%s: restoring dropped another label", tc.name)
		}
	}
}

package fencing

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	owned := func(u *unstructured.Unstructured) *unstructured.Unstructured {
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "ghost", UID: "u-1"}})
		return u
	}
	noLabels := obj("r", base)
	noLabels.SetLabels(nil)
	noAnnotations := obj("r", nil)
	for _, tc := range []struct {
		name    string
		new     *unstructured.Unstructured
		allowed bool
	}{
		{"nothing of ours changes", obj("r", with("example.com/note", "b")), true},
		{"another annotation removed", obj("r", with("example.com/note", "")), true},
		{"watermark lowered", obj("r", with(fkv1.AnnotationFencedEpoch, "1")), false},
		{"identity opt-out added", obj("r", with(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)), false},
		{"token added", obj("r", with(fkv1.AnnotationEpoch, "43")), false},
		{"an owner added", owned(obj("r", base)), false},
		// Built-in kinds keep annotations sent to status: what the holder's
		// next kubectl apply prunes by is content.
		{"last-applied-configuration rewritten", obj("r", with(lastApplied, `{"data":{}}`)), false},
		{"a data field's owner moved (a custom resource keeps managedFields outside spec)", func() *unstructured.Unstructured {
			u := obj("r", base)
			u.SetManagedFields([]metav1.ManagedFieldsEntry{applyBy("mallory", `{"f:data":{"f:x":{}}}`)})
			return u
		}(), false},
		{"a status field's owner moved", func() *unstructured.Unstructured {
			u := obj("r", base)
			u.SetManagedFields([]metav1.ManagedFieldsEntry{applyBy("mallory", `{"f:status":{"f:x":{}}}`)})
			return u
		}(), true},
		// Left out by the client: put back, not refused.
		{"watermark left out", obj("r", with(fkv1.AnnotationFencedEpoch, "")), true},
		{"no annotations sent", noAnnotations, true},
		{"no labels sent", noLabels, true},
		{"lock label changed", obj("s", base), true},
		{"lock label emptied", obj("", base), true},
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
		if got := restored.GetLabels()[fkv1.LabelLock]; got != "r" {
			t.Errorf("%s: restored lock label %q", tc.name, got)
		}
		for k, v := range base {
			if got := restored.GetAnnotations()[k]; strings.HasPrefix(k, fkv1.Prefix) && got != v {
				t.Errorf("%s: restored %s = %q, want %q", tc.name, k, got, v)
			}
		}
		if _, ok := restored.GetAnnotations()[fkv1.AnnotationEpoch]; ok {
			t.Errorf("%s: restoring kept an annotation of ours the stored object lacks", tc.name)
		}
		if got, want := restored.GetAnnotations()["example.com/note"], tc.new.GetAnnotations()["example.com/note"]; got != want {
			t.Errorf("%s: restoring changed another annotation: %q, want %q", tc.name, got, want)
		}
		if tc.new.GetLabels()["app"] == "x" && restored.GetLabels()["app"] != "x" {
			t.Errorf("%s: restoring dropped another label", tc.name)
		}
	}
	// An owner renamed in place (same UID) is one the garbage collector will
	// not find: refused like an added one; an unchanged owner passes.
	renamed := owned(obj("r", base))
	renamed.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "elsewhere", UID: "u-1"}})
	if d := StatusWrite(owned(obj("r", base)), renamed); d.Allowed {
		t.Error("a status write renamed an owner in place")
	}
	if d := StatusWrite(owned(obj("r", base)), owned(obj("r", base))); !d.Allowed {
		t.Errorf("a status write keeping its owner was refused: %s", d.Message)
	}
}

package fencing

import (
	"encoding/json"
	"maps"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// applyInputs is what of an object's managedFields decides what a
// server-side apply prunes: the content fields each applier owns, and the
// content fields owned by updaters at all. An apply removes a field its
// manager applied before and no longer applies, unless another manager
// owns it too, so moving a field into an applier's set, or out of
// everybody else's, steers the holder's next apply. Content fields are
// those outside metadata and status, plus the metadata that is content
// (contentAnnotation's annotations, and the owners the object keeps): the
// apiserver moves the rest on every label, annotation, finalizer or owner
// change (that bookkeeping is maintenance, rule 8), and status is not
// fenced. Fields are named per API version, since an apply prunes in its
// own version's terms. Updaters are one set per version, since the
// apiserver folds the oldest of them into "ancient-changes" on its own.
type applyInputs struct {
	appliers map[string]map[string]bool // applier (manager/subresource/apiVersion) -> field paths
	updaters map[string]bool            // apiVersion + field path
}

// ApplyInputsChanged reports whether a write changes what the holder's
// next apply of the object prunes (see applyInputs): a content change,
// whatever else it changes. keptOwners are the UIDs of the owners both
// objects name (nil: read them from old and obj).
func ApplyInputsChanged(old, obj *unstructured.Unstructured) bool {
	kept := keptOwners(old, obj)
	return !applyInputsOf(old, kept).equal(applyInputsOf(obj, kept))
}

func applyInputsOf(u *unstructured.Unstructured, kept map[types.UID]bool) applyInputs {
	in := applyInputs{appliers: map[string]map[string]bool{}, updaters: map[string]bool{}}
	if u == nil {
		return in
	}
	for _, e := range u.GetManagedFields() {
		paths := contentPaths(e.FieldsV1, kept)
		if e.Operation != metav1.ManagedFieldsOperationApply {
			for p := range paths {
				in.updaters[e.APIVersion+"\x00"+p] = true
			}
			continue
		}
		if len(paths) == 0 {
			continue // an entry owning nothing (left) is dropped by the apiserver
		}
		key := e.Manager + "/" + e.Subresource + "/" + e.APIVersion
		if in.appliers[key] == nil {
			in.appliers[key] = map[string]bool{}
		}
		maps.Copy(in.appliers[key], paths)
	}
	return in
}

func (a applyInputs) equal(b applyInputs) bool {
	return maps.Equal(a.updaters, b.updaters) &&
		maps.EqualFunc(a.appliers, b.appliers, maps.Equal[map[string]bool])
}

// keptOwners are the UIDs of the owner references both objects carry.
func keptOwners(old, obj *unstructured.Unstructured) map[types.UID]bool {
	kept := map[types.UID]bool{}
	if old == nil || obj == nil {
		return kept
	}
	had := map[types.UID]bool{}
	for _, o := range old.GetOwnerReferences() {
		had[o.UID] = true
	}
	for _, o := range obj.GetOwnerReferences() {
		if had[o.UID] {
			kept[o.UID] = true
		}
	}
	return kept
}

// contentPaths lists the owned content fields of a FieldsV1 set, one path
// per leaf ("." marks a node owned as a whole). A set that does not decode
// counts as one opaque path, so changing it is content.
func contentPaths(f *metav1.FieldsV1, kept map[types.UID]bool) map[string]bool {
	out := map[string]bool{}
	raw := f.GetRawBytes() // nil for a nil f
	if len(raw) == 0 {
		return out
	}
	var tree map[string]any
	if err := json.Unmarshal(raw, &tree); err != nil {
		out["!"+string(raw)] = true
		return out
	}
	for k, v := range tree {
		switch k {
		case "f:status", "f:apiVersion", "f:kind":
		case "f:metadata":
			metadataPaths(v, kept, out)
		default:
			leaves(k, v, out)
		}
	}
	return out
}

// metadataPaths adds the metadata that is content: the annotations
// contentAnnotation names (but bookkeptAnnotation; their values are judged
// as content all the same), and the
// owners that stay (who owns one decides whether the holder's apply that
// drops it removes it; an owner added or removed is judged by addsOwner).
func metadataPaths(meta any, kept map[types.UID]bool, out map[string]bool) {
	m, _ := meta.(map[string]any)
	if a, ok := m["f:annotations"].(map[string]any); ok {
		for k, v := range a {
			if name := strings.TrimPrefix(k, "f:"); contentAnnotation(name) && !bookkeptAnnotation[name] {
				leaves("f:metadata\x00f:annotations\x00"+k, v, out)
			}
		}
	}
	if o, ok := m["f:ownerReferences"].(map[string]any); ok {
		for k, v := range o {
			var key struct{ UID types.UID }
			if json.Unmarshal([]byte(strings.TrimPrefix(k, "k:")), &key) == nil && kept[key.UID] {
				leaves("f:metadata\x00f:ownerReferences\x00"+k, v, out)
			}
		}
	}
}

// bookkeptAnnotation are content annotations whose ownership steers no
// apply: kubectl's own step co-owns last-applied-configuration, the token
// is never stored, and the watermark is admission's.
var bookkeptAnnotation = map[string]bool{lastApplied: true, fkv1.AnnotationEpoch: true, fkv1.AnnotationFencedEpoch: true}

func leaves(path string, node any, out map[string]bool) {
	children, ok := node.(map[string]any)
	if !ok || len(children) == 0 {
		out[path] = true
		return
	}
	for k, v := range children {
		leaves(path+"\x00"+k, v, out)
	}
}

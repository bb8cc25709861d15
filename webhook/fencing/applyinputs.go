package fencing

import (
	"encoding/json"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// applyInputs is what of an object's managedFields decides what a
// server-side apply prunes: the content fields each applier owns, and the
// content fields owned by updaters at all. An apply removes a field its
// manager applied before and no longer applies, unless another manager
// owns it too, so moving a field into an applier's set, or out of
// everybody else's, steers the holder's next apply. Fields under metadata
// and status are left out: the apiserver moves them on every label,
// annotation, finalizer or owner change (that bookkeeping is maintenance,
// rule 8), and status is not fenced. Updaters are one set, since the
// apiserver folds the oldest of them into "ancient-changes" on its own.
type applyInputs struct {
	appliers map[string]map[string]bool // applier (manager/subresource) -> field paths
	updaters map[string]bool
}

func applyInputsOf(u *unstructured.Unstructured) applyInputs {
	in := applyInputs{appliers: map[string]map[string]bool{}, updaters: map[string]bool{}}
	if u == nil {
		return in
	}
	for _, e := range u.GetManagedFields() {
		paths := contentPaths(e.FieldsV1)
		if e.Operation != metav1.ManagedFieldsOperationApply {
			maps.Copy(in.updaters, paths)
			continue
		}
		if len(paths) == 0 {
			continue // an entry owning nothing (left) is dropped by the apiserver
		}
		key := e.Manager + "/" + e.Subresource
		if in.appliers[key] == nil {
			in.appliers[key] = map[string]bool{}
		}
		maps.Copy(in.appliers[key], paths)
	}
	return in
}

func (a applyInputs) equal(b applyInputs) bool {
	return maps.Equal(a.updaters, b.updaters) &&
		maps.EqualFunc(a.appliers, b.appliers, func(x, y map[string]bool) bool { return maps.Equal(x, y) })
}

// contentPaths lists the owned fields of a FieldsV1 set outside metadata and
// status, one path per leaf ("." marks a node owned as a whole). A set that
// does not decode counts as one opaque path, so changing it is content.
func contentPaths(f *metav1.FieldsV1) map[string]bool {
	out := map[string]bool{}
	if f == nil || len(f.Raw) == 0 {
		return out
	}
	var tree map[string]any
	if err := json.Unmarshal(f.Raw, &tree); err != nil {
		out["!"+string(f.Raw)] = true
		return out
	}
	for _, k := range slices.Sorted(maps.Keys(tree)) {
		switch k {
		case "f:metadata", "f:status", "f:apiVersion", "f:kind":
			continue
		}
		leaves(k, tree[k], out)
	}
	return out
}

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

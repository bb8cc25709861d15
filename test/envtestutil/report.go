package envtestutil

import "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

// Report is the test Report (test/crds: a custom resource with a status and
// a scale subresource) named name in ns, with nothing else set: fill it to
// create one, or pass it as is to Get, Patch or a subresource write.
func Report(ns, name string) *unstructured.Unstructured {
	r := &unstructured.Unstructured{}
	r.SetAPIVersion("reports.example.com/v1")
	r.SetKind("Report")
	r.SetNamespace(ns)
	r.SetName(name)
	return r
}

package lease

import (
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The MergeFrom trap: a base stamped with the same epoch makes the diff drop
// the token. Patch's wrapper presents it anyway.
func TestPatchAlwaysPresentsTheEpoch(t *testing.T) {
	g := NewWithT(t)
	base := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "report-2026-07", Namespace: "reports", ResourceVersion: "7",
		Annotations: map[string]string{fkv1.AnnotationFencedEpoch: "41"}}, Data: map[string]string{"report.csv": "v11"}}
	Stamp(base, "report-2026-07", 41)
	obj := base.DeepCopy()
	obj.Data["report.csv"] = "v12"

	plain, err := client.MergeFrom(base).Data(obj)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(plain)).NotTo(ContainSubstring(fkv1.AnnotationEpoch), "the trap this wrapper exists for")

	for name, p := range map[string]client.Patch{
		"merge":           client.MergeFrom(base),
		"merge with lock": client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}),
		"strategic":       client.StrategicMergeFrom(base),
	} {
		data, err := presenting{Patch: p, epoch: 41}.Data(obj)
		g.Expect(err).NotTo(HaveOccurred(), name)
		var m map[string]any
		g.Expect(json.Unmarshal(data, &m)).To(Succeed(), name)
		g.Expect(m).To(HaveKeyWithValue("metadata", HaveKeyWithValue("annotations", HaveKeyWithValue(fkv1.AnnotationEpoch, "41"))), name)
		g.Expect(m).To(HaveKeyWithValue("data", HaveKeyWithValue("report.csv", "v12")), name)
	}

	data, err := presenting{Patch: client.RawPatch("application/json-patch+json", []byte(`[{"op":"replace","path":"/data/report.csv","value":"v12"}]`)), epoch: 41}.Data(obj)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).To(ContainSubstring(`"path":"/metadata/annotations/fencekeeper.io~1epoch"`))
}

// Adding the epoch re-encodes the patch: numbers must come out as written,
// not through float64 (custom resources carry int64 fields above 2^53).
func TestPatchKeepsLargeNumbers(t *testing.T) {
	g := NewWithT(t)
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "reports"}}
	for _, p := range []client.Patch{
		client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"n":1733030400123456789,"f":1e23}}`)),
		client.RawPatch("application/json-patch+json", []byte(`[{"op":"replace","path":"/spec/n","value":1733030400123456789}]`)),
	} {
		data, err := presenting{Patch: p, epoch: 7}.Data(obj)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(data)).To(ContainSubstring("1733030400123456789"), string(p.Type()))
	}
}

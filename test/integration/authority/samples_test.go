package authority_test

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// The claim samples in config/samples run as their comments say, applied
// in the order they give (into a namespace of the test's own).
var _ = Describe("The claim samples", func() {
	readClaims := func(file string) []*fkv1.FencedLease {
		b, err := os.ReadFile(filepath.Join(envtestutil.RepoRoot(), "config", "samples", file))
		Expect(err).NotTo(HaveOccurred())
		var out []*fkv1.FencedLease
		for _, doc := range strings.Split(string(b), "\n---\n") {
			c := &fkv1.FencedLease{}
			Expect(yaml.UnmarshalStrict([]byte(doc), c)).To(Succeed(), "%s", file)
			Expect(c.Kind).To(Equal("FencedLease"))
			out = append(out, c)
		}
		return out
	}

	It("fencedleases.yaml then bounded-waits.yaml: W1 holds, W2 and W3 wait, the try-once check ends at once", func() {
		m := startManager(time.Second)
		DeferCleanup(func() { m.Stop() })
		ns := newNamespace()
		h := recordHistory(ns)
		apply := func(file string) []*fkv1.FencedLease {
			claims := readClaims(file)
			for _, c := range claims {
				c.Namespace = ns
				Expect(k8s.Create(ctx, c)).To(Succeed(), "%s: %s", file, c.Name)
			}
			return claims
		}
		two := apply("fencedleases.yaml")
		Expect(two).To(HaveLen(2))
		eventuallyPhase(ns, two[0].Name, fkv1.PhaseHeld)
		eventuallyPhase(ns, two[1].Name, fkv1.PhasePending)

		waits := apply("bounded-waits.yaml")
		Expect(waits).To(HaveLen(2))
		w3, check := waits[0], waits[1]
		Expect(*w3.Spec.AcquireTimeoutSeconds).To(Equal(int32(60)))
		Expect(*check.Spec.AcquireTimeoutSeconds).To(BeZero())
		ended := eventuallyPhase(ns, check.Name, fkv1.PhaseExpired)
		Expect(ended.Status.Epoch).To(BeZero())
		Expect(reasonOf(ended)).To(Equal(fkv1.ReasonAcquireTimeout))
		Consistently(func() fkv1.FencedLeasePhase { return getClaim(ns, w3.Name).Status.Phase }, 2*time.Second).Should(Equal(fkv1.PhasePending))
		Expect(getClaim(ns, w3.Name).Status.Epoch).To(BeZero())
		h.verifyClaims()
		h.verifyLeases()
	})
})

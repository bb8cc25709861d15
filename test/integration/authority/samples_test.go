package authority_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

	It("semaphore.yaml: three loaders hold a permit each with epochs of their own, the fourth waits, the Lease lists three permits; the fourth gets the next epoch when one ends", func() {
		m := startManager(time.Second)
		DeferCleanup(func() { m.Stop() })
		ns := newNamespace()
		h := recordHistory(ns)
		claims := readClaims("semaphore.yaml")
		Expect(claims).To(HaveLen(4))
		for _, c := range claims {
			Expect(c.Spec.LockName).To(Equal("warehouse-load"))
			Expect(c.MaxHolders()).To(Equal(int32(3)), "%s", c.Name)
			c.Namespace = ns
			// Applied at once, as kubectl apply does: FIFO is by creation
			// time, then by name.
			Expect(k8s.Create(ctx, c)).To(Succeed(), "%s", c.Name)
		}
		a, b, c, d := claims[0].Name, claims[1].Name, claims[2].Name, claims[3].Name

		epochs := map[int64]string{}
		for _, name := range []string{a, b, c} {
			held := eventuallyPhase(ns, name, fkv1.PhaseHeld)
			Expect(held.Status.Epoch).NotTo(BeZero())
			Expect(epochs).NotTo(HaveKey(held.Status.Epoch), "%s holds the epoch of %s", name, epochs[held.Status.Epoch])
			epochs[held.Status.Epoch] = name
			Expect(held.Status.LeaseName).To(Equal(fkv1.PermitLeaseName("warehouse-load", held.Status.Epoch)))
		}
		Consistently(func() fkv1.FencedLeasePhase { return getClaim(ns, d).Status.Phase }, 2*time.Second, 100*time.Millisecond).
			Should(Equal(fkv1.PhasePending), "a fourth holder of a lock of three permits")
		Expect(getClaim(ns, d).Status.Epoch).To(BeZero())

		By("the lock's Lease records the capacity and lists the three permits, each its claim's")
		led := fkv1.ReadLedger(getLease(ns, "warehouse-load"), "warehouse-load")
		Expect(led.PermitsInvalid).To(BeFalse())
		Expect(led.MaxHolders()).To(Equal(int32(3)))
		Expect(led.Permits).To(HaveLen(3))
		for _, p := range led.Permits {
			Expect(epochs).To(HaveKeyWithValue(p.Epoch, p.Claim))
			Expect(p.UID).To(Equal(getClaim(ns, p.Claim).UID))
			Expect(p.TTL).To(Equal(int32(600)))
			Expect(p.Epoch).To(BeNumerically("<=", led.Epoch))
		}
		By("each permit has its renewal Lease")
		for epoch := range epochs {
			Eventually(func() error {
				return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fkv1.PermitLeaseName("warehouse-load", epoch)}, &coordinationv1.Lease{})
			}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
		}

		By("kubectl get fl -o wide shows the capacity in column Max (priority 1: -o wide only)")
		maxCol := tableColumn(ns, "Max")
		Expect(maxCol.priority).To(Equal(int32(1)))
		Expect(maxCol.cells).To(HaveLen(4))
		for name, v := range maxCol.cells {
			Expect(v).To(BeEquivalentTo(3), "claim %s", name)
		}

		By("one loader releases: the fourth is granted the next epoch")
		deleteClaim(getClaim(ns, a))
		next := eventuallyPhase(ns, d, fkv1.PhaseHeld)
		Expect(next.Status.Epoch).To(Equal(led.Epoch + 1))
		h.Complete()
		h.verifyClaims()
		h.verifyLeases()
	})
})

// column is one printer column of a server-side table of claims: its
// priority and its cell by claim name.
type column struct {
	priority int32
	cells    map[string]any
}

// tableColumn lists the claims of ns as kubectl get does (a server-side
// Table) and returns the column named name.
func tableColumn(ns, name string) column {
	hc, err := rest.HTTPClientFor(cfg)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet,
		strings.TrimSuffix(cfg.Host, "/")+"/apis/"+fkv1.GroupVersion.String()+"/namespaces/"+ns+"/fencedleases", nil)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, resp.StatusCode).To(Equal(http.StatusOK), "%s", body)
	var t metav1.Table
	ExpectWithOffset(1, json.Unmarshal(body, &t)).To(Succeed())
	for i, col := range t.ColumnDefinitions {
		if col.Name != name {
			continue
		}
		out := column{priority: col.Priority, cells: map[string]any{}}
		for _, row := range t.Rows {
			var meta metav1.PartialObjectMetadata
			ExpectWithOffset(1, json.Unmarshal(row.Object.Raw, &meta)).To(Succeed())
			out.cells[meta.Name] = row.Cells[i]
		}
		return out
	}
	Fail("no column " + name)
	return column{}
}

package authority_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// failExpiring fails the first n status writes that mark a claim Expired,
// as if the manager stopped right before them.
type failExpiring struct {
	next http.RoundTripper
	left *atomic.Int64
	ns   string
}

func (t failExpiring) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPatch && strings.Contains(req.URL.Path, "/namespaces/"+t.ns+"/fencedleases/") &&
		strings.HasSuffix(req.URL.Path, "/status") && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"phase":"Expired"`)) && t.left.Add(-1) >= 0 {
			return nil, errors.New("injected: the manager stopped before marking the old holder Expired")
		}
	}
	return t.next.RoundTrip(req)
}

var _ = Describe("Claim status order", func() {
	It("never shows two Held claims for one lock, even when the manager stops between the status writes of a handoff", func() {
		ns := newNamespace()
		left := &atomic.Int64{}
		left.Store(3)
		m, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{
			WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return failExpiring{next: rt, left: left, ns: ns} },
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(m.Stop()).To(Succeed()) })
		h := recordHistory(ns)

		for round := 0; round < 3; round++ {
			left.Store(3)
			// Each holder expires (no renewals); the next is granted.
			lock := "lock" + string(rune('0'+round))
			a := createClaim(ns, "a"+string(rune('0'+round)), lock, "A", 1)
			eventuallyPhase(ns, a.Name, fkv1.PhaseHeld)
			b := createClaim(ns, "b"+string(rune('0'+round)), lock, "B", 300)
			eventuallyPhaseWithin(ns, b.Name, fkv1.PhaseHeld, 30*time.Second)
			Expect(left.Load()).To(BeNumerically("<", 0), "the crash was injected")
			Eventually(func() fkv1.FencedLeasePhase { return getClaim(ns, a.Name).Status.Phase }, 10*time.Second).Should(Equal(fkv1.PhaseExpired))
			deleteClaim(getClaim(ns, b.Name))
		}

		By("replaying the watched claim history: at most one Held claim per lock at any point")
		time.Sleep(500 * time.Millisecond)
		phase := map[string]map[string]fkv1.FencedLeasePhase{}
		sawHeld := 0
		for _, c := range h.Claims() {
			if phase[c.Spec.LockName] == nil {
				phase[c.Spec.LockName] = map[string]fkv1.FencedLeasePhase{}
			}
			phase[c.Spec.LockName][c.Name] = c.Status.Phase
			held := []string{}
			for name, p := range phase[c.Spec.LockName] {
				if p == fkv1.PhaseHeld {
					held = append(held, name)
				}
			}
			Expect(len(held)).To(BeNumerically("<=", 1), "two Held claims at once: %v", held)
			if len(held) == 1 {
				sawHeld++
			}
		}
		Expect(sawHeld).To(BeNumerically(">", 0), "the history saw no Held claim at all")
	})
})

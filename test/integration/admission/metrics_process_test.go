package admission_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

// DESIGN §8's metrics, read the way Prometheus reads them: the real manager
// binary's /metrics over HTTP, around a grant, a handoff, an expiry and a
// stale write.
var _ = Describe("The manager's metrics", func() {
	It("move with a grant, a handoff, an expiry and a stale write", func() {
		addr := freeLocalAddress()
		By("starting a manager process serving /metrics on " + addr)
		p, err := envtestutil.StartManagerProcess(ctx, testEnv, k8s, GinkgoT().TempDir(), GinkgoWriter, "--metrics-bind-address="+addr)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(p.Stop)
		scrape := func() promSample { return scrapeMetrics(addr) }
		var before promSample
		Eventually(func() error { before, err = tryScrapeMetrics(addr); return err }, 30*time.Second, 100*time.Millisecond).Should(Succeed())
		// moved is how far a series moved since before (a series not yet
		// exported counts as 0).
		moved := func(series string) func() float64 {
			return func() float64 { return scrape().value(series) - before.value(series) }
		}

		// A metric observed before the status write a step waits for is
		// served at once; the margin is for a loaded machine.
		eventually := func(actual any) AsyncAssertion {
			return EventuallyWithOffset(1, actual, 10*time.Second, 50*time.Millisecond)
		}

		ns := newNamespace()
		lock := "metered-report"
		DeferCleanup(func() {
			Expect(k8s.DeleteAllOf(ctx, &fkv1.FencedLease{}, client.InNamespace(ns))).To(Succeed())
		})
		contended := fmt.Sprintf(`fencekeeper_contended_locks{lock=%q,namespace=%q}`, lock, ns)

		By("a grant")
		w1 := acquire(ns, "w1", lock, "W1", 300)
		eventually(moved("fencekeeper_grants_total")).Should(BeNumerically(">=", 1))
		eventually(moved("fencekeeper_acquire_wait_seconds_count")).Should(BeNumerically(">=", 1))

		By("three waiters: the waiter gauges and the contended lock")
		w2 := newClaimObj(ns, "w2", lock, "W2", 2) // never renewed: expires 2 s after its grant
		w3 := newClaimObj(ns, "w3", lock, "W3", 300)
		w4 := newClaimObj(ns, "w4", lock, "W4", 300)
		for _, c := range []*fkv1.FencedLease{w2, w3, w4} {
			Expect(k8s.Create(ctx, c)).To(Succeed())
			waitPhase(c, fkv1.PhasePending)
		}
		eventually(func() float64 { return scrape().value(contended) }).Should(Equal(3.0))
		Expect(scrape().value("fencekeeper_waiters")).To(BeNumerically(">=", 3))
		// creationTimestamp has a 1 s resolution: a second on, the oldest
		// waiter is at least a second old.
		Eventually(func() float64 { return scrape().value("fencekeeper_oldest_waiter_age_seconds") }, 10*time.Second).
			Should(BeNumerically(">=", 1))

		By("a handoff: W1 releases, W2 is granted")
		release(w1)
		waitPhase(w2, fkv1.PhaseHeld)
		eventually(moved("fencekeeper_releases_total")).Should(BeNumerically(">=", 1))
		eventually(moved(`fencekeeper_hold_duration_seconds_count{ended="released"}`)).Should(BeNumerically(">=", 1))
		Expect(moved(`fencekeeper_hold_duration_seconds_sum{ended="released"}`)()).To(BeNumerically(">", 0), "W1 held for seconds")
		eventually(moved("fencekeeper_grants_total")).Should(BeNumerically(">=", 2))
		eventually(moved("fencekeeper_acquire_wait_seconds_count")).Should(BeNumerically(">=", 2))
		eventually(func() float64 { return scrape().value(contended) }).Should(Equal(2.0))

		By("an expiry: W2 never renews, W3 is granted")
		w3 = waitPhase(w3, fkv1.PhaseHeld)
		eventually(moved("fencekeeper_expirations_total")).Should(BeNumerically(">=", 1))
		eventually(moved(`fencekeeper_hold_duration_seconds_count{ended="expired"}`)).Should(BeNumerically(">=", 1))
		Expect(moved(`fencekeeper_hold_duration_seconds_sum{ended="expired"}`)()).To(BeNumerically(">=", 1), "W2 held for its 2 s TTL")
		eventually(moved("fencekeeper_grants_total")).Should(BeNumerically(">=", 3))
		eventually(func() float64 { return scrape().value(contended) }).Should(Equal(1.0), "W4 still waits")
		Expect(scrape().value("fencekeeper_waiters")).To(BeNumerically(">=", 1))

		By("a stale write: W1's epoch below the watermark W3 wrote")
		Expect(k8s.Create(ctx, fencedConfigMap(ns, lock, lock, w3.Status.Epoch, "v13 by W3", nil))).To(Succeed())
		err = publish(ns, lock, w1.Status.Epoch, "v11' by W1")
		Expect(lease.IsStaleEpoch(err)).To(BeTrue(), "refused as stale: %v", err)
		stale := fmt.Sprintf(`fencekeeper_admission_decisions_total{allowed="false",reason=%q}`, fkv1.AdmissionStaleEpoch)
		eventually(moved(stale)).Should(BeNumerically(">=", 1))
		Expect(moved(`fencekeeper_admission_duration_seconds_count{allowed="false"}`)()).To(BeNumerically(">=", 1))

		By("W4 leaves the queue: the lock leaves the contended locks")
		Expect(k8s.Delete(ctx, w4)).To(Succeed())
		eventually(func() bool { _, ok := scrape()[contended]; return ok }).Should(BeFalse())
	})
})

// freeLocalAddress is a 127.0.0.1 address with a port nothing listens on.
func freeLocalAddress() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().String()
}

// promSample is one scrape: series (name{label="value",...}, labels
// sorted by name) to value.
type promSample map[string]float64

func (s promSample) value(series string) float64 { return s[canonicalSeries(series)] }

func scrapeMetrics(addr string) promSample {
	s, err := tryScrapeMetrics(addr)
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	return s
}

// tryScrapeMetrics reads /metrics in the text exposition format.
func tryScrapeMetrics(addr string) (promSample, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := promSample{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("unparsable line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		out[canonicalSeries(line[:i])] = v
	}
	return out, sc.Err()
}

// canonicalSeries sorts a series' labels by name (values here never hold
// commas).
func canonicalSeries(series string) string {
	open := strings.IndexByte(series, '{')
	if open < 0 || !strings.HasSuffix(series, "}") {
		return series
	}
	labels := strings.Split(series[open+1:len(series)-1], ",")
	sort.Strings(labels)
	return series[:open] + "{" + strings.Join(labels, ",") + "}"
}

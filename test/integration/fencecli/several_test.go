package fencecli_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fencecli"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/history"
)

// syncBuffer is a bytes.Buffer safe to read while a process writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// background is the plugin running in the background.
type background struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan error
}

// startFence starts the plugin in ns, in dir, with extra environment; it
// is killed when the spec ends, whatever it did.
func startFence(ns, dir string, env []string, args ...string) *background {
	b := &background{cmd: fence(ns, args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan error, 1)}
	b.cmd.Dir = dir
	b.cmd.Env = append(os.Environ(), env...)
	b.cmd.Stdout, b.cmd.Stderr = b.stdout, b.stderr
	ExpectWithOffset(1, b.cmd.Start()).To(Succeed())
	go func() { b.done <- b.cmd.Wait() }()
	DeferCleanup(func() { _ = b.cmd.Process.Kill() })
	return b
}

// exitCode waits (at most d) for the plugin to exit and returns its code.
func (b *background) exitCode(d time.Duration, why string) int {
	var err error
	EventuallyWithOffset(1, b.done, d).Should(Receive(&err), "%s; stderr:\n%s", why, b.stderr.String())
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return 0
}

// readNanos reads a `date +%s%N` timestamp.
func readNanos(path string) time.Time {
	b, err := os.ReadFile(path)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "%q", b)
	return time.Unix(0, n)
}

// grant is a grant as the lock's Lease recorded it.
type grant struct {
	uid   types.UID
	epoch int64
}

// grantsOf are the grants the Lease versions of lock recorded, in the
// order seen, each once.
func grantsOf(h *history.History, lock string) []grant {
	var out []grant
	for _, l := range h.Leases() {
		if l.Name != lock {
			continue
		}
		led := fkv1.ReadLedger(&l, lock)
		if !led.Held() || !led.EpochValid {
			continue
		}
		g := grant{uid: led.HolderUID, epoch: led.Epoch}
		if len(out) == 0 || out[len(out)-1] != g {
			out = append(out, g)
		}
	}
	return out
}

// Several locks at once (docs/design.md §9): `kubectl fence run
// LOCK1,LOCK2 -- CMD` takes them in one order every caller shares, and the
// loss of any one ends the command and releases them all.
var _ = Describe("kubectl fence run with several locks", func() {
	var (
		ns, dir string
		h       *history.History
	)
	BeforeEach(func() {
		var err error
		ns, err = envtestutil.NewNamespace(ctx, admin, "several")
		Expect(err).NotTo(HaveOccurred())
		dir = GinkgoT().TempDir()
		h = history.Record(admin, ns)
	})

	// pendingClaim reports whether the history shows a claim of holder
	// waiting (Pending) for any lock.
	pendingClaim := func(holder string) bool {
		for _, c := range h.Claims() {
			if c.Spec.HolderIdentity == holder && c.Status.Phase == fkv1.PhasePending {
				return true
			}
		}
		return false
	}

	It("never deadlocks two runs that ask for a,b and b,a at the same time, round after round, and holds both locks for each in turn", func() {
		const rounds = 5
		// The command notes when it started and ended, and its
		// environment; it holds the locks until the test opens its gate,
		// which the test does once the other run waits for them.
		script := `date +%s%N > "$OUT.start"
echo "${FENCEKEEPER_EPOCH_DL_A-unset} ${FENCEKEEPER_EPOCH_DL_B-unset} ${FENCEKEEPER_EPOCH-unset} ${FENCEKEEPER_LOCK-unset} ${FENCEKEEPER_CLAIM-unset} $FENCEKEEPER_HOLDER" > "$OUT.env"
while [ ! -e "$GATE" ]; do sleep 0.05; done
sleep 0.2
date +%s%N > "$OUT.end"`
		runs := []struct{ who, locks string }{{"X", "dl-a,dl-b"}, {"Y", "dl-b,dl-a"}}
		type epochs struct{ a, b int64 }
		var last epochs
		for round := 1; round <= rounds; round++ {
			By(fmt.Sprintf("round %d: H holds dl-a and dl-b; X asks for dl-a,dl-b and Y for dl-b,dl-a, at the same time", round))
			// Both runs wait in the queue when H lets go of both locks at
			// once: taken in the order they are named, X would get dl-a
			// and Y dl-b, each then waiting for the other's, for ever.
			// One order for all: both wait for dl-a, and one gets both.
			var hClaims []string
			for _, lock := range []string{"dl-a", "dl-b"} {
				_, claim := epochClaim(fenceOK(ns, "acquire", lock, "--holder", fmt.Sprintf("H%d", round), "--ttl", "60s"))
				hClaims = append(hClaims, claim)
			}
			gate := filepath.Join(dir, fmt.Sprintf("gate-%d", round))
			out := func(who string) string { return filepath.Join(dir, fmt.Sprintf("r%d-%s", round, who)) }
			holder := func(who string) string { return fmt.Sprintf("%s%d", who, round) }
			started := time.Now()
			bg := map[string]*background{}
			for _, r := range runs {
				bg[r.who] = startFence(ns, dir, []string{"OUT=" + out(r.who), "GATE=" + gate},
					"run", r.locks, "--holder", holder(r.who), "--ttl", "10s", "--grace", "2s", "--", "sh", "-c", script)
			}
			for _, r := range runs {
				Eventually(func() bool { return pendingClaim(holder(r.who)) }, 20*time.Second, 20*time.Millisecond).Should(BeTrue(),
					"round %d: %s does not wait for H", round, r.who)
			}
			By("H lets go of both at once")
			for _, claim := range hClaims {
				Expect(admin.Delete(ctx, &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claim}})).To(Succeed())
			}

			By("one of them holds both locks within a bound (a deadlock fails here, it does not hang)")
			var first string
			Eventually(func() string {
				for _, r := range runs {
					if _, err := os.Stat(out(r.who) + ".start"); err == nil {
						first = r.who
						return first
					}
				}
				return ""
			}, 20*time.Second, 20*time.Millisecond).ShouldNot(BeEmpty(),
				"round %d: neither run got both locks within 20s: deadlock\nX: %s\nY: %s", round, bg["X"].stderr.String(), bg["Y"].stderr.String())
			second := "Y"
			if first == "Y" {
				second = "X"
			}
			By("the other still waits in the queue while the first holds both (the runs overlap), then the gate opens")
			Eventually(func() bool { return pendingClaim(holder(second)) }, 20*time.Second, 20*time.Millisecond).Should(BeTrue(),
				"round %d: %s never waited while %s held the locks: the runs did not overlap, the round proves nothing", round, second, first)
			Expect(os.WriteFile(gate, nil, 0o644)).To(Succeed())

			for _, who := range []string{first, second} {
				Expect(bg[who].exitCode(20*time.Second, fmt.Sprintf("round %d: %s did not finish within 20s", round, who))).
					To(Equal(0), "round %d, %s: %s", round, who, bg[who].stderr.String())
			}

			By("the commands held the locks one after the other, while both runs were running")
			s1, e1 := readNanos(out(first)+".start"), readNanos(out(first)+".end")
			s2 := readNanos(out(second) + ".start")
			Expect(started).To(BeTemporally("<", e1), "round %d: %s started after %s's command had ended", round, second, first)
			Expect(s2).To(BeTemporally(">=", e1), "round %d: both commands ran holding the locks at once", round)
			Expect(e1).To(BeTemporally(">", s1))

			By("each command saw both epochs, the second's higher, and no FENCEKEEPER_EPOCH, _LOCK or _CLAIM (several locks)")
			got := map[string]epochs{}
			for _, who := range []string{first, second} {
				env, err := os.ReadFile(out(who) + ".env")
				Expect(err).NotTo(HaveOccurred())
				f := strings.Fields(string(env))
				Expect(f).To(HaveLen(6), "%q", env)
				Expect(f[2:]).To(Equal([]string{"unset", "unset", "unset", holder(who)}))
				a, err := strconv.ParseInt(f[0], 10, 64)
				Expect(err).NotTo(HaveOccurred(), "FENCEKEEPER_EPOCH_DL_A: %q", env)
				b, err := strconv.ParseInt(f[1], 10, 64)
				Expect(err).NotTo(HaveOccurred(), "FENCEKEEPER_EPOCH_DL_B: %q", env)
				got[who] = epochs{a, b}
				Expect(bg[who].stderr.String()).To(MatchRegexp(`(?m)^kubectl-fence: holding %s/dl-a with epoch %d \(claim dl-a-[0-9a-f]{12}\), %s/dl-b with epoch %d \(claim dl-b-[0-9a-f]{12}\); running sh$`,
					ns, a, ns, b))
			}
			Expect(got[second].a).To(BeNumerically(">", got[first].a))
			Expect(got[second].b).To(BeNumerically(">", got[first].b))
			Expect(got[first].a).To(BeNumerically(">", last.a))
			Expect(got[first].b).To(BeNumerically(">", last.b))
			last = got[second]
			Eventually(func() []fkv1.FencedLease { return claimsIn(ns) }, 5*time.Second).Should(BeEmpty(), "round %d: a claim was left behind", round)
		}

		By("the Leases' history: 3 grants a round on each lock (H, then both runs), epochs rising")
		h.Complete()
		for _, lock := range []string{"dl-a", "dl-b"} {
			gs := grantsOf(h, lock)
			Expect(gs).To(HaveLen(3*rounds), "grants of %s", lock)
			for i, g := range gs {
				if i > 0 {
					Expect(g.epoch).To(BeNumerically(">", gs[i-1].epoch), "%s: grant %d", lock, i)
				}
				c := h.Last(g.uid)
				Expect(c).NotTo(BeNil())
				Expect(c.Spec.LockName).To(Equal(lock))
				round := i/3 + 1
				if i%3 == 0 {
					Expect(c.Spec.HolderIdentity).To(Equal(fmt.Sprintf("H%d", round)), "%s: grant %d", lock, i)
				} else {
					Expect(c.Spec.HolderIdentity).To(MatchRegexp(`^[XY]%d$`, round), "%s: grant %d", lock, i)
				}
			}
		}
	})

	It("ends CMD with exit 75 when one of its locks is broken, and releases the other at once: its next waiter does not wait a TTL", func() {
		script := `echo "${FENCEKEEPER_EPOCH_LEDGER_2026_07-unset} ${FENCEKEEPER_EPOCH_REPORT_2026_07-unset} ${FENCEKEEPER_EPOCH-unset}" > env.txt
echo $$ > pid.txt
trap 'echo lost > term.txt; exit 7' TERM
while true; do sleep 0.1; done`
		run := startFence(ns, dir, nil, "run", "report.2026-07,ledger-2026-07", "--holder", "W1", "--ttl", "30s", "--grace", "5s", "--", "sh", "-c", script)
		pid := commandStarted(filepath.Join(dir, "pid.txt"))
		env, err := os.ReadFile(filepath.Join(dir, "env.txt"))
		Expect(err).NotTo(HaveOccurred())
		f := strings.Fields(string(env))
		Expect(f).To(HaveLen(3))
		Expect(f[2]).To(Equal("unset"), "FENCEKEEPER_EPOCH is set with two locks")
		ledgerEpoch, err := strconv.ParseInt(f[0], 10, 64)
		Expect(err).NotTo(HaveOccurred(), "FENCEKEEPER_EPOCH_LEDGER_2026_07: %q", env)
		reportEpoch, err := strconv.ParseInt(f[1], 10, 64)
		Expect(err).NotTo(HaveOccurred(), "FENCEKEEPER_EPOCH_REPORT_2026_07: %q", env)
		w1Ledger, w1Report := h.ClaimsOf("ledger-2026-07", "W1"), h.ClaimsOf("report.2026-07", "W1")
		Expect(w1Ledger).To(HaveLen(1))
		Expect(w1Report).To(HaveLen(1))
		Expect(h.NamedWith(w1Ledger[0])).To(ContainElement(strconv.FormatInt(ledgerEpoch, 10)), "the ledger's epoch is not the one its Lease granted")
		Expect(h.NamedWith(w1Report[0])).To(ContainElement(strconv.FormatInt(reportEpoch, 10)), "the report's epoch is not the one its Lease granted")

		By("W2 waits for the ledger lock (TTL 30s: W1's hold would keep it that long)")
		w2 := startFence(ns, dir, nil, "acquire", "ledger-2026-07", "--holder", "W2", "--ttl", "30s")
		Eventually(func() bool { return pendingClaim("W2") }, 10*time.Second).Should(BeTrue())

		By("an operator breaks the report lock")
		fenceOK(ns, "break", "report.2026-07", "--reason", "one lock of a set")
		broken := time.Now()

		By("CMD is signalled, run exits 75, and W2 is granted the ledger within seconds, with the next epoch")
		Expect(run.exitCode(15*time.Second, "run did not end after one of its locks was broken")).To(Equal(fencecli.ExitLeaseLost))
		Expect(os.ReadFile(filepath.Join(dir, "term.txt"))).To(Equal([]byte("lost\n")))
		Expect(w2.exitCode(10*time.Second, "W2 was not granted the ledger lock")).To(Equal(0), w2.stderr.String())
		Expect(time.Since(broken)).To(BeNumerically("<", 10*time.Second), "W2 waited for the ledger until %v after the break", time.Since(broken))
		w2Epoch, _ := epochClaim(w2.stdout.String())
		Expect(w2Epoch).To(Equal(ledgerEpoch + 1))

		By("run said which lock was lost, what it did, and that it released the other")
		stderr := run.stderr.String()
		Expect(stderr).To(MatchRegexp(`(?m)^kubectl-fence: holding %s/ledger-2026-07 with epoch %d \(claim ledger-2026-07-[0-9a-f]{12}\), %s/report\.2026-07 with epoch %d \(claim report\.2026-07-[0-9a-f]{12}\); running sh$`,
			ns, ledgerEpoch, ns, reportEpoch))
		Expect(stderr).To(MatchRegexp(`(?m)^kubectl-fence: lease on %s/report\.2026-07 lost \(epoch %d, now free\); sending SIGTERM to %d \(sh\)( and 1 process below it)?$`, ns, reportEpoch, pid))
		Expect(stderr).To(ContainSubstring("kubectl-fence: released %s/ledger-2026-07, %s/report.2026-07\n", ns, ns))
		Expect(stderr).To(ContainSubstring("kubectl-fence: sh exited with status 7 after the lease was lost; exit code %d (lease lost)\n", fencecli.ExitLeaseLost))

		By("the history: the report claim was broken (run may delete it before its status shows it); the ledger claim was released, never expired; the ledger's Lease went to W2")
		broke := false
		for _, c := range h.Claims() {
			switch c.UID {
			case w1Report[0]:
				if c.Annotations[fkv1.AnnotationBrokenBy] != "" {
					broke = true
				}
				if c.Status.Phase == fkv1.PhaseExpired {
					Expect(meta.FindStatusCondition(c.Status.Conditions, fkv1.ConditionHeld).Reason).To(Equal(fkv1.ReasonForcedRelease))
				}
			case w1Ledger[0]:
				Expect(c.Status.Phase).NotTo(Equal(fkv1.PhaseExpired), "the ledger claim expired instead of being released")
			}
		}
		Expect(broke).To(BeTrue(), "no version of the report claim shows the break")
		w2Claims := h.ClaimsOf("ledger-2026-07", "W2")
		Expect(w2Claims).To(HaveLen(1))
		Expect(h.NamedWith(w2Claims[0])).To(ContainElement(strconv.FormatInt(ledgerEpoch+1, 10)))
		Eventually(func() []string {
			var names []string
			for _, c := range claimsIn(ns) {
				if c.Spec.HolderIdentity == "W1" {
					names = append(names, c.Name)
				}
			}
			return names
		}, 5*time.Second).Should(BeEmpty(), "run left a claim behind")
		h.Complete()
	})

	It("takes a set with --no-wait or not at all: one lock taken, nothing runs, nothing is left held", func() {
		hEpoch, _ := epochClaim(fenceOK(ns, "acquire", "nw-b", "--holder", "H", "--ttl", "60s"))
		ran := filepath.Join(dir, "ran")
		code, _, stderr := fenceExit(ns, nil, "run", "nw-b,nw-a", "--holder", "W1", "--no-wait", "--", "touch", ran)
		Expect(code).To(Equal(fencecli.ExitNotAcquired), stderr)
		Expect(stderr).To(Equal(fmt.Sprintf("error: lock %s/nw-b not granted at once (--no-wait): held by H with epoch %d; the claim left the queue; lock %s/nw-a, taken before it, was released\n",
			ns, hEpoch, ns)))
		Expect(ran).NotTo(BeAnExistingFile())
		w1a := h.ClaimsOf("nw-a", "W1")
		Expect(w1a).To(HaveLen(1))
		Expect(h.NamedWith(w1a[0])).NotTo(BeEmpty(), "nw-a, first in the order, was never taken")
		Eventually(func() int { return len(claimsIn(ns)) }, 5*time.Second).Should(Equal(1), "a claim was left behind")
		h.Complete()
	})
})

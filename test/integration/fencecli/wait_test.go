package fencecli_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fencecli"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/history"
)

// epochClaim parses acquire's "EPOCH CLAIM".
func epochClaim(out string) (int64, string) {
	words := strings.Fields(out)
	ExpectWithOffset(1, words).To(HaveLen(2), "acquire printed %q", out)
	e, err := strconv.ParseInt(words[0], 10, 64)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return e, words[1]
}

// Bounded waits from the command line (docs/holders.md): --wait is the
// claim's acquireTimeoutSeconds, so a killed command's claim ends on the
// server; --no-wait tries once; both exit ExitNotAcquired when not granted.
var _ = Describe("kubectl fence --wait and --no-wait", func() {
	var (
		ns string
		h  *history.History
	)
	BeforeEach(func() {
		var err error
		ns, err = envtestutil.NewNamespace(ctx, admin, "bounded")
		Expect(err).NotTo(HaveOccurred())
		h = history.Record(admin, ns)
	})

	// onlyClaim is the UID of the one claim of lock by holder seen so far.
	onlyClaim := func(lock, holder string) func() types.UID {
		return func() types.UID {
			if uids := h.ClaimsOf(lock, holder); len(uids) == 1 {
				return uids[0]
			}
			return ""
		}
	}
	// queued: the authority has observed the claim (its status is written).
	queued := func(uid types.UID) func() fkv1.FencedLeasePhase {
		return func() fkv1.FencedLeasePhase {
			if c := h.Last(uid); c != nil {
				return c.Status.Phase
			}
			return ""
		}
	}

	It("a waiter killed with SIGKILL never holds the lock, and the waiter behind it is granted at the release, not a TTL later", func() {
		By("H holds the lock with a 60s TTL")
		hEpoch, hClaim := epochClaim(fenceOK(ns, "acquire", "crash", "--holder", "H", "--ttl", "60s"))

		By("W2 waits with --wait 3s (and the 60s TTL a dead holder would keep the lock for)")
		w2 := fence(ns, "acquire", "crash", "--holder", "W2", "--ttl", "60s", "--wait", "3s")
		Expect(w2.Start()).To(Succeed())
		w2Started := time.Now()
		DeferCleanup(func() { _ = w2.Process.Kill() })
		Eventually(onlyClaim("crash", "W2"), 10*time.Second, 10*time.Millisecond).ShouldNot(BeEmpty())
		w2UID := onlyClaim("crash", "W2")()
		Eventually(queued(w2UID), 10*time.Second, 10*time.Millisecond).Should(Equal(fkv1.PhasePending))

		By("W3 queues behind W2, with no deadline")
		// The queue is ordered by creationTimestamp (whole seconds), then
		// name: W3's claim is made in a later second than W2's.
		time.Sleep(time.Until(h.Last(w2UID).CreationTimestamp.Add(1100 * time.Millisecond)))
		w3 := fence(ns, "acquire", "crash", "--holder", "W3", "--ttl", "30s")
		var w3Out, w3Err bytes.Buffer
		w3.Stdout, w3.Stderr = &w3Out, &w3Err
		Expect(w3.Start()).To(Succeed())
		DeferCleanup(func() { _ = w3.Process.Kill() })
		w3Done := make(chan error, 1)
		go func() { w3Done <- w3.Wait() }()
		Eventually(onlyClaim("crash", "W3"), 10*time.Second, 10*time.Millisecond).ShouldNot(BeEmpty())
		w3UID := onlyClaim("crash", "W3")()
		Eventually(queued(w3UID), 10*time.Second, 10*time.Millisecond).Should(Equal(fkv1.PhasePending))
		Expect(meta.FindStatusCondition(h.Last(w3UID).Status.Conditions, fkv1.ConditionHeld).Reason).To(Equal(fkv1.ReasonQueued),
			"W3 is not behind W2")

		By("W2 is killed with SIGKILL: it can neither leave the queue nor renew")
		Expect(w2.Process.Signal(syscall.SIGKILL)).To(Succeed())
		err := w2.Wait()
		var ee *exec.ExitError
		Expect(errors.As(err, &ee)).To(BeTrue(), "%v", err)
		Expect(ee.Sys().(syscall.WaitStatus).Signal()).To(Equal(syscall.SIGKILL))

		By("H releases once W2's deadline has passed (the authority's record of it, or 5s past it at most)")
		deadline := w2Started.Add(3 * time.Second)
		for !h.ListedTimedOut(w2UID) && time.Now().Before(deadline.Add(5*time.Second)) {
			time.Sleep(50 * time.Millisecond)
		}
		Expect(time.Now()).To(BeTemporally(">=", deadline))
		fenceOK(ns, "release", hClaim)
		released := time.Now()

		By("W3 is granted within seconds of the release, with the next epoch: W2 took none")
		Eventually(w3Done, 10*time.Second).Should(Receive(&err), "W3 was not granted within 10s of the release")
		Expect(err).NotTo(HaveOccurred(), w3Err.String())
		took := time.Since(released)
		Expect(took).To(BeNumerically("<", 5*time.Second), "W3 waited %v after the release (W2's TTL was 60s)", took)
		w3Epoch, _ := epochClaim(w3Out.String())
		Expect(w3Epoch).To(Equal(hEpoch+1), "W2 took an epoch")

		By("W2's claim ended AcquireTimeout with no epoch, was never Held, and no Lease version named it")
		Eventually(func() bool { return h.EverTimedOut(w2UID) }, 5*time.Second).Should(BeTrue())
		last := h.Last(w2UID)
		Expect(last.Spec.AcquireTimeoutSeconds).To(Equal(ptr.To[int32](3)), "--wait 3s is acquireTimeoutSeconds 3")
		Expect(last.Status.Phase).To(Equal(fkv1.PhaseExpired))
		Expect(meta.FindStatusCondition(last.Status.Conditions, fkv1.ConditionHeld).Reason).To(Equal(fkv1.ReasonAcquireTimeout))
		Expect(last.Status.Epoch).To(BeZero())
		Expect(h.EverHeld(w2UID)).To(BeFalse(), "the killed waiter was Held")
		Expect(h.ListedTimedOut(w2UID)).To(BeTrue(), "the Lease never recorded the timeout")
		Expect(h.NamedWith(w2UID)).To(BeEmpty(), "a Lease version named the killed waiter")
		h.Complete()
	})

	It("--no-wait exits 73 on a held lock leaving no claim, is granted at once on a free one; --wait runs out with 73 too; run --no-wait does not run COMMAND", func() {
		hEpoch, hClaim := epochClaim(fenceOK(ns, "acquire", "busy", "--holder", "H", "--ttl", "60s"))

		By("acquire --no-wait on the held lock")
		start := time.Now()
		code, stdout, stderr := fenceExit(ns, nil, "acquire", "busy", "--holder", "W2", "--no-wait")
		took := time.Since(start)
		Expect(code).To(Equal(fencecli.ExitNotAcquired), stderr)
		Expect(stdout).To(BeEmpty())
		Expect(stderr).To(Equal("error: lock " + ns + "/busy not granted at once (--no-wait): held by H with epoch " +
			strconv.FormatInt(hEpoch, 10) + "; the claim left the queue\n"))
		Expect(took).To(BeNumerically("<", 5*time.Second))
		Expect(claimsIn(ns)).To(HaveLen(1), "a claim was left behind")
		w2 := onlyClaim("busy", "W2")()
		Expect(h.Last(w2).Spec.AcquireTimeoutSeconds).To(Equal(ptr.To[int32](0)))
		Expect(h.ListedTimedOut(w2)).To(BeTrue())
		Expect(h.EverHeld(w2)).To(BeFalse())
		Expect(h.NamedWith(w2)).To(BeEmpty())

		By("run --no-wait on the held lock: COMMAND never runs")
		dir := GinkgoT().TempDir()
		ran := filepath.Join(dir, "ran")
		code, _, stderr = fenceExit(ns, nil, "run", "busy", "--holder", "W3", "--no-wait", "--", "touch", ran)
		Expect(code).To(Equal(fencecli.ExitNotAcquired), stderr)
		Expect(stderr).To(ContainSubstring("not granted at once (--no-wait): held by H"))
		Expect(ran).NotTo(BeAnExistingFile())
		Expect(claimsIn(ns)).To(HaveLen(1), "a claim was left behind")

		By("acquire --wait 1s on the held lock: 73 after the deadline, no claim left")
		start = time.Now()
		code, _, stderr = fenceExit(ns, nil, "acquire", "busy", "--holder", "W4", "--wait", "1s")
		took = time.Since(start)
		Expect(code).To(Equal(fencecli.ExitNotAcquired), stderr)
		Expect(stderr).To(ContainSubstring("error: lock %s/busy not granted within --wait 1s: held by H with epoch %d; the claim left the queue", ns, hEpoch))
		Expect(took).To(BeNumerically(">=", time.Second))
		Expect(claimsIn(ns)).To(HaveLen(1), "a claim was left behind")
		Expect(h.Last(onlyClaim("busy", "W4")()).Spec.AcquireTimeoutSeconds).To(Equal(ptr.To[int32](1)))

		By("released, the lock is granted at once to --no-wait, and to run --no-wait, with the next epochs")
		fenceOK(ns, "release", hClaim)
		Eventually(func() int { return len(claimsIn(ns)) }, 5*time.Second).Should(BeZero())
		e, claim := epochClaim(fenceOK(ns, "acquire", "busy", "--holder", "W5", "--no-wait"))
		Expect(e).To(Equal(hEpoch+1), "a timed-out claim took an epoch")
		w5Phase := func() fkv1.FencedLeasePhase { return h.Last(onlyClaim("busy", "W5")()).Status.Phase }
		// The grant is the Lease: the claim's status may show it a moment later.
		Eventually(w5Phase, 5*time.Second).Should(Equal(fkv1.PhaseHeld))
		Consistently(w5Phase, time.Second).Should(Equal(fkv1.PhaseHeld), "a granted try-once claim must stay Held")
		fenceOK(ns, "release", claim)
		code, stdout, stderr = fenceExit(ns, nil, "run", "busy", "--holder", "W6", "--no-wait", "--", "sh", "-c", `echo "epoch=$FENCEKEEPER_EPOCH"`)
		Expect(code).To(Equal(0), stderr)
		Expect(stdout).To(Equal("epoch=" + strconv.FormatInt(hEpoch+2, 10) + "\n"))
		h.Complete()
		_ = os.Remove(ran)
	})
})

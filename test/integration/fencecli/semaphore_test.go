package fencecli_test

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/history"
)

// Semaphore locks from the command line (docs/design.md §9): acquire
// --max-holders N takes a permit of its own; status lists every permit
// with its epoch and holder; break must be told which permit to end and
// ends that one only, and the next waiter is granted.
var _ = Describe("kubectl fence with a semaphore lock", func() {
	var (
		ns string
		h  *history.History
	)
	BeforeEach(func() {
		var err error
		ns, err = envtestutil.NewNamespace(ctx, admin, "semaphore")
		Expect(err).NotTo(HaveOccurred())
		h = history.Record(admin, ns)
	})

	claimNamed := func(name string) fkv1.FencedLease {
		var c fkv1.FencedLease
		ExpectWithOffset(1, admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &c)).To(Succeed())
		return c
	}

	It("acquires three permits with --max-holders 3, shows each in status, refuses a break that names none, and breaks the one --epoch names for the next waiter", func() {
		const lock = "warehouse-load"
		By("three acquires, each a permit of its own with an epoch of its own, at once")
		type permit struct {
			holder, claim string
			epoch         int64
		}
		var permits []permit
		for _, who := range []string{"loader-a", "loader-b", "loader-c"} {
			epoch, claim := epochClaim(fenceOK(ns, "acquire", lock, "--holder", who, "--ttl", "60s", "--max-holders", "3", "--wait", "20s"))
			for _, p := range permits {
				Expect(epoch).NotTo(Equal(p.epoch), "%s was given %s's epoch", who, p.holder)
			}
			permits = append(permits, permit{holder: who, claim: claim, epoch: epoch})
		}
		for _, p := range permits {
			c := claimNamed(p.claim)
			Expect(c.Status.Phase).To(Equal(fkv1.PhaseHeld), "claim %s", p.claim)
			Expect(c.Status.Epoch).To(Equal(p.epoch), "claim %s", p.claim)
		}

		By("a fourth waits: the lock has three permits")
		fourth := startFence(ns, GinkgoT().TempDir(), nil, "acquire", lock, "--holder", "loader-d", "--ttl", "60s", "--max-holders", "3")
		Eventually(func() fkv1.FencedLeasePhase {
			for _, c := range claimsIn(ns) {
				if c.Spec.HolderIdentity == "loader-d" {
					return c.Status.Phase
				}
			}
			return ""
		}, 10*time.Second, 50*time.Millisecond).Should(Equal(fkv1.PhasePending))
		Consistently(fourth.done, 2*time.Second).ShouldNot(Receive(), "the fourth acquire returned while three permits are live: %s", fourth.stdout.String())

		By("status LOCK: the holder column counts the permits, and a line per permit gives its epoch, holder and claim; the waiter is queued")
		status := fenceOK(ns, "status", lock)
		Expect(status).To(MatchRegexp(`(?m)^%s\s+<3 of 3 permits>\s+%d\s+-\s+-\s+1 waiting \[loader-d\]`, lock, permits[2].epoch), status)
		Expect(status).To(ContainSubstring("\n%s: 3 of 3 permits held\n", lock))
		for _, p := range permits {
			Expect(status).To(MatchRegexp(`(?m)^  %d\s+%s\s+%s\s+\S+\s+\S+\s+\S+$`, p.epoch, regexp.QuoteMeta(p.holder), regexp.QuoteMeta(p.claim)), status)
		}
		Expect(regexp.MustCompile(`(?m)^  \d+\s+loader-`).FindAllString(status, -1)).To(HaveLen(3), status)

		By("break LOCK without --epoch or --claim refuses, listing the permits, and breaks nothing")
		code, stdout, stderr := fenceExit(ns, nil, "break", lock, "--reason", "which one?")
		Expect(code).NotTo(Equal(0), "break without --epoch on a semaphore: %s", stdout)
		Expect(stderr).To(ContainSubstring("lock %s/%s is a semaphore (capacity 3) with 3 live permits: say which to break with --epoch E or --claim NAME", ns, lock))
		for _, p := range permits {
			Expect(stderr).To(ContainSubstring("epoch %d  holder %s  claim %s", p.epoch, p.holder, p.claim))
		}
		for _, p := range permits {
			c := claimNamed(p.claim)
			Expect(c.Annotations).NotTo(HaveKey(fkv1.AnnotationBreakReason), "claim %s", p.claim)
		}
		Consistently(func() []fkv1.FencedLeasePhase {
			var out []fkv1.FencedLeasePhase
			for _, p := range permits {
				out = append(out, claimNamed(p.claim).Status.Phase)
			}
			return out
		}, 2*time.Second, 100*time.Millisecond).Should(HaveEach(fkv1.PhaseHeld))

		By("break LOCK --epoch E ends that permit only: its claim Expired with ForcedRelease")
		broken, kept := permits[1], []permit{permits[0], permits[2]}
		out := fenceOK(ns, "break", lock, "--epoch", fmt.Sprint(broken.epoch), "--reason", "loader-b stuck")
		Expect(out).To(HavePrefix(fmt.Sprintf("broke lock %s/%s: claim %s (holder %s, epoch %d) ended: %s: ", ns, lock, broken.claim, broken.holder, broken.epoch, fkv1.ReasonForcedRelease)))
		ended := claimNamed(broken.claim)
		Expect(ended.Status.Phase).To(Equal(fkv1.PhaseExpired))
		Expect(ended.Status.Epoch).To(Equal(broken.epoch))
		Expect(meta.FindStatusCondition(ended.Status.Conditions, fkv1.ConditionHeld).Reason).To(Equal(fkv1.ReasonForcedRelease))

		By("the next waiter is granted the next epoch; the other two keep theirs")
		Expect(fourth.exitCode(15*time.Second, "the fourth acquire was not granted after a permit was broken")).To(Equal(0), fourth.stderr.String())
		dEpoch, dClaim := epochClaim(fourth.stdout.String())
		Expect(dEpoch).To(Equal(permits[2].epoch + 1))
		for _, p := range kept {
			c := claimNamed(p.claim)
			Expect(c.Status.Phase).To(Equal(fkv1.PhaseHeld), "claim %s", p.claim)
			Expect(c.Status.Epoch).To(Equal(p.epoch), "claim %s", p.claim)
		}
		status = fenceOK(ns, "status", lock)
		var listed []string
		for _, m := range regexp.MustCompile(`(?m)^  (\d+)\s+(\S+)\s+(\S+)\s`).FindAllStringSubmatch(status, -1) {
			listed = append(listed, strings.Join(m[1:], " "))
		}
		Expect(listed).To(ConsistOf(
			fmt.Sprintf("%d %s %s", permits[0].epoch, permits[0].holder, permits[0].claim),
			fmt.Sprintf("%d %s %s", permits[2].epoch, permits[2].holder, permits[2].claim),
			fmt.Sprintf("%d loader-d %s", dEpoch, dClaim)), status)

		By("the history: never more than three claims of the lock Held at once")
		h.Complete()
		held := map[types.UID]bool{}
		for _, c := range h.Claims() {
			if c.Spec.LockName != lock {
				continue
			}
			held[c.UID] = c.Status.Phase == fkv1.PhaseHeld
			n := 0
			for _, v := range held {
				if v {
					n++
				}
			}
			Expect(n).To(BeNumerically("<=", 3), "claims Held at once")
		}
	})
})

package fencecli_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fencecli"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

func fence(ns string, args ...string) *exec.Cmd { return fenceWith(kubeconfig, ns, args...) }

// fenceWith is the plugin run with a given user's kubeconfig.
func fenceWith(kubeconfig, ns string, args ...string) *exec.Cmd {
	return exec.Command(plugin, append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...)...)
}

// fenceExit runs the plugin with extra environment and returns its exit
// code and output.
func fenceExit(ns string, env []string, args ...string) (int, string, string) {
	return runFence(fence(ns, args...), env)
}

// fenceAs runs the plugin as another user (its kubeconfig).
func fenceAs(kubeconfig, ns string, args ...string) (int, string, string) {
	return runFence(fenceWith(kubeconfig, ns, args...), nil)
}

func runFence(cmd *exec.Cmd, env []string) (int, string, string) {
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return 0, stdout.String(), stderr.String()
}

func claimsIn(ns string) []fkv1.FencedLease {
	var list fkv1.FencedLeaseList
	ExpectWithOffset(1, admin.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	return list.Items
}

var _ = Describe("kubectl fence", func() {
	var ns, dir string
	BeforeEach(func() {
		var err error
		ns, err = envtestutil.NewNamespace(ctx, admin, "plugin")
		Expect(err).NotTo(HaveOccurred())
		dir = GinkgoT().TempDir()
	})

	It("runs CMD holding the lock with the epoch in its environment, signals it on loss, and releases when it exits", func() {
		script := `echo "$FENCEKEEPER_EPOCH $FENCEKEEPER_LOCK $FENCEKEEPER_HOLDER $FENCEKEEPER_CLAIM" > env.txt
echo $$ > pid.txt
trap 'echo lost > term.txt; exit 7' TERM
while true; do sleep 0.1; done`
		run := fence(ns, "run", "report-2026-07", "--holder", "W1", "--ttl", "5s", "--grace", "5s", "--", "sh", "-c", script)
		run.Dir = dir
		var stderr bytes.Buffer
		run.Stderr = &stderr
		Expect(run.Start()).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- run.Wait() }()

		Eventually(func() string { b, _ := os.ReadFile(filepath.Join(dir, "env.txt")); return string(b) }, 30*time.Second).
			Should(MatchRegexp(`^[1-9][0-9]* report-2026-07 W1 report-2026-07-[0-9a-f]{12}\n$`))
		Expect(claimsIn(ns)).To(HaveLen(1))

		By("status shows the holder and the queue")
		w := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w2"},
			Spec: fkv1.FencedLeaseSpec{LockName: "report-2026-07", HolderIdentity: "W2"}}
		Expect(admin.Create(ctx, w)).To(Succeed())
		Eventually(func() string {
			out, _ := fence(ns, "status", "report-2026-07").Output()
			return string(out)
		}, 10*time.Second).Should(MatchRegexp(`report-2026-07\s+W1\s+[1-9][0-9]*\s+~\d+s\s+~\d+s\s+1 waiting \[W2\]\s+~\d+s`))
		By("and -o json has the queue length, the oldest wait and how long the holder has held")
		js, err := fence(ns, "status", "report-2026-07", "-o", "json").Output()
		Expect(err).NotTo(HaveOccurred())
		var st []map[string]any
		Expect(json.Unmarshal(js, &st)).To(Succeed(), string(js))
		Expect(st).To(HaveLen(1))
		Expect(st[0]).To(HaveKeyWithValue("queueLength", BeEquivalentTo(1)))
		Expect(st[0]).To(HaveKeyWithValue("oldestWait", MatchRegexp(`^~\d+s$`)))
		Expect(st[0]).To(HaveKeyWithValue("heldFor", MatchRegexp(`^~\d+s$`)))

		By("the lease is lost: someone deletes the claim")
		Expect(admin.DeleteAllOf(ctx, &fkv1.FencedLease{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": claimsIn(ns)[0].Name})).To(Succeed())
		Eventually(done, 30*time.Second).Should(Receive(&err))
		Expect(err).To(HaveOccurred())
		var ee *exec.ExitError
		Expect(errors.As(err, &ee)).To(BeTrue())
		Expect(ee.ExitCode()).To(Equal(fencecli.ExitLeaseLost), "run exits with its own code for a lost lease; stderr: %s", stderr.String())
		Expect(os.ReadFile(filepath.Join(dir, "term.txt"))).To(Equal([]byte("lost\n")))
		By("run says who holds the lock now, the signal by its name, and what CMD exited with")
		envLine, err := os.ReadFile(filepath.Join(dir, "env.txt"))
		Expect(err).NotTo(HaveOccurred())
		epoch, err := strconv.ParseInt(strings.Fields(string(envLine))[0], 10, 64)
		Expect(err).NotTo(HaveOccurred())
		pid, err := os.ReadFile(filepath.Join(dir, "pid.txt"))
		Expect(err).NotTo(HaveOccurred())
		Expect(stderr.String()).To(MatchRegexp(`(?m)^kubectl-fence: lease on %s/report-2026-07 lost \(epoch %d, now held by W2 with epoch %d\); sending SIGTERM to %s \(sh\)( and 1 process below it)?$`,
			ns, epoch, epoch+1, strings.TrimSpace(string(pid))))
		Expect(stderr.String()).To(ContainSubstring("kubectl-fence: sh exited with status 7 after the lease was lost; exit code %d (lease lost)\n", fencecli.ExitLeaseLost))
		Expect(stderr.String()).NotTo(ContainSubstring("terminated"))
	})

	It("waits, without spinning, through the grace period of a CMD that ignores the loss signal, then kills it", func() {
		run := fence(ns, "run", "ignores-term", "--holder", "W1", "--ttl", "5s", "--grace", "4s", "--",
			"sh", "-c", `echo $$ > started.txt; trap '' TERM; while true; do sleep 0.1; done`)
		run.Dir = dir
		logPath := filepath.Join(dir, "run.log")
		logFile, err := os.Create(logPath)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(logFile.Close)
		run.Stderr = logFile
		Expect(run.Start()).To(Succeed())
		DeferCleanup(func() { _ = run.Process.Kill() })
		done := make(chan error, 1)
		go func() { done <- run.Wait() }()
		commandStarted(filepath.Join(dir, "started.txt")) // it ignores SIGTERM

		By("the lease is lost (nobody waits: the lock is free); CMD ignores the signal")
		Expect(admin.DeleteAllOf(ctx, &fkv1.FencedLease{}, client.InNamespace(ns))).To(Succeed())
		Eventually(func() string { b, _ := os.ReadFile(logPath); return string(b) }, 10*time.Second).
			Should(MatchRegexp(`lease on %s/ignores-term lost \(epoch [1-9][0-9]*, now free\); sending SIGTERM to [1-9][0-9]* \(sh\)`, ns))

		By("during the grace period run waits: it uses next to no CPU (a loop on a closed channel takes a whole core)")
		start := cpuTicks(run.Process.Pid)
		time.Sleep(2 * time.Second)
		used := cpuTicks(run.Process.Pid) - start
		Expect(used).To(BeNumerically("<", 50), "run used %d clock ticks (1/100 s) of CPU in 2 s after the loss", used)

		By("then CMD is killed and run exits with the code for a lost lease, saying how CMD ended")
		Eventually(done, 10*time.Second).Should(Receive(&err))
		var ee *exec.ExitError
		Expect(errors.As(err, &ee)).To(BeTrue(), "%v", err)
		Expect(ee.ExitCode()).To(Equal(fencecli.ExitLeaseLost))
		Expect(os.ReadFile(logPath)).To(ContainSubstring("kubectl-fence: sh was ended by SIGKILL after the lease was lost; exit code %d (lease lost)", fencecli.ExitLeaseLost))
	})

	It("on loss, signals what CMD started too, and kills what outlives the grace period before exiting", func() {
		// A script that starts two programs and waits: one stops on SIGTERM,
		// one ignores it and, after the loss, starts another program. The
		// script itself dies of the signal at once.
		for name, body := range map[string]string{
			"tree.sh":    "sh stops.sh &\nsh ignores.sh &\nwait\n",
			"stops.sh":   "echo $$ > stops.pid; trap 'echo term > stops.txt; exit 0' TERM; while true; do sleep 0.1; done\n",
			"ignores.sh": "echo $$ > ignores.pid; trap '' TERM; while [ ! -e stops.txt ]; do sleep 0.1; done; sleep 0.5; sh late.sh\n",
			"late.sh":    "echo $$ > late.pid; while true; do sleep 0.1; done\n",
		} {
			Expect(os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)).To(Succeed())
		}
		run := fence(ns, "run", "tree", "--holder", "W1", "--ttl", "5s", "--grace", "2s", "--", "sh", "tree.sh")
		run.Dir = dir
		Expect(run.Start()).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- run.Wait() }()
		commandStarted(filepath.Join(dir, "stops.pid"))
		ignores := commandStarted(filepath.Join(dir, "ignores.pid"))

		By("the lease is lost")
		Expect(admin.DeleteAllOf(ctx, &fkv1.FencedLease{}, client.InNamespace(ns))).To(Succeed())
		Eventually(func() string { b, _ := os.ReadFile(filepath.Join(dir, "stops.txt")); return string(b) }, 10*time.Second).
			Should(Equal("term\n"), "a program the command started got no signal")
		late := commandStarted(filepath.Join(dir, "late.pid"))
		var err error
		Eventually(done, 15*time.Second).Should(Receive(&err))
		var ee *exec.ExitError
		Expect(errors.As(err, &ee)).To(BeTrue(), "%v", err)
		Expect(ee.ExitCode()).To(Equal(fencecli.ExitLeaseLost), "the lease was lost (the script died of SIGTERM)")
		Expect(processRunning(ignores)).To(BeFalse(), "run exited while a program its command started, holding the old epoch, still ran")
		Expect(processRunning(late)).To(BeFalse(), "run exited while a program started after the loss, holding the old epoch, still ran")
	})

	It("signals CMD when run itself is killed", func() {
		run := fence(ns, "run", "run-killed", "--holder", "W1", "--", "sh", "-c",
			`echo $$ > pid.txt; trap 'echo term > term.txt; exit 0' TERM; while true; do sleep 0.1; done`)
		run.Dir = dir
		Expect(run.Start()).To(Succeed())
		commandStarted(filepath.Join(dir, "pid.txt"))

		Expect(run.Process.Kill()).To(Succeed())
		_ = run.Wait()
		Eventually(func() string { b, _ := os.ReadFile(filepath.Join(dir, "term.txt")); return string(b) }, 10*time.Second).
			Should(Equal("term\n"), "the command works on after run, which renewed its lease, was killed")
	})

	It("releases the lock when CMD exits and passes its exit code through", func() {
		run := fence(ns, "run", "batch", "--holder", "job-1", "--", "sh", "-c", "echo $FENCEKEEPER_EPOCH > first.txt; test -n \"$FENCEKEEPER_EPOCH\" && exit 3")
		run.Dir = dir
		err := run.Run()
		Expect(err).To(HaveOccurred())
		var ee *exec.ExitError
		Expect(errors.As(err, &ee)).To(BeTrue())
		Expect(ee.ExitCode()).To(Equal(3))
		Eventually(func() []fkv1.FencedLease { return claimsIn(ns) }, 10*time.Second).Should(BeEmpty())

		first, err := os.ReadFile(filepath.Join(dir, "first.txt"))
		Expect(err).NotTo(HaveOccurred())
		e1, err := strconv.ParseInt(strings.TrimSpace(string(first)), 10, 64)
		Expect(err).NotTo(HaveOccurred())
		out, err := fence(ns, "run", "batch", "--holder", "job-2", "--", "sh", "-c", "echo epoch=$FENCEKEEPER_EPOCH").Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(Equal(fmt.Sprintf("epoch=%d\n", e1+1)))
	})

	It("acquires and prints the epoch and the claim, as JSON too, and releases by claim name", func() {
		out, err := fence(ns, "acquire", "report", "--holder", "W1", "--ttl", "60s").Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(MatchRegexp(`^[1-9][0-9]* report-[0-9a-f]{12}\n$`), "acquire prints EPOCH CLAIM")
		words := strings.Fields(string(out))
		e1, err := strconv.ParseInt(words[0], 10, 64)
		Expect(err).NotTo(HaveOccurred(), "the epoch stays the first word")
		Expect(claimsIn(ns)).To(HaveLen(1))
		claim := claimsIn(ns)[0].Name
		Expect(words[1]).To(Equal(claim))

		By("a second holder times out in the queue and leaves it")
		code, _, stderr := fenceExit(ns, nil, "acquire", "report", "--holder", "W2", "--wait", "1s")
		Expect(code).To(Equal(fencecli.ExitNotAcquired), stderr)
		Expect(stderr).To(ContainSubstring("not granted within --wait 1s: held by W1 with epoch %d; the claim left the queue", e1))
		Expect(claimsIn(ns)).To(HaveLen(1))

		out, err = fence(ns, "release", words[1]).Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(Equal(fmt.Sprintf("released %s/%s (lock report, epoch %d)\n", ns, claim, e1)))

		out, err = fence(ns, "acquire", "report", "--holder", "W3", "-o", "json").Output()
		Expect(err).NotTo(HaveOccurred())
		var r map[string]any
		Expect(json.Unmarshal(out, &r)).To(Succeed())
		Expect(r).To(HaveKeyWithValue("epoch", BeNumerically("==", e1+1)))
		Expect(r).To(HaveKeyWithValue("holder", "W3"))
		Expect(r).To(HaveKeyWithValue("lock", "report"))
		Expect(r).To(HaveKeyWithValue("namespace", ns))
		Expect(r).To(HaveKeyWithValue("claim", claimsIn(ns)[0].Name))
	})

	It("releases by --lock and --holder, finds the default holder's claim, and fails clearly or not at all when nothing is left", func() {
		By("a claim with a request ID: its name does not follow from the lock and holder alone")
		out, err := fence(ns, "acquire", "report", "--holder", "W1", "--request-id", "monthly", "--ttl", "60s").Output()
		Expect(err).NotTo(HaveOccurred())
		claim := strings.Fields(string(out))[1]
		Expect(claim).To(Equal(lease.ClaimName("report", "W1", "monthly")))
		code, stdout, stderr := fenceExit(ns, nil, "release", "--lock", "report", "--holder", "W1")
		Expect(code).To(Equal(0), stderr)
		Expect(stdout).To(HavePrefix(fmt.Sprintf("released %s/%s (lock report, epoch ", ns, claim)))
		Eventually(func() []fkv1.FencedLease { return claimsIn(ns) }, 5*time.Second).Should(BeEmpty())

		By("a second release fails, naming what it looked for, unless --ignore-not-found")
		code, stdout, stderr = fenceExit(ns, nil, "release", "--lock", "report", "--holder", "W1")
		Expect(code).To(Equal(1))
		Expect(stdout).To(BeEmpty())
		Expect(stderr).To(ContainSubstring(`no claim of lock %s/report by holder "W1" (already released?)`, ns))
		Expect(stderr).To(ContainSubstring("--ignore-not-found"))
		code, stdout, stderr = fenceExit(ns, nil, "release", "--lock", "report", "--holder", "W1", "--ignore-not-found")
		Expect(code).To(Equal(0), stderr)
		Expect(stdout + stderr).To(BeEmpty())
		code, _, stderr = fenceExit(ns, nil, "release", claim)
		Expect(code).To(Equal(1))
		Expect(stderr).To(ContainSubstring("no claim %s/%s (already released?)", ns, claim))
		Expect(stderr).To(ContainSubstring("--ignore-not-found"))
		code, _, stderr = fenceExit(ns, nil, "release", claim, "--ignore-not-found")
		Expect(code).To(Equal(0), stderr)

		By("without --holder, acquire and release agree on the holder: $POD_NAME")
		pod := []string{"POD_NAME=report-worker-7f9c"}
		code, stdout, stderr = fenceExit(ns, pod, "acquire", "report", "-o", "json")
		Expect(code).To(Equal(0), stderr)
		var r map[string]any
		Expect(json.Unmarshal([]byte(stdout), &r)).To(Succeed())
		Expect(r).To(HaveKeyWithValue("holder", "report-worker-7f9c"))
		code, stdout, stderr = fenceExit(ns, pod, "release", "--lock", "report")
		Expect(code).To(Equal(0), stderr)
		Expect(stdout).To(HavePrefix(fmt.Sprintf("released %s/%s ", ns, r["claim"])))
		Eventually(func() []fkv1.FencedLease { return claimsIn(ns) }, 5*time.Second).Should(BeEmpty())
	})

	It("shows a lock blocked by a Lease fencekeeper does not manage", func() {
		foreign := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone-else")}}
		Expect(admin.Create(ctx, foreign)).To(Succeed())
		w := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w1"},
			Spec: fkv1.FencedLeaseSpec{LockName: "taken", HolderIdentity: "W1"}}
		Expect(admin.Create(ctx, w)).To(Succeed())
		Eventually(func() bool {
			Expect(admin.Get(ctx, client.ObjectKeyFromObject(w), w)).To(Succeed())
			return meta.IsStatusConditionTrue(w.Status.Conditions, fkv1.ConditionLockConflict)
		}, 10*time.Second).Should(BeTrue())
		reason := meta.FindStatusCondition(w.Status.Conditions, fkv1.ConditionLockConflict).Message

		for _, args := range [][]string{{"status"}, {"status", "taken"}} {
			code, stdout, stderr := fenceExit(ns, nil, args...)
			Expect(code).To(Equal(0), stderr)
			Expect(stdout).To(MatchRegexp(`(?m)^taken\s+<conflict: Lease not managed by fencekeeper>\s+0\s+-\s+-\s+1 waiting \[W1\]\s+~\d+s$`))
			Expect(stdout).To(ContainSubstring("taken: LockConflict: " + reason))
			Expect(reason).To(ContainSubstring("Lease " + ns + "/taken exists and is not managed by fencekeeper"))
		}

		code, stdout, stderr := fenceExit(ns, nil, "status", "taken", "-o", "json")
		Expect(code).To(Equal(0), stderr)
		var locks []map[string]any
		Expect(json.Unmarshal([]byte(stdout), &locks)).To(Succeed())
		Expect(locks).To(HaveLen(1))
		Expect(locks[0]).To(HaveKeyWithValue("conflict", reason))
		Expect(locks[0]).NotTo(HaveKey("holder"))
	})

	It("explains bad input and unknown locks", func() {
		cmd := fence(ns, "status", "nope")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		Expect(cmd.Run()).NotTo(Succeed())
		Expect(stderr.String()).To(ContainSubstring("no such lock " + ns + "/nope"))

		stderr.Reset()
		cmd = fence(ns, "run", "x", "--signal", "SIGFOO", "--", "true")
		cmd.Stderr = &stderr
		Expect(cmd.Run()).NotTo(Succeed())
		Expect(stderr.String()).To(ContainSubstring(`unknown --signal "SIGFOO"`))

		stderr.Reset()
		cmd = fence(ns, "acquire", "Bad_Lock")
		cmd.Stderr = &stderr
		Expect(cmd.Run()).NotTo(Succeed())
		Expect(stderr.String()).To(ContainSubstring("invalid lock name"))
	})
})

// cpuTicks is the user and system CPU time process pid has used, in clock
// ticks (/proc/<pid>/stat fields 14 and 15; 100 per second on Linux).
func cpuTicks(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	// The command name (field 2) may hold spaces: count from after it.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, err := strconv.Atoi(fields[11])
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	stime, err := strconv.Atoi(fields[12])
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return utime + stime
}

// commandStarted waits until the command run started has written its
// process ID to path, and kills that process when the test ends, whatever
// run did with it.
func commandStarted(path string) int {
	var pid int
	EventuallyWithOffset(1, func() error {
		b, err := os.ReadFile(path)
		if err == nil {
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return err
	}, 30*time.Second).Should(Succeed())
	DeferCleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// processRunning reports whether pid runs (exists and is not a zombie).
func processRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

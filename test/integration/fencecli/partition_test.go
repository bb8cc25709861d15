package fencecli_test

import (
	"bufio"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"
)

// Seed §22: a holder cut off from the control plane keeps running; the
// library must report LOST on its own clock, and `kubectl fence run` must
// tell CMD, before the authority can grant the lock to the next holder.
var _ = Describe("kubectl fence run cut off from the apiserver", func() {
	It("signals CMD when the lease's safe time runs out, before the next holder is granted", func() {
		ns, err := envtestutil.NewNamespace(ctx, admin, "partition")
		Expect(err).NotTo(HaveOccurred())
		dir := GinkgoT().TempDir()

		By("the plugin reaches the apiserver through a proxy the test controls")
		server, err := url.Parse(env.Admin.Host)
		Expect(err).NotTo(HaveOccurred())
		proxy, err := fault.NewProxy(server.Host)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)
		kc, err := os.ReadFile(kubeconfig)
		Expect(err).NotTo(HaveOccurred())
		kc, err = proxy.Through(kc)
		Expect(err).NotTo(HaveOccurred())
		proxied := filepath.Join(dir, "proxied.kubeconfig")
		Expect(os.WriteFile(proxied, kc, 0o600)).To(Succeed())

		script := `echo "$FENCEKEEPER_EPOCH" > env.txt
trap 'exit 7' TERM
sleep 1000 & wait $!`
		run := fence(ns, "run", "report-2026-07", "--holder", "W1", "--ttl", "4s", "--grace", "30s", "--", "sh", "-c", script)
		run.Args[2] = proxied // --kubeconfig
		run.Dir = dir
		stderr, err := run.StderrPipe()
		Expect(err).NotTo(HaveOccurred())
		Expect(run.Start()).To(Succeed())
		DeferCleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
		var mu sync.Mutex
		var signalledAt time.Time
		var lines []string
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				mu.Lock()
				lines = append(lines, sc.Text())
				if strings.Contains(sc.Text(), "; sending") && signalledAt.IsZero() {
					signalledAt = time.Now()
				}
				mu.Unlock()
			}
		}()
		Eventually(func() string { b, _ := os.ReadFile(filepath.Join(dir, "env.txt")); return string(b) }, 30*time.Second).
			Should(MatchRegexp(`^[1-9][0-9]*\n$`))

		By("W2 queues; the watch notes when it is granted")
		w, err := admin.Watch(ctx, &fkv1.FencedLeaseList{}, client.InNamespace(ns))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(w.Stop)
		w2 := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w2"},
			Spec: fkv1.FencedLeaseSpec{LockName: "report-2026-07", HolderIdentity: "W2", LeaseDurationSeconds: ptr.To(int32(30))}}
		Expect(admin.Create(ctx, w2)).To(Succeed())
		grantedAt := make(chan time.Time, 1)
		go func() {
			for ev := range w.ResultChan() {
				if c, ok := ev.Object.(*fkv1.FencedLease); ok && ev.Type != watch.Deleted && c.Name == "w2" && c.Status.Phase == fkv1.PhaseHeld {
					grantedAt <- time.Now()
					return
				}
			}
		}()

		By("the partition: the plugin's renewals hang")
		Consistently(grantedAt, 2*time.Second).ShouldNot(Receive(), "W2 was granted while W1 renewed")
		proxy.Partition()
		var granted time.Time
		Eventually(grantedAt, 30*time.Second).Should(Receive(&granted))
		mu.Lock()
		defer mu.Unlock()
		Expect(signalledAt.IsZero()).To(BeFalse(), "CMD was never told; plugin said: %v", lines)
		Expect(lines).To(ContainElement(MatchRegexp(`^kubectl-fence: lease on %s/report-2026-07 lost \(epoch [1-9][0-9]*, current holder unknown\); sending SIGTERM to [1-9][0-9]* \(sh\)`, ns)),
			"cut off, run cannot know who holds the lock now, and must not wait to find out")
		Expect(signalledAt.Before(granted)).To(BeTrue(),
			"CMD was signalled %v after the next holder was granted; plugin said: %v", signalledAt.Sub(granted), lines)
		proxy.Heal()
	})
})

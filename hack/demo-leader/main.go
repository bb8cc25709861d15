// Command demo-leader runs two replicas of a sample operator (a range
// allocator, see operator.go) under fenced leader election, as real
// processes on the local control plane. The leader is paused (SIGSTOP) in
// the middle of an allocation, past its TTL; the other replica takes over
// with the next epoch and, from a fresh view, gives the range the paused
// leader had chosen to another node. The old leader resumes and records its
// stale choice: the write gate or the object refuses it, so the allocation
// table never holds a duplicate. It prints the history and exits non-zero
// on any deviation.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/hack/internal/demokit"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "operator" {
		operatorMain()
		return
	}
	// Its own flag set: controller-runtime registers --kubeconfig globally.
	fs := flag.NewFlagSet("demo-leader", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", ".dev/kubeconfig", "Kubeconfig of the local control plane (make dev-up).")
	ttl := fs.Duration("ttl", 3*time.Second, "Lease TTL of the replicas.")
	_ = fs.Parse(os.Args[1:])
	if err := orchestrate(*kubeconfig, *ttl); err != nil {
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nDEMO OK: the paused leader's stale allocation was refused; no range is given twice.")
}

// version is one accepted write of an allocation, as watched.
type version struct {
	name, cidr string
	epoch      int64
	at         time.Time
}

func orchestrate(kubeconfig string, ttl time.Duration) error {
	c, ns, cleanup, err := demokit.Connect(kubeconfig, "demo-leader")
	if err != nil {
		return err
	}
	defer cleanup()
	ctx := context.Background()

	hist, err := c.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns), client.HasLabels{cidrOf})
	if err != nil {
		return err
	}
	defer hist.Stop()
	var histMu sync.Mutex
	var history []version
	go func() {
		for ev := range hist.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type != "DELETED" {
				e, _ := fkv1.ParseEpoch(cm.Annotations[fkv1.AnnotationFencedEpoch])
				histMu.Lock()
				history = append(history, version{name: cm.Name, cidr: cm.Data["cidr"], epoch: e, at: time.Now()})
				histMu.Unlock()
			}
		}
	}()

	kc, _ := filepath.Abs(kubeconfig)
	tl := demokit.New()
	start := func(name string) (*exec.Cmd, error) {
		return tl.Start(nil, "operator", "--kubeconfig", kc, "--namespace", ns, "--identity", name,
			"--ttl", ttl.String(), "--think", "2s")
	}
	node := func(name string) error {
		return c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{nodeLabel: ""}}})
	}
	say := func(ev, detail string) { tl.Add(demokit.Event{Actor: "demo", Event: ev, Detail: detail}) }

	a, err := start("replica-a")
	if err != nil {
		return err
	}
	defer func() { _ = a.Process.Signal(syscall.SIGCONT); _ = a.Process.Kill() }()
	la, err := tl.Wait("replica-a", "leading", 60*time.Second)
	if err != nil {
		return err
	}
	b, err := start("replica-b")
	if err != nil {
		return err
	}
	defer func() { _ = b.Process.Kill() }()
	if _, err := tl.Wait("replica-b", "candidate", 60*time.Second); err != nil {
		return err
	}
	for _, n := range []string{"node-1", "node-2"} {
		if err := node(n); err != nil {
			return err
		}
		say("node added", n)
		if _, err := tl.WaitFor("replica-a", "allocated", n, 30*time.Second); err != nil {
			return err
		}
	}

	if err := node("node-3"); err != nil {
		return err
	}
	say("node added", "node-3")
	chose, err := tl.WaitFor("replica-a", "chose", "node-3", 30*time.Second)
	if err != nil {
		return err
	}
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	paused := time.Now()
	say("SIGSTOP replica-a", "paused mid-allocation, holding its choice: "+chose.Detail)

	// While it sleeps the world moves on: node-3 goes away, node-4 arrives.
	if err := c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "node-3"}}); err != nil {
		return err
	}
	say("node removed", "node-3")
	if err := node("node-4"); err != nil {
		return err
	}
	say("node added", "node-4")

	slack := 5 * time.Second
	lb, err := tl.Wait("replica-b", "leading", ttl+slack)
	if err != nil {
		return fmt.Errorf("the new leader did not take over within TTL %v + %v of the pause: %w", ttl, slack, err)
	}
	took := time.Since(paused)
	if lb.Epoch != la.Epoch+1 {
		return fmt.Errorf("replica-b leads with epoch %d, want %d (replica-a's %d + 1)", lb.Epoch, la.Epoch+1, la.Epoch)
	}
	if _, err := tl.WaitFor("replica-b", "allocated", "node-4", 30*time.Second); err != nil {
		return err
	}

	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	say("SIGCONT replica-a", "it resumes believing it leads, and records its choice")
	refusal, err := waitAny(tl, "replica-a", 30*time.Second, "refused by gate", "refused by object")
	if err != nil {
		return fmt.Errorf("replica-a's stale allocation was not refused: %w", err)
	}
	exited, err := tl.Wait("replica-a", "exited", 30*time.Second)
	if err != nil {
		return err
	}
	if werr := a.Wait(); werr == nil || !strings.Contains(exited.Detail, "leader election lost") {
		return fmt.Errorf("replica-a should exit non-zero with 'leader election lost', got %v: %s", werr, exited.Detail) //nolint:errorlint // werr may be nil (that is the failure); %w would print %!w(<nil>)
	}
	_ = b.Process.Signal(syscall.SIGTERM)
	if _, err := tl.Wait("replica-b", "exited", 30*time.Second); err != nil {
		return err
	}
	if err := b.Wait(); err != nil {
		return fmt.Errorf("replica-b did not shut down cleanly: %w", err)
	}

	time.Sleep(500 * time.Millisecond) // let the watch deliver the last version
	histMu.Lock()
	defer histMu.Unlock()
	fmt.Printf("\nreplica-b took over %.2fs after the pause (TTL %v); replica-a's stale write was %s.\n",
		took.Seconds(), ttl, refusal.Event)
	fmt.Println("\nEvery accepted allocation write, as watched:")
	for _, v := range history {
		fmt.Printf("    %-14s %-14s epoch %d\n", v.name, v.cidr, v.epoch)
		if v.epoch == la.Epoch && v.at.After(paused) {
			return fmt.Errorf("a write under replica-a's epoch %d landed after it was paused: %s %s", la.Epoch, v.name, v.cidr)
		}
	}
	var table corev1.ConfigMapList
	if err := c.List(ctx, &table, client.InNamespace(ns), client.HasLabels{cidrOf}); err != nil {
		return err
	}
	fmt.Println("\nThe allocation table:")
	owner := map[string]string{}
	sort.Slice(table.Items, func(i, k int) bool { return table.Items[i].Name < table.Items[k].Name })
	for _, cm := range table.Items {
		fmt.Printf("    %-8s %s\n", cm.Data["node"], cm.Data["cidr"])
		if prev, dup := owner[cm.Data["cidr"]]; dup {
			return fmt.Errorf("range %s is given twice: to %s and %s", cm.Data["cidr"], prev, cm.Data["node"])
		}
		owner[cm.Data["cidr"]] = cm.Data["node"]
		if cm.Data["node"] == "node-3" {
			return fmt.Errorf("removed node-3 holds %s", cm.Data["cidr"])
		}
	}
	if len(table.Items) != 3 {
		return fmt.Errorf("want allocations for node-1, node-2 and node-4, got %d", len(table.Items))
	}
	return nil
}

// waitAny waits for the first of several events of actor.
func waitAny(tl *demokit.Timeline, actor string, d time.Duration, events ...string) (demokit.Event, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, ev := range events {
			if e, ok := tl.Find(actor, ev); ok {
				return e, nil
			}
		}
		for _, e := range tl.All() {
			if e.Actor == actor && e.Event == "allocated" && strings.Contains(e.Detail, "node-3") {
				return e, fmt.Errorf("its write was ACCEPTED: %s", e.Detail)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return demokit.Event{}, fmt.Errorf("%s reported none of %v within %v", actor, events, d)
}

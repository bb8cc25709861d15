// Command demo replays the report handoff of docs/concepts.md with real
// processes on the local control plane: W1 acquires report-2026-07 and is
// paused (SIGSTOP) past its TTL, W2 takes over with the next epoch and
// publishes, W1 resumes (SIGCONT), its publish is rejected as a stale owner,
// it observes LOST and discards its result, W2 releases. It verifies the
// report's watched history and exits non-zero on any deviation.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/hack/internal/demokit"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

const lock = "report-2026-07"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		fs := flag.NewFlagSet("worker", flag.ExitOnError)
		kc := fs.String("kubeconfig", "", "")
		ns := fs.String("namespace", "", "")
		name := fs.String("name", "", "")
		ttl := fs.Duration("ttl", 3*time.Second, "")
		compute := fs.Duration("compute", 0, "")
		hold := fs.Bool("hold", false, "")
		_ = fs.Parse(os.Args[2:])
		if err := worker(*kc, *ns, *name, lock, *ttl, *compute, *hold); err != nil {
			demokit.Emit(*name, "error", 0, err.Error())
			os.Exit(1)
		}
		return
	}
	kubeconfig := flag.String("kubeconfig", ".dev/kubeconfig", "Kubeconfig of the local control plane (make dev-up).")
	ttl := flag.Duration("ttl", 3*time.Second, "Lease TTL of the workers.")
	flag.Parse()
	if err := orchestrate(*kubeconfig, *ttl); err != nil {
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nDEMO OK: W2's report stands; W1's late write never landed.")
}

func orchestrate(kubeconfig string, ttl time.Duration) error {
	c, ns, cleanup, err := demokit.Connect(kubeconfig, "demo")
	if err != nil {
		return err
	}
	defer cleanup()
	ctx := context.Background()

	hist, err := c.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns))
	if err != nil {
		return err
	}
	var histMu sync.Mutex
	var history []string
	go func() {
		for ev := range hist.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && cm.Name == lock {
				histMu.Lock()
				history = append(history, fmt.Sprintf("epoch %s: %s", cm.Annotations[fkv1.AnnotationFencedEpoch], cm.Data["report.csv"]))
				histMu.Unlock()
			}
		}
	}()
	defer hist.Stop()

	kc, _ := filepath.Abs(kubeconfig)
	tl := demokit.New()
	start := func(name string, extra ...string) (*exec.Cmd, error) {
		args := append([]string{"worker", "--kubeconfig", kc, "--namespace", ns, "--name", name, "--ttl", ttl.String()}, extra...)
		return tl.Start(os.Stderr, args...)
	}

	// Last month's job left a report behind, written under the lock.
	setup, err := lease.NewClientFrom(c, ns).Acquire(ctx, lock, "june-job", lease.Options{TTL: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("setting up: %w", err)
	}
	if err := publish(ctx, c, setup, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lock}}, "report v10 by june-job"); err != nil {
		return fmt.Errorf("setting up: %w", err)
	}
	if err := setup.Release(ctx); err != nil {
		return err
	}
	tl.Add(demokit.Event{Actor: "demo", Event: "seeded report v10", Epoch: setup.Epoch, Detail: "by june-job, lock released"})

	w1, err := start("W1", "--compute", "3s")
	if err != nil {
		return err
	}
	defer func() { _ = w1.Process.Signal(syscall.SIGCONT); _ = w1.Process.Kill() }()
	a1, err := tl.Wait("W1", "computing", 30*time.Second)
	if err != nil {
		return err
	}
	if err := w1.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	tl.Add(demokit.Event{Actor: "demo", Event: "SIGSTOP W1", Detail: "a GC pause: no renewals, no code runs"})

	w2, err := start("W2", "--hold")
	if err != nil {
		return err
	}
	defer func() { _ = w2.Process.Kill() }()
	a2, err := tl.Wait("W2", "acquired", 10*ttl+10*time.Second)
	if err != nil {
		return err
	}
	if a2.Epoch != a1.Epoch+1 {
		return fmt.Errorf("W2 got epoch %d, want %d", a2.Epoch, a1.Epoch+1)
	}
	if _, err := tl.Wait("W2", "published", 30*time.Second); err != nil {
		return err
	}
	if err := w1.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	tl.Add(demokit.Event{Actor: "demo", Event: "SIGCONT W1", Detail: "W1 resumes, still believing it owns the report"})
	if e, err := tl.Wait("W1", "publish rejected", 30*time.Second); err != nil {
		if _, ok := tl.Find("W1", "published"); ok {
			return fmt.Errorf("W1's stale write was ACCEPTED")
		}
		return err
	} else if !strings.Contains(e.Detail, fmt.Sprintf("stale epoch %d", a1.Epoch)) {
		return fmt.Errorf("W1's write was rejected for the wrong reason: %s", e.Detail)
	}
	if _, err := tl.Wait("W1", "discarded result", 3*ttl); err != nil {
		return err
	}
	if err := w1.Wait(); err != nil {
		return fmt.Errorf("W1 exited with %w", err)
	}
	_ = w2.Process.Signal(syscall.SIGUSR1)
	if _, err := tl.Wait("W2", "released", 30*time.Second); err != nil {
		return err
	}
	if err := w2.Wait(); err != nil {
		return fmt.Errorf("W2 exited with %w", err)
	}

	time.Sleep(500 * time.Millisecond) // let the watch deliver the last version
	histMu.Lock()
	defer histMu.Unlock()
	fmt.Println("\nThe report's history, as watched:")
	for _, h := range history {
		fmt.Println("   ", h)
	}
	if len(history) < 2 {
		return fmt.Errorf("the report was not rewritten by W2 (history: %v)", history)
	}
	for _, h := range history[1:] {
		if strings.Contains(h, "by W1") {
			return fmt.Errorf("W1's result landed: %q", h)
		}
	}
	if last := history[len(history)-1]; !strings.Contains(last, "by W2") {
		return fmt.Errorf("the report's final version is not W2's: %q", last)
	}
	return nil
}

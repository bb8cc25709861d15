package docs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/proc"
)

// TestDevDownAfterKill: `make dev-down` stops etcd and kube-apiserver even
// when devcluster was killed without a chance to stop them (SIGKILL, an
// OOM kill). envtest runs them in process groups of their own, so killing
// devcluster's group does not reach them.
func TestDevDownAfterKill(t *testing.T) {
	root := envtestutil.RepoRoot()
	dev := t.TempDir()
	env := append(os.Environ(), "DEV_DIR="+dev, "BARE=1", "APISERVER_PORT="+strconv.Itoa(freePort(t)))
	script := func(name string) {
		t.Helper()
		cmd := exec.Command("bash", filepath.Join(root, "hack", name))
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			log, _ := os.ReadFile(filepath.Join(dev, "devcluster.log"))
			t.Fatalf("%s: %v\n%s\n%s", name, err, out, log)
		}
	}
	script("dev-up.sh")
	pidText, err := os.ReadFile(filepath.Join(dev, "devcluster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	devcluster, err := strconv.Atoi(strings.TrimSpace(string(pidText)))
	if err != nil {
		t.Fatal(err)
	}
	// Found from /proc, not from what devcluster recorded for dev-down.
	children, err := proc.Children(devcluster)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range children {
		names = append(names, c.Comm)
	}
	if !containsAll(names, "etcd", "kube-apiserver") {
		t.Fatalf("devcluster's children are %v, want etcd and kube-apiserver among them", names)
	}
	for _, c := range children {
		// In devcluster's own group, killing that group would stop them
		// anyway, and this test would show nothing about dev-down's list.
		if (c.Comm == "etcd" || c.Comm == "kube-apiserver") && c.Pgrp() == devcluster {
			t.Fatalf("%s runs in devcluster's process group: the case this test is about does not arise", c.Comm)
		}
	}
	// If the test fails from here on, they must not outlive it.
	t.Cleanup(func() {
		for _, c := range children {
			if c.Running() {
				_ = syscall.Kill(c.Pid, syscall.SIGKILL)
			}
		}
	})

	self, ok := proc.ReadProc(devcluster)
	if !ok || self.Comm != "devcluster" {
		t.Fatalf("pid %d in devcluster.pid is not devcluster (%+v)", devcluster, self)
	}
	if err := syscall.Kill(devcluster, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "devcluster to die", func() bool { return !self.Running() })
	for _, c := range children {
		if (c.Comm == "etcd" || c.Comm == "kube-apiserver") && !c.Running() {
			t.Fatalf("%s (pid %d) died with devcluster: nothing left for dev-down to stop, so this test shows nothing", c.Comm, c.Pid)
		}
	}

	script("dev-down.sh")
	waitFor(t, "dev-down to stop every process devcluster started", func() bool {
		for _, c := range children {
			if c.Running() {
				return false
			}
		}
		return true
	})
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

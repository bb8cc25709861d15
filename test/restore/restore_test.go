// Package restore tests that epochs stay above every epoch issued before an
// etcd snapshot is restored the Kubernetes way (etcdutl snapshot restore
// --bump-revision --mark-compacted), and shows why the bump is needed.
package restore

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	uberzap "go.uber.org/zap"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/test/fault"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRestore(t *testing.T) {
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	t.Run("with --bump-revision: a lock used after the snapshot starts above its old epochs", func(t *testing.T) {
		before, after, inSnapshot := restoreAndGrant(t, true)
		t.Logf("highest epoch before the restore %d, first after it %d", before, after)
		if after <= before {
			t.Fatalf("epoch %d granted after the restore is not above %d, issued before it: a holder from before the restore could present it", after, before)
		}
		// A lock whose Lease the snapshot holds comes back with the counter
		// it had then, below the epochs it issued after it: the term's
		// floor keeps its next grant above them.
		t.Logf("lock in the snapshot: highest epoch before the restore %d, first after it %d", inSnapshot[0], inSnapshot[1])
		if inSnapshot[1] <= inSnapshot[0] {
			t.Fatalf("epoch %d granted after the restore on a lock whose Lease the snapshot holds is not above %d, issued before it", inSnapshot[1], inSnapshot[0])
		}
	})
	t.Run("without --bump-revision (the control): the same lock would reuse an epoch", func(t *testing.T) {
		before, after, _ := restoreAndGrant(t, false)
		t.Logf("highest epoch before the restore %d, first after it %d (reused)", before, after)
		if after > before {
			t.Fatalf("epoch %d after a restore without the bump is above %d: this control no longer shows why the bump is needed", after, before)
		}
	})
}

// restoreAndGrant snapshots etcd, issues epochs on a lock created after the
// snapshot, restores the snapshot (optionally bumping the revision), and
// grants that lock again with a new manager: it returns the highest epoch
// issued before the restore and the first one after it, and the same for a
// lock whose Lease the snapshot holds.
func restoreAndGrant(t *testing.T, bump bool) (int64, int64, [2]int64) {
	ctx := context.Background()
	env, err := envtestutil.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	var etcd, apiserver *fault.ControlPlaneProcess
	t.Cleanup(func() {
		for _, p := range []*fault.ControlPlaneProcess{apiserver, etcd} {
			if p != nil {
				p.Stop()
			}
		}
		_ = env.Stop()
	})
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// The claim-identity policy is in effect, as wherever fencekeeper is
	// installed (a claim that records no identity is never granted); the
	// manager runs as the admin identity, which its parameter names. The
	// snapshot keeps it.
	var self authenticationv1.SelfSubjectReview
	if err := c.Create(ctx, &self); err != nil {
		t.Fatal(err)
	}
	if _, err := envtestutil.InstallClaimIdentity(ctx, cfg, self.Status.UserInfo.Username); err != nil {
		t.Fatal(err)
	}
	mgr, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := envtestutil.NewNamespace(ctx, c, "restore")
	if err != nil {
		t.Fatal(err)
	}
	// Enough writes after the snapshot that a new ledger after an unbumped
	// restore would start below the epochs issued.
	grant(t, c, ns, "warm-up", "w0")

	dir := t.TempDir()
	snap := filepath.Join(dir, "snapshot.db")
	saveSnapshot(t, env.ControlPlane.Etcd.URL.String(), snap)

	// Writes the restore undoes, before the lock's first grant: its ledger
	// then starts at least this far above the snapshot's revision, more
	// than the restarted apiserver and manager write before the control's
	// grant (without them the control failed once on a slow machine: the
	// restart's own writes took the revision past the old epochs).
	for i := 0; i < 300; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("undone-%d", i)}}
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	var last, lastInSnapshot int64
	for i := 1; i <= 5; i++ {
		last = grant(t, c, ns, "report-2026-07", fmt.Sprintf("w%d", i))
		lastInSnapshot = grant(t, c, ns, "warm-up", fmt.Sprintf("w0-%d", i))
	}
	if err := mgr.Stop(); err != nil {
		t.Fatal(err)
	}

	// The restarted processes log to files, shown when they do not come up.
	apiLog, err := os.Create(filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	etcdLog, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	if apiserver, err = fault.FindControlPlaneProcess("kube-apiserver", apiLog); err != nil {
		t.Fatal(err)
	}
	if etcd, err = fault.FindControlPlaneProcess("etcd", etcdLog); err != nil {
		t.Fatal(err)
	}
	dataDir := etcd.Arg("data-dir")
	args := []string{"snapshot", "restore", snap, "--data-dir", dataDir + ".restored"}
	if bump {
		args = append(args, "--bump-revision", "1000000", "--mark-compacted")
	}
	if err := etcd.RestartAfter(func() error {
		out, err := exec.Command(filepath.Join(envtestutil.BinDir(), "etcdutl"), args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("etcdutl %v: %w\n%s", args, err, out)
		}
		if err := os.RemoveAll(dataDir); err != nil {
			return err
		}
		return os.Rename(dataDir+".restored", dataDir)
	}); err != nil {
		t.Fatal(err)
	}
	// The apiserver starts against the restored etcd only once it serves.
	if err := fault.WaitEtcdHealthy(ctx, env.ControlPlane.Etcd.URL.String()); err != nil {
		t.Fatalf("%v\netcd's log:\n%s", err, tail(filepath.Join(dir, "etcd.log")))
	}
	// The apiserver's caches still show the future the restore undid.
	if err := apiserver.Restart(0); err != nil {
		t.Fatal(err)
	}
	if err := fault.WaitAnswering(ctx, c); err != nil {
		t.Fatalf("%v\nkube-apiserver's log:\n%s", err, tail(filepath.Join(dir, "kube-apiserver.log")))
	}

	// The restarted apiserver loads the restored policy from etcd.
	if err := envtestutil.WaitForClaimIdentity(ctx, c); err != nil {
		t.Fatal(err)
	}
	mgr2, err := envtestutil.StartManager(cfg, envtestutil.ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mgr2.Stop() }()
	after := grant(t, c, ns, "report-2026-07", "after-restore")
	return last, after, [2]int64{lastInSnapshot, grant(t, c, ns, "warm-up", "w0-after-restore")}
}

func grant(t *testing.T, c client.Client, ns, lock, name string) int64 {
	t.Helper()
	ctx := context.Background()
	claim := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: name, LeaseDurationSeconds: ptr.To(int32(60))}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got fkv1.FencedLease
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err == nil && got.Status.Phase == fkv1.PhaseHeld {
			// Give it up so the next claim is granted at once.
			if err := c.Delete(ctx, &got, client.Preconditions{UID: &got.UID}); err != nil {
				t.Fatal(err)
			}
			return got.Status.Epoch
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim %s/%s not Held after 60s", ns, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func saveSnapshot(t *testing.T, endpoint, path string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: uberzap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r, err := cli.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, r); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// tail is the end of a log file, for a failure message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Package helm runs the Helm chart end to end on a local control plane, the
// way `make helm-local` does (docs/install.md, "Trying the chart locally"):
// bin/helm installs it, hack/devcluster/localpods runs the chart's pods as
// bin/manager processes with the chart's ServiceAccount, args, certificate
// Secret and probes, and the apiserver reaches the webhook through the
// chart's Service (--enable-aggregator-routing and the pods'
// EndpointSlices). Then the chart's NOTES are followed as written, a fenced
// write is accepted and a stale one refused, the metrics Service serves the
// manager's metrics, and helm uninstall leaves what the docs say it leaves.
package helm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/hack/devcluster/localpods"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

const (
	namespace = "fencekeeper-system"
	release   = "fk"
	fullname  = "fk-fencekeeper" // the chart's fencekeeper.fullname for release fk
	// No pod pulls it: localpods runs bin/manager in its place.
	image = "registry.example/fencekeeper/fencekeeper"
)

func TestChartEndToEnd(t *testing.T) {
	began := time.Now()
	defer func() { t.Logf("took %s", time.Since(began).Round(100*time.Millisecond)) }()
	helmBin, kubectlBin := tool(t, "helm"), tool(t, "kubectl")
	hostIP := envtestutil.AdvertiseAddress()
	if hostIP == "" {
		t.Fatal("no non-loopback IPv4 address on an interface that is up: the pods' EndpointSlices need one (an EndpointSlice refuses loopback)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// cmd/manager builds while the control plane starts.
	type built struct {
		path string
		err  error
	}
	managerBuilt := make(chan built, 1)
	go func() {
		path, err := envtestutil.ManagerBinary()
		managerBuilt <- built{path, err}
	}()

	// The control plane, as devcluster starts it for BARE=1: nothing
	// installed, Services the apiserver calls resolved through their
	// EndpointSlices.
	env, err := envtestutil.New()
	if err != nil {
		t.Fatal(err)
	}
	env.CRDDirectoryPaths = nil // the chart installs the CRD
	localpods.ConfigureAPIServer(env)
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	dir := t.TempDir()
	user, err := env.AddUser(envtest.User{Name: "platform-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := envtestutil.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// The platform admin claims, writes and reads as one identity: an epoch
	// is accepted only from the identity whose claim holds it.
	c, err := client.New(user.Config(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(user.Config())
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("control plane up at %s", time.Since(began).Round(100*time.Millisecond))
	b := <-managerBuilt
	if b.err != nil {
		t.Fatal(b.err)
	}
	manager := b.path
	t.Logf("cmd/manager built at %s", time.Since(began).Round(100*time.Millisecond))
	var podsLog syncBuffer
	podsCtx, stopPods := context.WithCancel(ctx)
	podsDone := make(chan error, 1)
	go func() {
		podsDone <- localpods.Run(podsCtx, localpods.Options{Config: cfg, Binary: manager, HostIP: hostIP, Dir: filepath.Join(dir, "pods"), Log: &podsLog})
	}()
	t.Cleanup(func() {
		stopPods()
		if err := <-podsDone; err != nil {
			t.Errorf("localpods: %v", err)
		}
		if t.Failed() {
			t.Logf("localpods:\n%s", podsLog.String())
			logs, _ := filepath.Glob(filepath.Join(dir, "pods", "*", "*.log"))
			for _, l := range logs {
				t.Logf("%s (last 40 lines):\n%s", l, tail(l, 40))
			}
		}
	})
	sh := shell{t: t, env: []string{"KUBECONFIG=" + kubeconfig, "HELM_CACHE_HOME=" + dir + "/helm/cache",
		"HELM_CONFIG_HOME=" + dir + "/helm/config", "HELM_DATA_HOME=" + dir + "/helm/data"}}

	// 1. Install, as docs/install.md says, and let helm wait for the
	// Deployment (its ReplicaSet's pods ready: readiness probes passed).
	chart := filepath.Join(envtestutil.RepoRoot(), "charts", "fencekeeper")
	out := sh.must(nil, helmBin, "install", release, chart, "-n", namespace, "--create-namespace",
		"--set", "image.repository="+image, "--wait", "--timeout", "120s")
	t.Logf("helm install --wait: done at %s", time.Since(began).Round(100*time.Millisecond))

	// 2. The NOTES, as written: wait for the rollout, create the sample
	// claim, see it Held.
	notes := notesCommands(out)
	want := []string{"rollout status", "create namespace reports", "apply -f -", "get fencedleases"}
	if len(notes) != len(want) {
		t.Fatalf("the NOTES show %d kubectl commands, this test follows %d (%q): %q\n%s", len(notes), len(want), want, notes, out)
	}
	for i, w := range want {
		if !strings.Contains(strings.Join(notes[i].args, " "), w) {
			t.Fatalf("NOTES command %d is %q, not the expected %q\n%s", i+1, notes[i].args, w, out)
		}
	}
	if got := sh.must(nil, kubectlBin, append(notes[0].args[1:], "--timeout=60s")...); !strings.Contains(got, "successfully rolled out") {
		t.Fatalf("kubectl rollout status: %s", got)
	}
	sh.must(nil, kubectlBin, notes[1].args[1:]...)
	sh.must(notes[2].stdin, kubectlBin, notes[2].args[1:]...)
	var got string
	eventually(t, 30*time.Second, "the NOTES' claim to be Held ("+strings.Join(notes[3].args, " ")+")", func() error {
		got = sh.must(nil, kubectlBin, notes[3].args[1:]...)
		if !regexp.MustCompile(`(?m)^w1-report-2026-07\s.*\sHeld\s`).MatchString(got) {
			return errors.New(got)
		}
		return nil
	})
	t.Logf("kubectl -n reports get fencedleases:\n%s", got)
	w1 := claim(ctx, t, c, "w1-report-2026-07")
	lock := w1.Spec.LockName

	// 3. Fenced writes through the chart's webhook Service: W1's epoch is
	// accepted; W2 takes over; W2's is accepted, W1's (now stale) refused.
	w2 := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: "reports", Name: "w2-" + lock},
		Spec: fkv1.FencedLeaseSpec{LockName: lock, HolderIdentity: "W2", LeaseDurationSeconds: ptr.To[int32](300)}}
	if err := c.Create(ctx, w2); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "W1's write with its epoch to be accepted", func() error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "reports", Name: "report",
			Labels: map[string]string{fkv1.LabelLock: lock}, Annotations: map[string]string{fkv1.AnnotationEpoch: epoch(w1)}},
			Data: map[string]string{"report": "v1 by W1"}}
		err := c.Create(ctx, cm)
		if r := cause(err); r != "" {
			t.Fatalf("W1's write with the current epoch %s was refused: %v", epoch(w1), err)
		}
		return err // a webhook not reached yet is retried
	})
	if err := c.Delete(ctx, w1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "W2 to be granted after W1 released", func() error {
		w2 = claim(ctx, t, c, w2.Name)
		if w2.Status.Phase != fkv1.PhaseHeld || w2.Status.Epoch <= w1.Status.Epoch {
			return fmt.Errorf("W2: phase %q epoch %d (W1 held %d)", w2.Status.Phase, w2.Status.Epoch, w1.Status.Epoch)
		}
		return nil
	})
	if err := writeReport(ctx, c, epoch(w2), "v2 by W2"); err != nil {
		t.Fatalf("W2's write with the current epoch %s: %v", epoch(w2), err)
	}
	err = writeReport(ctx, c, epoch(w1), "late v1 by W1")
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != 403 || !cause(err).IsStaleHolder() {
		t.Fatalf("W1's late write with the stale epoch %s: want a 403 with a fencekeeper stale-holder cause (%s), got %v (cause %q)",
			epoch(w1), fkv1.AdmissionStaleEpoch.CauseType(), err, cause(err))
	}
	t.Logf("W1's stale write refused: %v", err)
	var stored corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: "reports", Name: "report"}, &stored); err != nil || stored.Data["report"] != "v2 by W2" {
		t.Fatalf("the report after the refused write: %v %v", stored.Data, err)
	}

	// 3b. A semaphore lock under the chart's RBAC: two permits at once,
	// each with its renewal Lease; a released permit's Lease is deleted
	// (the manager's role must allow it) and the waiter gets the permit.
	for _, n := range []string{"l1", "l2", "l3"} {
		fl := &fkv1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: "reports", Name: n},
			Spec: fkv1.FencedLeaseSpec{LockName: "loaders", HolderIdentity: n, LeaseDurationSeconds: ptr.To[int32](300), MaxHolders: ptr.To[int32](2)}}
		if err := c.Create(ctx, fl); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // FIFO by creation time
	}
	var l1 *fkv1.FencedLease
	eventually(t, 20*time.Second, "l1 and l2 to hold the two permits of lock loaders", func() error {
		l1 = claim(ctx, t, c, "l1")
		l2 := claim(ctx, t, c, "l2")
		if l1.Status.Phase != fkv1.PhaseHeld || l2.Status.Phase != fkv1.PhaseHeld || claim(ctx, t, c, "l3").Status.Phase == fkv1.PhaseHeld {
			return fmt.Errorf("l1 %q, l2 %q", l1.Status.Phase, l2.Status.Phase)
		}
		return c.Get(ctx, client.ObjectKey{Namespace: "reports", Name: fkv1.PermitLeaseName("loaders", l1.Status.Epoch)}, &coordinationv1.Lease{})
	})
	if err := c.Delete(ctx, l1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "l3 to get l1's permit and l1's permit Lease to be deleted", func() error {
		if l3 := claim(ctx, t, c, "l3"); l3.Status.Phase != fkv1.PhaseHeld {
			return fmt.Errorf("l3 %q", l3.Status.Phase)
		}
		err := c.Get(ctx, client.ObjectKey{Namespace: "reports", Name: fkv1.PermitLeaseName("loaders", l1.Status.Epoch)}, &coordinationv1.Lease{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("l1's permit Lease: %w", err)
		}
		return nil
	})

	// 4. The metrics Service serves the manager's metrics (the apiserver's
	// service proxy picks a ready endpoint of it; the leader's count the
	// two grants).
	grants := regexp.MustCompile(`(?m)^fencekeeper_grants_total ([0-9.e+]+)$`)
	eventually(t, 20*time.Second, "the metrics Service to serve the leader's fencekeeper_grants_total >= 2", func() error {
		body, err := cs.CoreV1().Services(namespace).ProxyGet("http", fullname+"-metrics", "metrics", "/metrics", nil).DoRaw(ctx)
		if err != nil {
			return err
		}
		m := grants.FindSubmatch(body)
		if m == nil {
			return fmt.Errorf("no fencekeeper_grants_total in %d bytes of metrics", len(body))
		}
		if n, _ := strconv.ParseFloat(string(m[1]), 64); n < 2 {
			return fmt.Errorf("fencekeeper_grants_total %s (a replica that does not lead)", m[1])
		}
		return nil
	})

	// 5. helm uninstall removes the release's objects, the webhook
	// certificate Secret too; it keeps the CRD (crds.keep) and the managed
	// Leases, as docs/install.md says; the pods go with the Deployment.
	out = sh.must(nil, helmBin, "uninstall", release, "-n", namespace)
	if strings.Contains(out, "[Secret]") || !strings.Contains(out, "[CustomResourceDefinition] fencedleases.fencekeeper.io") {
		t.Fatalf("helm uninstall should keep the CRD and nothing else:\n%s", out)
	}
	err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: fullname + "-webhook-cert"}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the webhook certificate Secret after helm uninstall: %v (want it deleted)", err)
	}
	err = c.Get(ctx, client.ObjectKey{Name: fullname + "-fencing"}, &admissionregistrationv1.MutatingWebhookConfiguration{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the webhook configuration after helm uninstall: %v", err)
	}
	eventually(t, 40*time.Second, "the Deployment's pods, ReplicaSets and EndpointSlices to be gone", func() error {
		var pods corev1.PodList
		var rss appsv1.ReplicaSetList
		var slices discoveryv1.EndpointSliceList
		for _, l := range []client.ObjectList{&pods, &rss, &slices} {
			if err := c.List(ctx, l, client.InNamespace(namespace)); err != nil {
				return err
			}
		}
		if n := len(pods.Items) + len(rss.Items) + len(slices.Items); n > 0 {
			return fmt.Errorf("%d pods, %d replicasets, %d endpointslices left", len(pods.Items), len(rss.Items), len(slices.Items))
		}
		return nil
	})
	if err := c.Get(ctx, client.ObjectKey{Name: "fencedleases.fencekeeper.io"}, &apiextensionsv1.CustomResourceDefinition{}); err != nil {
		t.Fatalf("the CRD after helm uninstall (crds.keep): %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "reports", Name: lock}, &coordinationv1.Lease{}); err != nil {
		t.Fatalf("the lock's managed Lease after helm uninstall (it keeps the epoch counter): %v", err)
	}
}

func tool(t *testing.T, name string) string {
	p := filepath.Join(envtestutil.BinDir(), name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run 'make tools' (%v)", p, err)
	}
	return p
}

func claim(ctx context.Context, t *testing.T, c client.Client, name string) *fkv1.FencedLease {
	var fl fkv1.FencedLease
	if err := c.Get(ctx, client.ObjectKey{Namespace: "reports", Name: name}, &fl); err != nil {
		t.Fatal(err)
	}
	return &fl
}

func epoch(fl *fkv1.FencedLease) string { return strconv.FormatInt(fl.Status.Epoch, 10) }

// writeReport writes the fenced report presenting an epoch (admission
// consumes the annotation: every write presents it again).
func writeReport(ctx context.Context, c client.Client, epoch, text string) error {
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: "reports", Name: "report"}, &cm); err != nil {
		return err
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[fkv1.AnnotationEpoch] = epoch
	cm.Data["report"] = text
	return c.Update(ctx, &cm)
}

// cause is the fencekeeper reason of an admission refusal ("" if none).
func cause(err error) fkv1.AdmissionReason {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return ""
	}
	for _, c := range status.Status().Details.Causes {
		if r, ok := strings.CutPrefix(string(c.Type), fkv1.Prefix); ok {
			return fkv1.AdmissionReason(r)
		}
	}
	return ""
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s: %v", timeout, what, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type shell struct {
	t   *testing.T
	env []string
}

// must runs a command with the test's kubeconfig and helm directories and
// returns its output; it fails the test when the command fails.
func (s shell) must(stdin []byte, name string, args ...string) string {
	s.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), s.env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

type noteCommand struct {
	args  []string // "kubectl", ...
	stdin []byte   // a here-document's body
}

// notesCommands returns the kubectl commands the NOTES show, in order, each
// with its here-document (trailing "# comments" dropped).
func notesCommands(out string) []noteCommand {
	_, notes, _ := strings.Cut(out, "NOTES:")
	var cmds []noteCommand
	sc := bufio.NewScanner(strings.NewReader(notes))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "kubectl ") {
			continue
		}
		if i := strings.Index(line, " #"); i > 0 {
			line = strings.TrimSpace(line[:i])
		}
		cmd := noteCommand{}
		if before, marker, ok := strings.Cut(line, "<<"); ok {
			line = before
			end := strings.Trim(marker, `'" `)
			var body []string
			indent := -1
			for sc.Scan() {
				raw := sc.Text()
				if strings.TrimSpace(raw) == end {
					break
				}
				if indent < 0 {
					indent = len(raw) - len(strings.TrimLeft(raw, " "))
				}
				body = append(body, strings.TrimPrefix(raw, strings.Repeat(" ", indent)))
			}
			cmd.stdin = []byte(strings.Join(body, "\n") + "\n")
		}
		cmd.args = strings.Fields(line)
		cmds = append(cmds, cmd)
	}
	return cmds
}

func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

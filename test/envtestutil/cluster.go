package envtestutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeControllerManagerUser is the identity kube-controller-manager runs as
// (its controllers share it: no --use-service-account-credentials).
const KubeControllerManagerUser = "system:kube-controller-manager"

// KubeSchedulerUser is the identity kube-scheduler runs as.
const KubeSchedulerUser = "system:kube-scheduler"

// KwokNodeLabel marks the nodes kwok plays the kubelet for; taking it off a
// node silences the node, the way a node that lost power goes silent.
const KwokNodeLabel = "fencekeeper.test/kwok"

// ClusterControllers are the controllers a Cluster runs in
// kube-controller-manager: enough for real garbage collection, namespace
// deletion, Deployments and node loss.
var ClusterControllers = []string{
	"garbage-collector-controller", "namespace-controller", "deployment-controller",
	"replicaset-controller", "node-lifecycle-controller", "taint-eviction-controller",
	"pod-garbage-collector-controller",
}

// ClusterOptions configure the controllers a Cluster adds to a control plane.
type ClusterOptions struct {
	// NodeMonitorGracePeriod: how long a silent node stays Ready (default 6 s;
	// the real default is 50 s).
	NodeMonitorGracePeriod time.Duration
	// Dir receives the processes' logs (default: a temporary directory).
	Dir string
}

// Cluster is kube-controller-manager, kube-scheduler and kwok running beside
// an envtest control plane, so tests see what a real cluster does: garbage
// collection, namespace deletion, Deployments whose pods are scheduled onto
// kwok's nodes and become Running there, and nodes that stop answering.
type Cluster struct {
	Dir   string
	procs []*exec.Cmd
}

// StartCluster starts kube-controller-manager, kube-scheduler and kwok (from
// BinDir) against env, which must already be started.
func StartCluster(env *envtest.Environment, o ClusterOptions) (*Cluster, error) {
	if o.NodeMonitorGracePeriod == 0 {
		o.NodeMonitorGracePeriod = 6 * time.Second
	}
	dir := o.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "fencekeeper-cluster-"); err != nil {
			return nil, err
		}
	}
	for _, b := range []string{"kube-controller-manager", "kube-scheduler", "kwok"} {
		if _, err := os.Stat(filepath.Join(BinDir(), b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run 'make tools' (builds it from the Go module proxy)", b, BinDir())
		}
	}
	kcmCfg, err := kubeconfigFor(env, dir, KubeControllerManagerUser)
	if err != nil {
		return nil, err
	}
	schedCfg, err := kubeconfigFor(env, dir, KubeSchedulerUser)
	if err != nil {
		return nil, err
	}
	kwokCfg, err := kubeconfigFor(env, dir, "system:node:kwok")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir}
	grace := o.NodeMonitorGracePeriod
	if err := c.start("kube-controller-manager",
		"--kubeconfig="+kcmCfg, "--authentication-kubeconfig="+kcmCfg, "--authorization-kubeconfig="+kcmCfg,
		"--controllers="+strings.Join(ClusterControllers, ","),
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
		"--node-monitor-period=1s", "--node-monitor-grace-period="+grace.String(),
		"--concurrent-gc-syncs=5", "--namespace-sync-period=10s", "-v=1",
	); err != nil {
		return nil, err
	}
	// The default scheduler profile; no serving port (nothing scrapes it).
	if err := c.start("kube-scheduler",
		"--kubeconfig="+schedCfg, "--leader-elect=false", "--secure-port=0", "-v=1",
	); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.start("kwok",
		"--kubeconfig="+kwokCfg, "--config="+filepath.Join(RepoRoot(), "hack", "kwok", "stages.yaml"),
		"--manage-nodes-with-label-selector="+KwokNodeLabel+"=true",
		// Heartbeats through node Leases, renewed every second.
		"--node-lease-duration-seconds=4", "--cidr=10.0.0.0/16", "--v=WARN",
	); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func kubeconfigFor(env *envtest.Environment, dir, user string) (string, error) {
	u, err := env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, strings.ReplaceAll(user, ":", "-")+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

func (c *Cluster) start(name string, args ...string) error {
	logf, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(BinDir(), name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

// Stop kills the processes (their state lives in etcd, which envtest owns).
func (c *Cluster) Stop() {
	for _, p := range c.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	c.procs = nil
}

// Logs returns the tail of a process's log (for a failing test's report).
func (c *Cluster) Logs(name string, lines int) string {
	data, _ := os.ReadFile(filepath.Join(c.Dir, name+".log"))
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// AddNode creates a node that kwok plays the kubelet for, and waits until
// it is Ready.
func AddNode(ctx context.Context, c client.Client, name string) (*corev1.Node, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{KwokNodeLabel: "true", "kubernetes.io/hostname": name, "type": "kwok"},
		Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
	}}
	if err := c.Create(ctx, node); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return nil, err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return node, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("node %s not Ready after 60s (is kwok running?)", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// SilenceNode stops kwok from playing node's kubelet: its heartbeats stop,
// and after the node monitor grace period the node lifecycle controller
// marks it NotReady (Unknown) and its pods not Ready.
func SilenceNode(ctx context.Context, c client.Client, name string) error {
	return c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(
		"application/merge-patch+json", []byte(`{"metadata":{"labels":{"`+KwokNodeLabel+`":null}}}`)))
}

package localpods

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// portMap is one container port and the host port its process listens on.
type portMap struct {
	name            string
	container, host int32
	protocol        corev1.Protocol
}

// runState is what the kubelet would report of the pod's one container.
type runState struct {
	everStarted, running, ready, terminating bool
	containerID                              string
	startedAt                                time.Time
	restarts                                 int32
	waitingReason, waitingMessage            string
	lastTerm                                 *corev1.ContainerStateTerminated
}

// podRun is the kubelet's part for one pod: its container's process, its
// files, its probes.
type podRun struct {
	p                     *player
	uid                   types.UID
	namespace, name       string
	deployment            types.UID
	labels, annotations   map[string]string
	spec                  corev1.PodSpec
	container             corev1.Container
	dir, logPath          string
	ports                 []portMap
	created               time.Time
	unsupported           string // why it cannot run, if it cannot
	files                 sync.Mutex
	written               map[string]string // volume -> digest of what was written
	tokenDue              time.Time
	mu                    sync.Mutex
	st                    runState
	quit, done            chan struct{}
	stopOnce, terminating sync.Once
}

func (r *podRun) snapshot() runState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

func (r *podRun) update(f func(*runState)) {
	r.mu.Lock()
	f(&r.st)
	r.mu.Unlock()
}

// kubelet plays the kubelet for one pod of a Deployment it runs.
func (p *player) kubelet(ctx context.Context, deployment types.UID, pod *corev1.Pod) error {
	p.mu.Lock()
	r := p.runs[pod.UID]
	p.mu.Unlock()
	if pod.DeletionTimestamp != nil {
		if r == nil {
			return p.stopAndRemove(ctx, pod)
		}
		r.terminating.Do(func() {
			r.update(func(s *runState) { s.terminating, s.ready = true, false })
			p.logf("pod %s/%s is being deleted: stopping its process", pod.Namespace, pod.Name)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				p.report("pod "+pod.Namespace+"/"+pod.Name, p.stopAndRemove(ctx, pod))
			}()
		})
		return nil
	}
	if r == nil {
		var err error
		if r, err = p.newRun(ctx, deployment, pod); err != nil {
			return err
		}
	}
	if r.unsupported == "" {
		if err := r.syncFiles(ctx); err != nil {
			r.update(func(s *runState) {
				if !s.running {
					s.waitingReason, s.waitingMessage = "ContainerCreating", err.Error()
				}
			})
		}
	}
	return p.syncPodStatus(ctx, pod, r)
}

func (p *player) newRun(ctx context.Context, deployment types.UID, pod *corev1.Pod) (*podRun, error) {
	r := &podRun{
		p: p, uid: pod.UID, namespace: pod.Namespace, name: pod.Name, deployment: deployment, labels: pod.Labels, annotations: pod.Annotations,
		spec: *pod.Spec.DeepCopy(), dir: filepath.Join(p.o.Dir, pod.Namespace+"_"+pod.Name), created: time.Now(),
		written: map[string]string{}, quit: make(chan struct{}), done: make(chan struct{}),
	}
	switch {
	case len(pod.Spec.Containers) != 1:
		r.unsupported = fmt.Sprintf("%s runs pods of one container; this one has %d", ManagedBy, len(pod.Spec.Containers))
	case len(pod.Spec.InitContainers) > 0:
		r.unsupported = ManagedBy + " runs no init containers"
	case len(pod.Spec.Containers[0].Command) > 0:
		r.unsupported = fmt.Sprintf("%s runs %s in place of the image's entrypoint; this container sets its own command %q", ManagedBy, p.o.Binary, pod.Spec.Containers[0].Command)
	}
	if len(pod.Spec.Containers) > 0 {
		r.container = pod.Spec.Containers[0]
	}
	r.logPath = filepath.Join(r.dir, r.container.Name+".log")
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return nil, err
	}
	for _, cp := range r.container.Ports {
		p.mu.Lock()
		host, err := freePort(p.hostPorts)
		p.mu.Unlock()
		if err != nil {
			return nil, err
		}
		r.ports = append(r.ports, portMap{name: cp.Name, container: cp.ContainerPort, host: host, protocol: cp.Protocol})
	}
	var ports []string
	for _, pm := range r.ports {
		ports = append(ports, fmt.Sprintf("%s=%d->%d", pm.name, pm.container, pm.host))
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		AnnotationPorts: strings.Join(ports, ","), AnnotationLog: r.logPath,
	}}})
	if _, err := p.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: ManagedBy}); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.runs[pod.UID] = r
	p.mu.Unlock()
	if r.unsupported != "" {
		r.update(func(s *runState) { s.waitingReason, s.waitingMessage = "RunContainerError", r.unsupported })
		close(r.done)
		p.logf("pod %s/%s cannot run here: %s", pod.Namespace, pod.Name, r.unsupported)
		return r, nil
	}
	p.logf("pod %s/%s: running %s as its container %q, ports %s, output in %s", pod.Namespace, pod.Name, p.o.Binary, r.container.Name, strings.Join(ports, ","), r.logPath)
	go r.loop()
	return r, nil
}

// freePort returns a TCP port free on this host now, not in used, and
// adds it to used.
func freePort(used map[int32]bool) (int32, error) {
	for range 20 {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return 0, err
		}
		port := int32(l.Addr().(*net.TCPAddr).Port) //nolint:gosec // a port
		_ = l.Close()
		if !used[port] {
			used[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no free port")
}

// loop runs the container until stop: started again after it exits, with
// a back-off, as restartPolicy Always does.
func (r *podRun) loop() {
	defer close(r.done)
	backoff := time.Second
	for {
		cmd, err := r.command()
		if err != nil {
			r.update(func(s *runState) { s.waitingReason, s.waitingMessage = "CreateContainerConfigError", err.Error() })
			if !r.sleep(time.Second) {
				return
			}
			continue
		}
		if err := cmd.Start(); err != nil {
			r.update(func(s *runState) { s.waitingReason, s.waitingMessage = "RunContainerError", err.Error() })
			if !r.sleep(backoff) {
				return
			}
			continue
		}
		started := time.Now()
		r.update(func(s *runState) {
			s.everStarted, s.running, s.ready = true, true, false
			s.containerID = fmt.Sprintf("devcluster://%d", cmd.Process.Pid)
			s.startedAt, s.waitingReason, s.waitingMessage = started, "", ""
		})
		r.p.logf("pod %s/%s: container %s started (pid %d)", r.namespace, r.name, r.container.Name, cmd.Process.Pid)
		r.p.onProcess()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		probing, stopProbes := context.WithCancel(context.Background())
		go r.probe(probing, cmd.Process)
		select {
		case err := <-exited:
			stopProbes()
			r.exited(cmd, started, err)
			if time.Since(started) > time.Minute {
				backoff = time.Second
			}
			r.update(func(s *runState) {
				s.waitingReason, s.waitingMessage = "CrashLoopBackOff", fmt.Sprintf("back-off %s restarting failed container %s", backoff, r.container.Name)
			})
			if !r.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
		case <-r.quit:
			stopProbes()
			_ = cmd.Process.Signal(syscall.SIGTERM)
			grace := time.Duration(ptr.Deref(r.spec.TerminationGracePeriodSeconds, 30)) * time.Second
			var err error
			select {
			case err = <-exited:
			case <-time.After(grace):
				_ = cmd.Process.Kill()
				err = <-exited
			}
			r.exited(cmd, started, err)
			return
		}
	}
}

func (r *podRun) exited(cmd *exec.Cmd, started time.Time, err error) {
	code := int32(0)
	reason := "Completed"
	if err != nil {
		code, reason = 1, "Error"
		if ee := (&exec.ExitError{}); errors.As(err, &ee) {
			code = int32(ee.ExitCode()) //nolint:gosec // an exit code
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int32(ws.Signal())
			}
		}
	}
	r.update(func(s *runState) {
		s.running, s.ready = false, false
		s.restarts++
		s.lastTerm = &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, ContainerID: s.containerID,
			StartedAt: metav1.NewTime(started).Rfc3339Copy(), FinishedAt: metav1.Now().Rfc3339Copy()}
	})
	r.p.logf("pod %s/%s: container %s exited (pid %d, %v)", r.namespace, r.name, r.container.Name, cmd.Process.Pid, err)
	r.p.onProcess()
}

func (r *podRun) sleep(d time.Duration) bool {
	select {
	case <-r.quit:
		return false
	case <-time.After(d):
		return true
	}
}

// stop stops the process (SIGTERM, SIGKILL after the pod's grace period)
// and waits for it.
func (r *podRun) stop() {
	r.stopOnce.Do(func() { close(r.quit) })
	<-r.done
}

func (p *player) onProcess() {
	if p.o.OnProcess != nil {
		p.o.OnProcess()
	}
}

// command is the container's process: the binary, the container's args and
// env as rewriteArgs maps them to this host, the pod's ServiceAccount in a
// kubeconfig (KUBECONFIG: the in-cluster configuration's stand-in).
func (r *podRun) command() (*exec.Cmd, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.syncFiles(ctx); err != nil {
		return nil, err
	}
	mounts := r.mounts()
	args, err := rewriteArgs(r.container.Args, mounts, r.ports)
	if err != nil {
		return nil, err
	}
	env, err := r.environment(ctx, mounts)
	if err != nil {
		return nil, err
	}
	out, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(r.p.o.Binary, args...)
	cmd.Env, cmd.Dir = env, r.dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group (a terminal's Ctrl-C is for devcluster, which
	// stops it), and it dies with us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	fmt.Fprintf(out, "---- %s: %s %s\n", time.Now().Format(time.RFC3339), r.p.o.Binary, strings.Join(args, " "))
	return cmd, nil
}

// probe runs the container's readiness and liveness probes as the kubelet
// does (initial delay, period, thresholds) until ctx ends; a failed
// liveness probe stops the process, which loop then starts again.
func (r *podRun) probe(ctx context.Context, proc *os.Process) {
	rp, lp := r.container.ReadinessProbe, r.container.LivenessProbe
	start := time.Now()
	if rp == nil {
		r.update(func(s *runState) { s.ready = true })
	}
	var nextR, nextL time.Time
	if rp != nil {
		nextR = start.Add(time.Duration(rp.InitialDelaySeconds) * time.Second)
	}
	if lp != nil {
		nextL = start.Add(time.Duration(lp.InitialDelaySeconds) * time.Second)
	}
	var okR, failR, failL int32
	for {
		now := time.Now()
		if rp != nil && !now.Before(nextR) {
			err := r.check(ctx, rp)
			ready := r.snapshot().ready
			if err == nil {
				okR, failR = okR+1, 0
				if !ready && okR >= max(1, rp.SuccessThreshold) {
					r.update(func(s *runState) { s.ready = true })
					r.p.logf("pod %s/%s: ready", r.namespace, r.name)
				}
			} else {
				okR, failR = 0, failR+1
				if ready && failR >= threshold(rp.FailureThreshold) {
					r.update(func(s *runState) { s.ready = false })
					r.p.logf("pod %s/%s: not ready: %v", r.namespace, r.name, err)
				}
			}
			nextR = now.Add(period(rp))
		}
		if lp != nil && !now.Before(nextL) {
			if err := r.check(ctx, lp); err == nil {
				failL = 0
			} else if failL++; failL >= threshold(lp.FailureThreshold) {
				if ctx.Err() != nil {
					return
				}
				r.p.logf("pod %s/%s: liveness probe failed %d times (%v): restarting its container", r.namespace, r.name, failL, err)
				_ = proc.Signal(syscall.SIGTERM)
				return
			}
			nextL = now.Add(period(lp))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func threshold(n int32) int32 {
	if n <= 0 {
		return 3
	}
	return n
}

func period(pr *corev1.Probe) time.Duration {
	if pr.PeriodSeconds <= 0 {
		return 10 * time.Second
	}
	return time.Duration(pr.PeriodSeconds) * time.Second
}

// check runs one probe against the pod's host ports. Exec and gRPC probes
// are not run: they pass.
func (r *podRun) check(ctx context.Context, pr *corev1.Probe) error {
	timeout := time.Duration(max(1, pr.TimeoutSeconds)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case pr.HTTPGet != nil:
		g := pr.HTTPGet
		host := g.Host
		if host == "" {
			host = r.p.o.HostIP
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(int(r.hostPort(g.Port)))), g.Path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for _, h := range g.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		// As the kubelet: no certificate check.
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the kubelet's probes do not verify either
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	case pr.TCPSocket != nil:
		host := pr.TCPSocket.Host
		if host == "" {
			host = r.p.o.HostIP
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(r.hostPort(pr.TCPSocket.Port)))))
		if err != nil {
			return err
		}
		return c.Close()
	}
	return nil
}

// hostPort is the host port of a container port given by name or number (a
// number the container does not declare is used as it is).
func (r *podRun) hostPort(p intstr.IntOrString) int32 {
	for _, pm := range r.ports {
		if (p.Type == intstr.String && pm.name == p.StrVal) || (p.Type == intstr.Int && pm.container == p.IntVal) {
			return pm.host
		}
	}
	return p.IntVal
}

// syncPodStatus writes the pod's status as the kubelet would, when it
// changed.
func (p *player) syncPodStatus(ctx context.Context, pod *corev1.Pod, r *podRun) error {
	s := r.snapshot()
	ip := p.o.HostIP
	st := *pod.Status.DeepCopy()
	st.Phase = corev1.PodPending
	if s.everStarted {
		st.Phase = corev1.PodRunning
	}
	st.HostIP, st.PodIP = ip, ip
	st.HostIPs, st.PodIPs = []corev1.HostIP{{IP: ip}}, []corev1.PodIP{{IP: ip}}
	st.StartTime = ptr.To(metav1.NewTime(r.created).Rfc3339Copy())
	st.Message, st.Reason = "", ""
	ready := corev1.ConditionFalse
	if s.ready {
		ready = corev1.ConditionTrue
	}
	started := corev1.ConditionFalse
	if s.everStarted || r.unsupported == "" {
		started = corev1.ConditionTrue
	}
	st.Conditions = []corev1.PodCondition{
		podCondition(pod.Status.Conditions, corev1.PodReadyToStartContainers, started),
		podCondition(pod.Status.Conditions, corev1.PodInitialized, corev1.ConditionTrue),
		podCondition(pod.Status.Conditions, corev1.PodReady, ready),
		podCondition(pod.Status.Conditions, corev1.ContainersReady, ready),
		podCondition(pod.Status.Conditions, corev1.PodScheduled, corev1.ConditionTrue),
	}
	cs := corev1.ContainerStatus{Name: r.container.Name, Image: r.container.Image, ContainerID: s.containerID,
		Ready: s.ready, Started: ptr.To(s.running), RestartCount: s.restarts, LastTerminationState: corev1.ContainerState{Terminated: s.lastTerm}}
	if s.running {
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(s.startedAt).Rfc3339Copy()}
	} else {
		reason := s.waitingReason
		if reason == "" {
			reason = "ContainerCreating"
		}
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: s.waitingMessage}
	}
	st.ContainerStatuses = []corev1.ContainerStatus{cs}
	if apiequality.Semantic.DeepEqual(st, pod.Status) {
		return nil
	}
	pod = pod.DeepCopy()
	pod.Status = st
	_, err := p.cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{FieldManager: ManagedBy})
	return err
}

func podCondition(old []corev1.PodCondition, t corev1.PodConditionType, s corev1.ConditionStatus) corev1.PodCondition {
	c := corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.Now().Rfc3339Copy()}
	for _, o := range old {
		if o.Type == t && o.Status == s {
			c.LastTransitionTime = o.LastTransitionTime
			c.LastProbeTime = o.LastProbeTime
		}
	}
	return c
}

// runsIn returns the runs of a namespace, by pod name.
func (p *player) runsIn(namespace string) []*podRun {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*podRun
	for _, r := range p.runs {
		if r.namespace == namespace {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

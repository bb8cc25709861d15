// Package localpods runs a Deployment's pods as processes of this machine,
// on a control plane that has no nodes: devcluster's BARE mode (`make
// helm-local`) and the Helm chart's end-to-end test (test/helm), so that
// fencekeeper's chart, installed by helm, runs as it would in a cluster.
//
// For each Deployment its selector picks (by default fencekeeper's,
// app.kubernetes.io/name=fencekeeper) it plays, in the small, the parts of
// a cluster that run one:
//
//   - the deployment and replicaset controllers: a ReplicaSet per pod
//     template, its pods, a new template's pods before the old ones go, the
//     Deployment's and ReplicaSets' status (so `kubectl rollout status` and
//     `helm install --wait` work);
//   - the kubelet: the pod's one container runs as the binary Options.Binary
//     (bin/manager, in place of the image's entrypoint) with the container's
//     args and env, a token of the pod's ServiceAccount (TokenRequest, bound
//     to the pod, refreshed) in a kubeconfig, its Secret, ConfigMap and
//     emptyDir volumes written to a directory the way the kubelet writes
//     them (and rewritten when the Secret changes), its readiness and
//     liveness probes, restarts, and the pod's status; the pod's IP is
//     Options.HostIP and each pod gets ports of its own on it;
//   - the endpointslice controller: an EndpointSlice per Service and pod
//     (label endpointslice.kubernetes.io/managed-by=ManagedBy), with the
//     pod's host ports and its readiness.
//
// With the apiserver's --enable-aggregator-routing (ConfigureAPIServer), the
// apiserver then reaches a webhook's Service through those EndpointSlices,
// dialling HostIP and the pod's port with the Service's DNS name as TLS
// server name, as it would a pod; its service proxy
// (/api/v1/namespaces/NS/services/NAME:PORT/proxy/) reaches the pods too.
//
// What it does not play: image pulls (the image is never looked at),
// resource limits, network namespaces (every pod shares this host's
// network, so the ports a container declares are remapped, see rewriteArgs),
// exec and grpc probes (taken as passing), `kubectl logs` and `exec` (the
// container's output is in Options.Dir), scheduling and nodes (pods name
// NodeName, which has no Node object), garbage collection beyond its own
// objects.
package localpods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

const (
	// ManagedBy marks what this package writes: the EndpointSlices' managed-by
	// label (the endpointslice controller leaves slices it does not manage)
	// and the field manager of its writes.
	ManagedBy = "devcluster.fencekeeper.io"
	// DefaultSelector picks fencekeeper's Deployment (the chart's labels).
	DefaultSelector = "app.kubernetes.io/name=fencekeeper"
	// NodeName is the spec.nodeName of the pods it runs (no such Node exists).
	NodeName = "devcluster"
	// AnnotationPorts on a pod lists its container ports and the host ports
	// its process listens on instead: "webhook=9443->41123,...".
	AnnotationPorts = "devcluster.fencekeeper.io/ports"
	// AnnotationLog on a pod names the file with its container's output.
	AnnotationLog = "devcluster.fencekeeper.io/log"

	labelService   = "kubernetes.io/service-name"
	labelManagedBy = "endpointslice.kubernetes.io/managed-by"
	labelHash      = appsv1.DefaultDeploymentUniqueLabelKey
)

// ConfigureAPIServer makes env's kube-apiserver resolve a Service it calls
// (a webhook's, an APIService's) through the Service's EndpointSlices
// instead of its cluster IP, which nothing routes on a control plane
// without kube-proxy: --enable-aggregator-routing. Webhooks configured by
// URL, as devcluster's own manager's and the envtest suites' are, are not
// affected.
func ConfigureAPIServer(env *envtest.Environment) {
	env.ControlPlane.GetAPIServer().Configure().Set("enable-aggregator-routing", "true")
}

// Options say what Run runs and where.
type Options struct {
	// Config is an identity that may create pods, ReplicaSets,
	// EndpointSlices and ServiceAccount tokens and write statuses (admin).
	// Its Host and CA are also what the pods' kubeconfigs name.
	Config *rest.Config
	// Binary runs in place of each container's image entrypoint.
	Binary string
	// HostIP is the pods' IP: an address of this machine that an
	// EndpointSlice accepts (not loopback).
	HostIP string
	// Dir holds each pod's files (volumes, token, kubeconfig, output).
	Dir string
	// Selector picks the Deployments to run (default DefaultSelector).
	Selector string
	// Log receives one line per thing done (nil: discarded).
	Log io.Writer
	// OnProcess, if set, is called after a container process starts or
	// stops (devcluster records its children for dev-down).
	OnProcess func()
	// Interval between passes over the Deployments (default 500ms).
	Interval time.Duration
}

// Run runs the selected Deployments' pods until ctx ends, then stops their
// processes (it leaves the API objects: the control plane is going away).
func Run(ctx context.Context, o Options) error {
	if o.Config == nil || o.Binary == "" || o.HostIP == "" || o.Dir == "" {
		return errors.New("localpods: Config, Binary, HostIP and Dir are required")
	}
	if _, err := os.Stat(o.Binary); err != nil {
		return fmt.Errorf("localpods: the binary to run: %w", err)
	}
	if o.Selector == "" {
		o.Selector = DefaultSelector
	}
	if _, err := labels.Parse(o.Selector); err != nil {
		return fmt.Errorf("localpods: selector: %w", err)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Interval == 0 {
		o.Interval = 500 * time.Millisecond
	}
	cfg := rest.CopyConfig(o.Config)
	cfg.UserAgent = ManagedBy
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	p := &player{o: o, cs: cs, runs: map[types.UID]*podRun{}, hostPorts: map[int32]bool{}, deployments: map[types.UID]deploymentKey{}, logged: map[string]string{}}
	defer p.stopAll()
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		p.pass(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type deploymentKey struct{ namespace, name string }

type player struct {
	o  Options
	cs kubernetes.Interface

	mu   sync.Mutex
	runs map[types.UID]*podRun // by pod UID
	// hostPorts are the host ports handed out, never twice: a port one
	// pod's container has not bound yet is free to the OS, not to another
	// pod.
	hostPorts map[int32]bool
	// deployments it has run pods for, so that it cleans up after them.
	deployments map[types.UID]deploymentKey
	logOut      sync.Mutex
	logged      map[string]string // last error logged per subject
}

func (p *player) logf(format string, args ...any) {
	p.logOut.Lock()
	defer p.logOut.Unlock()
	fmt.Fprintf(p.o.Log, "localpods: "+format+"\n", args...)
}

// report logs err for subject unless it is the one logged last (a pass
// every half second would repeat it), and notes when it is resolved.
func (p *player) report(subject string, err error) {
	p.logOut.Lock()
	last := p.logged[subject]
	p.logOut.Unlock()
	switch {
	case err == nil && last != "":
		p.logf("%s: ok again", subject)
	case err != nil && err.Error() != last && !apierrors.IsConflict(err):
		p.logf("%s: %v", subject, err)
	}
	p.logOut.Lock()
	if err == nil || !apierrors.IsConflict(err) {
		p.logged[subject] = ""
		if err != nil {
			p.logged[subject] = err.Error()
		}
	}
	p.logOut.Unlock()
}

// pass is one round over the selected Deployments, what is left of deleted
// ones, and the EndpointSlices of every namespace it runs pods in.
func (p *player) pass(ctx context.Context) {
	deps, err := p.cs.AppsV1().Deployments("").List(ctx, metav1.ListOptions{LabelSelector: p.o.Selector})
	if err != nil {
		p.report("listing deployments", err)
		return
	}
	live := map[types.UID]bool{}
	for i := range deps.Items {
		d := &deps.Items[i]
		if d.DeletionTimestamp != nil {
			continue // cleaned up below, as once it is gone
		}
		live[d.UID] = true
		p.mu.Lock()
		p.deployments[d.UID] = deploymentKey{d.Namespace, d.Name}
		p.mu.Unlock()
		p.report("deployment "+d.Namespace+"/"+d.Name, p.syncDeployment(ctx, d))
	}
	p.mu.Lock()
	gone := map[types.UID]deploymentKey{}
	for uid, k := range p.deployments {
		if !live[uid] {
			gone[uid] = k
		}
	}
	p.mu.Unlock()
	for uid, k := range gone {
		err := p.cleanUp(ctx, k.namespace, uid)
		if err == nil {
			err = p.releaseDeployment(ctx, k, uid)
		}
		p.report("removing what deployment "+k.namespace+"/"+k.name+" left", err)
		if err == nil {
			p.logf("deployment %s/%s is gone: its pods are stopped and removed", k.namespace, k.name)
			p.mu.Lock()
			delete(p.deployments, uid)
			p.mu.Unlock()
		}
	}
	p.report("endpointslices", p.syncEndpointSlices(ctx))
}

// syncDeployment plays the deployment and replicaset controllers and the
// kubelet for one Deployment.
func (p *player) syncDeployment(ctx context.Context, d *appsv1.Deployment) error {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return err
	}
	hash := templateHash(&d.Spec.Template)
	want := ptr.Deref(d.Spec.Replicas, 1)
	if d.Spec.Paused {
		want = -1 // keep what runs
	}

	rsList, err := p.cs.AppsV1().ReplicaSets(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return err
	}
	var current *appsv1.ReplicaSet
	var old []*appsv1.ReplicaSet
	for i := range rsList.Items {
		rs := &rsList.Items[i]
		if !metav1.IsControlledBy(rs, d) {
			continue
		}
		if rs.Labels[labelHash] == hash {
			current = rs
		} else {
			old = append(old, rs)
		}
	}
	if current == nil && want >= 0 {
		if current, err = p.createReplicaSet(ctx, d, hash, want); err != nil {
			return err
		}
		p.logf("deployment %s/%s: replicaset %s (%d replicas)", d.Namespace, d.Name, current.Name, want)
	}
	if current != nil && want >= 0 && ptr.Deref(current.Spec.Replicas, 1) != want {
		current.Spec.Replicas = &want
		if current, err = p.cs.AppsV1().ReplicaSets(d.Namespace).Update(ctx, current, metav1.UpdateOptions{FieldManager: ManagedBy}); err != nil {
			return err
		}
	}

	podList, err := p.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return err
	}
	byRS := map[types.UID][]*corev1.Pod{}
	for i := range podList.Items {
		pod := &podList.Items[i]
		if ref := metav1.GetControllerOf(pod); ref != nil {
			byRS[ref.UID] = append(byRS[ref.UID], pod)
		}
	}
	var errs []error
	all := old
	if current != nil {
		all = append(all, current)
	}
	for _, rs := range all {
		for _, pod := range byRS[rs.UID] {
			errs = append(errs, p.kubelet(ctx, d.UID, pod))
		}
	}

	// The replicaset controller, for the current template: its pods.
	var currentLive, currentReady int32
	if current != nil {
		pods := livePods(byRS[current.UID])
		currentLive = int32(len(pods))
		for _, pod := range pods {
			if p.ready(pod.UID) {
				currentReady++
			}
		}
		n := ptr.Deref(current.Spec.Replicas, 1)
		for i := currentLive; i < n; i++ {
			if err := p.createPod(ctx, current); err != nil {
				errs = append(errs, err)
				break
			}
		}
		if currentLive > n {
			// Scaling down: the pods that are not ready go first.
			sort.Slice(pods, func(i, j int) bool {
				ri, rj := p.ready(pods[i].UID), p.ready(pods[j].UID)
				if ri != rj {
					return !ri
				}
				return pods[i].Name < pods[j].Name
			})
			for _, pod := range pods[:currentLive-n] {
				errs = append(errs, p.deletePod(ctx, pod))
			}
		}
		errs = append(errs, p.syncReplicaSetStatus(ctx, current, byRS[current.UID]))
	}
	// The deployment controller: an old template's pods go once the current
	// template's are all ready (all at once: a new one's ports never clash).
	if current != nil && currentReady >= ptr.Deref(current.Spec.Replicas, 1) {
		for _, rs := range old {
			pods := byRS[rs.UID]
			for _, pod := range livePods(pods) {
				errs = append(errs, p.deletePod(ctx, pod))
			}
			if len(pods) == 0 {
				errs = append(errs, ignoreNotFound(p.cs.AppsV1().ReplicaSets(rs.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{})))
			}
		}
	}
	errs = append(errs, p.syncDeploymentStatus(ctx, d, current, all, byRS))
	return errors.Join(errs...)
}

func livePods(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// templateHash names a pod template's ReplicaSet (the deployment
// controller's pod-template-hash plays the same part).
func templateHash(t *corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(t)
	h := fnv.New32a()
	_, _ = h.Write(b)
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

func (p *player) createReplicaSet(ctx context.Context, d *appsv1.Deployment, hash string, replicas int32) (*appsv1.ReplicaSet, error) {
	tmpl := d.Spec.Template.DeepCopy()
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[labelHash] = hash
	sel := d.Spec.Selector.DeepCopy()
	if sel.MatchLabels == nil {
		sel.MatchLabels = map[string]string{}
	}
	sel.MatchLabels[labelHash] = hash
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: d.Name + "-" + hash, Namespace: d.Namespace, Labels: tmpl.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: &replicas, Selector: sel, Template: *tmpl},
	}
	return p.cs.AppsV1().ReplicaSets(d.Namespace).Create(ctx, rs, metav1.CreateOptions{FieldManager: ManagedBy})
}

func (p *player) createPod(ctx context.Context, rs *appsv1.ReplicaSet) error {
	t := rs.Spec.Template.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: rs.Name + "-", Namespace: rs.Namespace, Labels: t.Labels, Annotations: t.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))},
		},
		Spec: t.Spec,
	}
	pod.Spec.NodeName = NodeName
	created, err := p.cs.CoreV1().Pods(rs.Namespace).Create(ctx, pod, metav1.CreateOptions{FieldManager: ManagedBy})
	if err != nil {
		return fmt.Errorf("creating a pod of %s: %w", rs.Name, err)
	}
	p.logf("pod %s/%s created", created.Namespace, created.Name)
	return nil
}

// deletePod deletes a pod the way a controller does: gracefully; the
// kubelet part then stops its process and removes it.
func (p *player) deletePod(ctx context.Context, pod *corev1.Pod) error {
	return ignoreNotFound(p.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}))
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (p *player) ready(uid types.UID) bool {
	p.mu.Lock()
	r := p.runs[uid]
	p.mu.Unlock()
	return r != nil && r.snapshot().ready
}

func (p *player) syncReplicaSetStatus(ctx context.Context, rs *appsv1.ReplicaSet, pods []*corev1.Pod) error {
	var n, ready int32
	for _, pod := range livePods(pods) {
		n++
		if p.ready(pod.UID) {
			ready++
		}
	}
	st := appsv1.ReplicaSetStatus{Replicas: n, FullyLabeledReplicas: n, ReadyReplicas: ready, AvailableReplicas: ready, ObservedGeneration: rs.Generation}
	if apiequality.Semantic.DeepEqual(st, rs.Status) {
		return nil
	}
	rs = rs.DeepCopy()
	rs.Status = st
	_, err := p.cs.AppsV1().ReplicaSets(rs.Namespace).UpdateStatus(ctx, rs, metav1.UpdateOptions{FieldManager: ManagedBy})
	return err
}

func (p *player) syncDeploymentStatus(ctx context.Context, d *appsv1.Deployment, current *appsv1.ReplicaSet, all []*appsv1.ReplicaSet, byRS map[types.UID][]*corev1.Pod) error {
	want := ptr.Deref(d.Spec.Replicas, 1)
	var total, updated, ready int32
	for _, rs := range all {
		for _, pod := range livePods(byRS[rs.UID]) {
			total++
			if current != nil && rs.UID == current.UID {
				updated++
			}
			if p.ready(pod.UID) {
				ready++
			}
		}
	}
	maxUnavailable := int32(0)
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		if v, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, int(want), false); err == nil {
			maxUnavailable = int32(v) //nolint:gosec // at most want
		}
	}
	available := corev1.ConditionFalse
	availableReason := "MinimumReplicasUnavailable"
	if ready >= want-maxUnavailable {
		available, availableReason = corev1.ConditionTrue, "MinimumReplicasAvailable"
	}
	progressingReason := "ReplicaSetUpdated"
	if updated == want && total == updated && ready >= want {
		progressingReason = "NewReplicaSetAvailable"
	}
	newRS := ""
	if current != nil {
		newRS = current.Name
	}
	st := appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation, Replicas: total, UpdatedReplicas: updated, ReadyReplicas: ready,
		AvailableReplicas: ready, UnavailableReplicas: max(0, want-ready),
		Conditions: []appsv1.DeploymentCondition{
			keepTimes(d.Status.Conditions, appsv1.DeploymentCondition{Type: appsv1.DeploymentAvailable, Status: available, Reason: availableReason,
				Message: fmt.Sprintf("%d of %d replicas ready (run as local processes by %s)", ready, want, ManagedBy)}),
			keepTimes(d.Status.Conditions, appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: progressingReason,
				Message: fmt.Sprintf("ReplicaSet %q: %d of %d updated replicas ready", newRS, ready, want)}),
		},
	}
	if d.Spec.Paused {
		st.Conditions[1].Reason, st.Conditions[1].Status = "DeploymentPaused", corev1.ConditionUnknown
	}
	if apiequality.Semantic.DeepEqual(st, d.Status) {
		return nil
	}
	d = d.DeepCopy()
	d.Status = st
	_, err := p.cs.AppsV1().Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{FieldManager: ManagedBy})
	return err
}

// keepTimes gives c the times of the same condition in old when neither its
// status nor its reason or message changed.
func keepTimes(old []appsv1.DeploymentCondition, c appsv1.DeploymentCondition) appsv1.DeploymentCondition {
	now := metav1.Now().Rfc3339Copy()
	c.LastUpdateTime, c.LastTransitionTime = now, now
	for _, o := range old {
		if o.Type != c.Type {
			continue
		}
		if o.Status == c.Status {
			c.LastTransitionTime = o.LastTransitionTime
			if o.Reason == c.Reason && o.Message == c.Message {
				c.LastUpdateTime = o.LastUpdateTime
			}
		}
	}
	return c
}

// cleanUp removes what a deleted Deployment left (nothing collects the
// garbage here): its ReplicaSets' pods, whose processes it stops first, and
// the ReplicaSets.
func (p *player) cleanUp(ctx context.Context, namespace string, deployment types.UID) error {
	rsList, err := p.cs.AppsV1().ReplicaSets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	owned := map[types.UID]bool{}
	for _, rs := range rsList.Items {
		if ref := metav1.GetControllerOf(&rs); ref != nil && ref.UID == deployment {
			owned[rs.UID] = true
		}
	}
	podList, err := p.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(podList.Items))
	for i := range podList.Items {
		pod := &podList.Items[i]
		if ref := metav1.GetControllerOf(pod); ref == nil || !owned[ref.UID] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.stopAndRemove(ctx, pod)
		}()
	}
	wg.Wait()
	// Runs of pods deleted by someone else meanwhile.
	p.mu.Lock()
	var orphans []*podRun
	for _, r := range p.runs {
		if r.deployment == deployment {
			orphans = append(orphans, r)
		}
	}
	p.mu.Unlock()
	for _, r := range orphans {
		r.stop()
		p.forget(r)
	}
	for _, rs := range rsList.Items {
		if owned[rs.UID] {
			errs = append(errs, ignoreNotFound(p.cs.AppsV1().ReplicaSets(namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{})))
		}
	}
	return errors.Join(errs...)
}

// releaseDeployment takes the garbage collector's finalizers off a
// Deployment deleted in the foreground (or orphaning): its dependents are
// gone (cleanUp) and no garbage collector runs here to do it.
func (p *player) releaseDeployment(ctx context.Context, k deploymentKey, uid types.UID) error {
	d, err := p.cs.AppsV1().Deployments(k.namespace).Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && d.UID != uid) {
		return nil
	}
	if err != nil {
		return err
	}
	kept := d.Finalizers[:0:0]
	for _, f := range d.Finalizers {
		if f != metav1.FinalizerDeleteDependents && f != metav1.FinalizerOrphanDependents {
			kept = append(kept, f)
		}
	}
	if len(kept) == len(d.Finalizers) {
		return nil
	}
	d.Finalizers = kept
	_, err = p.cs.AppsV1().Deployments(k.namespace).Update(ctx, d, metav1.UpdateOptions{FieldManager: ManagedBy})
	return ignoreNotFound(err)
}

// stopAndRemove stops a pod's process and deletes the pod at once (the
// kubelet's last word on a pod).
func (p *player) stopAndRemove(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	r := p.runs[pod.UID]
	p.mu.Unlock()
	if r != nil {
		r.stop()
		p.forget(r)
	}
	err := ignoreNotFound(p.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}}))
	if err == nil && r != nil {
		p.logf("pod %s/%s stopped and removed", pod.Namespace, pod.Name)
	}
	return err
}

func (p *player) forget(r *podRun) {
	p.mu.Lock()
	delete(p.runs, r.uid)
	p.mu.Unlock()
	_ = os.RemoveAll(r.dir + "/volumes")
}

func (p *player) stopAll() {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.runs))
	for _, r := range p.runs {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop() }()
	}
	wg.Wait()
}

// namespacesRun lists the namespaces with pods running here.
func (p *player) namespacesRun() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, r := range p.runs {
		if !seen[r.namespace] {
			seen[r.namespace] = true
			out = append(out, r.namespace)
		}
	}
	sort.Strings(out)
	return out
}

func shortName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimRight(s[:n], "-.")
}

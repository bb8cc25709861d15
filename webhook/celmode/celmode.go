// Package celmode is the CEL enforcement mode (docs/design.md §3): the
// fencing rules as a MutatingAdmissionPolicy and two
// ValidatingAdmissionPolicies evaluated inside the apiserver, with no webhook
// hop. The manager applies the policies (Install) and keeps three bindings
// per lock name whose parameter is the lock's Lease (Bindings, kept in line
// by controllers/celmode).
//
// The policies live in policies.yaml; webhook/fencing.Decide is the same
// table in Go, and test/celmode runs one rule table against both modes.
package celmode

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook"
)

//go:embed policies.yaml
var policiesYAML []byte

// Names of the objects Install applies.
const (
	PolicyName     = "fencekeeper-fencing"
	BasePolicyName = "fencekeeper-fencing-base"
	// LeaseRequiredPolicyName refuses the creation of an object fenced by a
	// lock that has no Lease in the object's namespace (its per-lock binding
	// has parameterNotFoundAction Deny), as the webhook does: no epoch of
	// that lock was ever issued there, so no create can present one.
	LeaseRequiredPolicyName = fkv1.LeaseRequiredPolicy
	// FieldOwner is the server-side-apply field manager of every object
	// this package writes.
	FieldOwner = "fencekeeper-cel-mode"
	// bindingPrefix starts the name of a lock's mutating and fencing
	// bindings, leaseRequiredPrefix that of its lease-required binding (no
	// lock name starts with "-", so the two never collide).
	bindingPrefix       = "fencekeeper-lock-"
	leaseRequiredPrefix = "fencekeeper-lock--create-"
)

// Options shape the policies.
type Options struct {
	Guarded []webhook.GuardedResource
	// ExcludedNamespaces are never checked (kube-system and the manager's
	// own namespace), as with the webhook.
	ExcludedNamespaces []string
}

// Policies are the policy objects for o: the mutating policy, the three
// validating policies and the base policy's binding.
type Policies struct {
	Mutating      *admissionregistrationv1.MutatingAdmissionPolicy
	Validating    *admissionregistrationv1.ValidatingAdmissionPolicy
	LeaseRequired *admissionregistrationv1.ValidatingAdmissionPolicy
	Base          *admissionregistrationv1.ValidatingAdmissionPolicy
	BaseBinding   *admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// Objects returns them in apply order: the validating policies (and the
// base binding) before the mutating one, so that a change never has the
// mutating policy consume tokens that no validating policy checks.
func (p Policies) Objects() []client.Object {
	return []client.Object{p.Validating, p.LeaseRequired, p.Base, p.BaseBinding, p.Mutating}
}

// Render builds the policies for o from policies.yaml.
func Render(o Options) (Policies, error) {
	if len(o.Guarded) == 0 {
		return Policies{}, errors.New("cel mode: no guarded resources")
	}
	if !slices.ContainsFunc(o.Guarded, func(g webhook.GuardedResource) bool { return g.Group == "" && g.Resource == "configmaps" }) {
		return Policies{}, errors.New("cel mode: configmaps must be among the guarded resources: before it binds a lock's mutating policy, " +
			"the manager proves the lock's fencing binding in force on every apiserver with a dry-run ConfigMap fenced by the lock")
	}
	var p Policies
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(policiesYAML), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return Policies{}, fmt.Errorf("policies.yaml: %w", err)
		}
		if raw == nil {
			continue
		}
		kind, _ := raw["kind"].(string)
		meta, _ := raw["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		var target any
		switch {
		case kind == "MutatingAdmissionPolicy":
			p.Mutating = &admissionregistrationv1.MutatingAdmissionPolicy{}
			target = p.Mutating
		case kind == "ValidatingAdmissionPolicy" && name == PolicyName:
			p.Validating = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			target = p.Validating
		case kind == "ValidatingAdmissionPolicy" && name == LeaseRequiredPolicyName:
			p.LeaseRequired = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			target = p.LeaseRequired
		case kind == "ValidatingAdmissionPolicy" && name == BasePolicyName:
			p.Base = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			target = p.Base
		case kind == "ValidatingAdmissionPolicyBinding":
			p.BaseBinding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			target = p.BaseBinding
		default:
			return Policies{}, fmt.Errorf("policies.yaml: unexpected %s %s", kind, name)
		}
		if err := fromMap(raw, target); err != nil {
			return Policies{}, fmt.Errorf("policies.yaml %s %s: %w", kind, name, err)
		}
	}
	if p.Mutating == nil || p.Validating == nil || p.LeaseRequired == nil || p.Base == nil || p.BaseBinding == nil {
		return Policies{}, errors.New("policies.yaml: a policy or the base binding is missing")
	}
	all := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}
	writes := all[:2]
	ns := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: o.ExcludedNamespaces,
	}}}
	if len(o.ExcludedNamespaces) == 0 {
		ns = nil
	}
	p.Mutating.Spec.MatchConstraints.ResourceRules = rules(o.Guarded, writes)
	p.Mutating.Spec.MatchConstraints.NamespaceSelector = ns
	p.Validating.Spec.MatchConstraints.ResourceRules = rules(o.Guarded, all)
	p.Validating.Spec.MatchConstraints.NamespaceSelector = ns
	p.LeaseRequired.Spec.MatchConstraints.ResourceRules = rules(o.Guarded, all[:1])
	p.LeaseRequired.Spec.MatchConstraints.NamespaceSelector = ns
	// The base policy also sees status writes (fencingMetaChanged).
	p.Base.Spec.MatchConstraints.ResourceRules = append(rules(o.Guarded, all), subresourceRules(o.Guarded, "status")...)
	p.Base.Spec.MatchConstraints.NamespaceSelector = ns
	return p, nil
}

func rules(guarded []webhook.GuardedResource, ops []admissionregistrationv1.OperationType) []admissionregistrationv1.NamedRuleWithOperations {
	out := make([]admissionregistrationv1.NamedRuleWithOperations, 0, len(guarded))
	for _, g := range guarded {
		out = append(out, admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{g.Group}, APIVersions: []string{g.Version}, Resources: []string{g.Resource},
				Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		}})
	}
	return out
}

// subresourceRules match UPDATE of sub of the guarded kinds.
func subresourceRules(guarded []webhook.GuardedResource, sub string) []admissionregistrationv1.NamedRuleWithOperations {
	out := rules(guarded, []admissionregistrationv1.OperationType{admissionregistrationv1.Update})
	for i := range out {
		out[i].Resources = []string{out[i].Resources[0] + "/" + sub}
	}
	return out
}

// Install applies the policies with server-side apply (idempotent; it takes
// the fields over from whoever changed them).
func Install(ctx context.Context, c client.Client, p Policies) error {
	for _, obj := range p.Objects() {
		// apply reads the live object into what it is given: p stays as
		// rendered, for the next Install.
		if err := apply(ctx, c, obj.DeepCopyObject().(client.Object)); err != nil {
			return err
		}
	}
	return nil
}

// BindingName is the name of lock's mutating and fencing bindings: the
// lock name after a prefix, or a hash of it when that would be too long.
func BindingName(lock string) string { return prefixed(bindingPrefix, lock) }

// LeaseRequiredBindingName is the name of lock's lease-required binding.
func LeaseRequiredBindingName(lock string) string { return prefixed(leaseRequiredPrefix, lock) }

func prefixed(prefix, lock string) string {
	if n := prefix + lock; len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(lock))
	return prefix + hex.EncodeToString(sum[:16])
}

// LockBindings are one lock's three bindings. Objects labelled with the
// lock are checked against the Lease named after it in their own namespace.
// Where that Lease is missing, Mutating and Validating are skipped
// (parameterNotFoundAction Allow: metadata-only writes, the garbage
// collector and namespace deletion must still pass), and the base policy
// refuses any presented epoch, because the mutating one did not consume it;
// LeaseRequired (Deny) refuses every create.
type LockBindings struct {
	Mutating      *admissionregistrationv1.MutatingAdmissionPolicyBinding
	Validating    *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	LeaseRequired *admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// Objects returns the bindings in creation order (the validating ones
// first; removal goes the other way).
func (b LockBindings) Objects() []client.Object {
	return []client.Object{b.Validating, b.LeaseRequired, b.Mutating}
}

// Bindings returns lock's bindings.
func Bindings(lock string) LockBindings {
	meta := metav1.ObjectMeta{
		Name:   BindingName(lock),
		Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock},
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{fkv1.LabelLock: lock}}
	allow := ptr.To(admissionregistrationv1.AllowAction)
	m := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicyBinding"},
		ObjectMeta: *meta.DeepCopy(),
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{
			PolicyName:     PolicyName,
			ParamRef:       &admissionregistrationv1.ParamRef{Name: lock, ParameterNotFoundAction: allow},
			MatchResources: &admissionregistrationv1.MatchResources{ObjectSelector: sel.DeepCopy()},
		},
	}
	v := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: *meta.DeepCopy(),
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        PolicyName,
			ParamRef:          &admissionregistrationv1.ParamRef{Name: lock, ParameterNotFoundAction: allow},
			MatchResources:    &admissionregistrationv1.MatchResources{ObjectSelector: sel.DeepCopy()},
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	lr := v.DeepCopy()
	lr.Name = LeaseRequiredBindingName(lock)
	lr.Spec.PolicyName = LeaseRequiredPolicyName
	lr.Spec.ParamRef.ParameterNotFoundAction = ptr.To(admissionregistrationv1.DenyAction)
	return LockBindings{Mutating: m, Validating: v, LeaseRequired: lr}
}

// LockOf returns the lock a per-lock binding is for ("" for other objects).
func LockOf(obj client.Object) string {
	if obj.GetLabels()[fkv1.LabelManagedBy] != fkv1.ManagedByValue || !strings.HasPrefix(obj.GetName(), bindingPrefix) {
		return ""
	}
	return obj.GetLabels()[fkv1.LabelLock]
}

// apply creates obj, or updates the stored one when its labels,
// annotations or spec differ (controllerutil.CreateOrUpdate: no write when
// nothing changed; labels and annotations obj lacks are kept).
func apply(ctx context.Context, c client.Client, obj client.Object) error {
	want := obj.DeepCopyObject().(client.Object)
	_, err := controllerutil.CreateOrUpdate(ctx, c, obj, func() error {
		obj.SetLabels(merged(obj.GetLabels(), want.GetLabels()))
		if len(want.GetAnnotations()) > 0 {
			obj.SetAnnotations(merged(obj.GetAnnotations(), want.GetAnnotations()))
		}
		return copySpec(want, obj)
	})
	if err != nil {
		return fmt.Errorf("applying %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

func merged(into, from map[string]string) map[string]string {
	if into == nil {
		into = map[string]string{}
	}
	for k, v := range from {
		into[k] = v
	}
	return into
}

// copySpec copies the spec of from into to (same kind), so fields someone
// added (matchConditions, another paramRef) are reverted. The apiserver
// fills in defaults again, and an update that changes nothing writes
// nothing (no new resourceVersion, no watch event).
func copySpec(from, to client.Object) error {
	switch f := from.(type) {
	case *admissionregistrationv1.MutatingAdmissionPolicy:
		to.(*admissionregistrationv1.MutatingAdmissionPolicy).Spec = *f.Spec.DeepCopy()
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		to.(*admissionregistrationv1.ValidatingAdmissionPolicy).Spec = *f.Spec.DeepCopy()
	case *admissionregistrationv1.MutatingAdmissionPolicyBinding:
		to.(*admissionregistrationv1.MutatingAdmissionPolicyBinding).Spec = *f.Spec.DeepCopy()
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		to.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding).Spec = *f.Spec.DeepCopy()
	default:
		return fmt.Errorf("cel mode: cannot apply %T", from)
	}
	return nil
}

// LoadDelay is about how long one apiserver takes to put a binding change
// in force (each reloads its policies and bindings on a 1-second timer after
// its informer delivers the change), for people and tests that wait for a
// change they cannot probe. Nothing in this package orders on it: a step
// that must wait for the apiserver to load a binding waits for proof from
// every apiserver instance (Prover), never for a time (docs/design.md §3).
const LoadDelay = 3 * time.Second

// ProvenAnnotation, on a lock's mutating binding, is the UID of the fencing
// (validating) binding that every apiserver instance was proven to enforce
// before the mutating binding was created. A mutating binding that records
// another UID (the validating one was deleted and created again since) or
// none is deleted, and created again only after a new proof.
const ProvenAnnotation = fkv1.Prefix + "proven-validating-binding"

// The kubernetes Service, whose EndpointSlices list the apiserver instances.
const (
	apiServerServiceNamespace = "default"
	apiServerServiceName      = "kubernetes"
)

// ProbeTimeout bounds one probe request to one apiserver instance.
const ProbeTimeout = 10 * time.Second

// maxProbeNamespaces is how many namespaces holding the lock's Lease a
// probe tries per instance (some may be excluded from the policies, or
// terminating).
const maxProbeNamespaces = 4

// Probe is a dry-run create of a ConfigMap fenced by Lock, sent to every
// apiserver instance, that each must refuse with Want from Lock's fencing
// binding (BindingName): the denial message must carry
// "ValidatingAdmissionPolicy 'fencekeeper-fencing' with binding
// '<binding>' denied request: fencekeeper.io/<Want>:". Anything else (an
// acceptance, another rule, another binding, an error) proves nothing.
type Probe struct {
	Lock string
	// Annotations of the probe object.
	Annotations map[string]string
	Want        fkv1.AdmissionReason
	// What the refusal proves, for messages.
	What string
}

// FencingInForce is refused (MissingEpoch) exactly where the lock's fencing
// binding is in force: the probe presents no epoch and carries no
// watermark, so the mutating policy leaves it alone whether or not its
// binding is loaded, the base policy passes it (no token), and the
// lease-required binding passes it (it is sent where the Lease exists);
// only the fencing binding refuses a content write that presents no epoch.
func FencingInForce(lock string) Probe {
	return Probe{Lock: lock, Want: fkv1.AdmissionMissingEpoch, What: "the fencing binding " + BindingName(lock) + " is in force"}
}

// MutatingGone is refused with MalformedEpoch exactly where the lock's
// fencing binding is in force and its mutating binding no longer is: the
// probe carries a malformed watermark (fenced-epoch "0") and no token. A
// loaded mutating binding removes that watermark (a content write that
// presents no epoch loses it), and the fencing binding then says
// MissingEpoch instead.
func MutatingGone(lock string) Probe {
	return Probe{Lock: lock, Annotations: map[string]string{fkv1.AnnotationFencedEpoch: "0"}, Want: fkv1.AdmissionMalformedEpoch,
		What: "the mutating binding " + BindingName(lock) + " is gone and the fencing binding is in force"}
}

// Prover proves a probe's refusal on every apiserver instance.
type Prover interface {
	// Prove returns nil once every instance refused probe as it must, in
	// one of namespaces; a *PendingError says which did not, and why.
	Prove(ctx context.Context, probe Probe, namespaces []string) error
}

// PendingError says a binding step waits for proof: retry later.
type PendingError struct {
	// Step is what waits ("creating the mutating binding fencekeeper-lock-x").
	Step string
	// Reasons, one per apiserver instance that gave no proof.
	Reasons []string
}

func (e *PendingError) Error() string {
	return e.Step + " waits for proof from every apiserver instance: " + strings.Join(e.Reasons, "; ")
}

// IsPending reports whether err is (or wraps) a *PendingError.
func IsPending(err error) bool {
	var p *PendingError
	return errors.As(err, &p)
}

// InstanceProver is the Prover that sends each probe straight to each
// endpoint of the default/kubernetes Service's EndpointSlices (each
// apiserver instance loads policies and bindings on its own, so an answer
// through the Service's load balancing proves nothing about the others).
// It copies the manager's rest.Config per endpoint: Host is the endpoint,
// and TLS verifies the serving certificate against the host name the
// manager uses (the instances' certificates name the Service or load
// balancer, not their own addresses).
type InstanceProver struct {
	cfg *rest.Config
	// live reads the EndpointSlices (never from a cache).
	live client.Reader

	mu      sync.Mutex
	clients map[string]corev1client.ConfigMapsGetter
}

// NewProver returns the InstanceProver for the manager's cfg; live reads
// the EndpointSlices from the apiserver (the manager's API reader).
func NewProver(cfg *rest.Config, live client.Reader) *InstanceProver {
	return &InstanceProver{cfg: cfg, live: live, clients: map[string]corev1client.ConfigMapsGetter{}}
}

// Endpoints are the apiserver instances the default/kubernetes Service's
// EndpointSlices list, as host:port (every address, whatever its
// conditions say: an instance that still answers still admits writes).
func (p *InstanceProver) Endpoints(ctx context.Context) ([]string, error) {
	var list discoveryv1.EndpointSliceList
	if err := p.live.List(ctx, &list, client.InNamespace(apiServerServiceNamespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: apiServerServiceName}); err != nil {
		return nil, fmt.Errorf("listing the EndpointSlices of Service %s/%s: %w", apiServerServiceNamespace, apiServerServiceName, err)
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range list.Items {
		port, err := httpsPort(s.Ports)
		if err != nil {
			return nil, fmt.Errorf("EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				if hp := net.JoinHostPort(a, port); !seen[hp] {
					seen[hp] = true
					out = append(out, hp)
				}
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func httpsPort(ports []discoveryv1.EndpointPort) (string, error) {
	var found *int32
	for _, p := range ports {
		if p.Port == nil {
			continue
		}
		if p.Name != nil && *p.Name == "https" {
			return strconv.Itoa(int(*p.Port)), nil
		}
		if found != nil {
			return "", errors.New("several ports and none named https")
		}
		found = p.Port
	}
	if found == nil {
		return "", errors.New("no port")
	}
	return strconv.Itoa(int(*found)), nil
}

// Prove sends probe to every instance Endpoints lists, in parallel, each
// trying up to a few of namespaces (which must hold a Lease named after the
// lock: without one the fencing binding skips the object) until one
// refusal proves it there.
func (p *InstanceProver) Prove(ctx context.Context, probe Probe, namespaces []string) error {
	step := "proving " + probe.What
	eps, err := p.Endpoints(ctx)
	if err != nil {
		return &PendingError{Step: step, Reasons: []string{err.Error()}}
	}
	if len(eps) == 0 {
		return &PendingError{Step: step, Reasons: []string{fmt.Sprintf(
			"the EndpointSlices of Service %s/%s list no apiserver instance to probe", apiServerServiceNamespace, apiServerServiceName)}}
	}
	if len(namespaces) == 0 {
		return &PendingError{Step: step, Reasons: []string{"no namespace holds a Lease named " + probe.Lock + " to probe in (the bindings do nothing until one does)"}}
	}
	namespaces = slices.Clone(namespaces)
	rand.Shuffle(len(namespaces), func(i, j int) { namespaces[i], namespaces[j] = namespaces[j], namespaces[i] })
	namespaces = namespaces[:min(len(namespaces), maxProbeNamespaces)]
	p.forgetExcept(eps)
	reasons := make([]string, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reasons[i] = p.proveOn(ctx, ep, probe, namespaces)
		}()
	}
	wg.Wait()
	var missing []string
	for _, r := range reasons {
		if r != "" {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return &PendingError{Step: step, Reasons: missing}
	}
	return nil
}

// proveOn returns "" when instance ep refused probe as it must in one of
// namespaces, else why not.
func (p *InstanceProver) proveOn(ctx context.Context, ep string, probe Probe, namespaces []string) string {
	cms, err := p.clientFor(ep)
	if err != nil {
		return ep + ": " + err.Error()
	}
	want := fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: %s%s:", PolicyName, BindingName(probe.Lock), fkv1.Prefix, probe.Want)
	var notes []string
	for _, ns := range namespaces {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "fencekeeper-binding-probe-", Namespace: ns,
				Labels: map[string]string{fkv1.LabelLock: probe.Lock}, Annotations: probe.Annotations},
			Data: map[string]string{"probe": "a dry run the fencekeeper manager expects the apiserver to refuse"},
		}
		_, err := cms.ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: FieldOwner})
		var status apierrors.APIStatus
		switch {
		case err == nil:
			notes = append(notes, ns+": accepted")
		case errors.As(err, &status) && strings.Contains(status.Status().Message, want):
			return ""
		default:
			notes = append(notes, ns+": "+err.Error())
		}
	}
	return fmt.Sprintf("%s: not refused with %s by %s (%s)", ep, probe.Want, BindingName(probe.Lock), strings.Join(notes, "; "))
}

// clientFor returns the ConfigMap client that talks to instance ep only.
func (p *InstanceProver) clientFor(ep string) (corev1client.ConfigMapsGetter, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[ep]; ok {
		return c, nil
	}
	cfg, err := instanceConfig(p.cfg, ep)
	if err != nil {
		return nil, err
	}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	p.clients[ep] = c
	return c, nil
}

// forgetExcept drops the clients of instances no longer listed.
func (p *InstanceProver) forgetExcept(eps []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ep := range p.clients {
		if !slices.Contains(eps, ep) {
			delete(p.clients, ep)
		}
	}
}

// instanceConfig is cfg aimed at instance ep (host:port): same credentials,
// same scheme, no path prefix, and TLS that verifies the certificate
// against cfg's host name.
func instanceConfig(cfg *rest.Config, ep string) (*rest.Config, error) {
	host := cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("parsing the manager's apiserver address %q: %w", cfg.Host, err)
	}
	out := rest.CopyConfig(cfg)
	out.Host = u.Scheme + "://" + ep
	if out.ServerName == "" {
		out.ServerName = u.Hostname()
	}
	out.Timeout = ProbeTimeout
	return out, nil
}

// EnsureBindings creates or repairs lock's three bindings, the validating
// ones first: while only the mutating binding were in force, tokens would be
// consumed into the watermark and nothing would check them. The mutating
// binding is created only once every apiserver instance refuses
// FencingInForce (p), in a namespace the policies check that holds the
// lock's Lease (c's cache of managed Leases): until then EnsureBindings
// returns a *PendingError, and presented epochs of the lock are refused
// (nothing consumes them). While no such namespace holds one, it creates
// no mutating binding and returns nil (the Lease's event comes back). A
// mutating binding whose ProvenAnnotation does not name the validating
// binding as it is now (someone deleted and re-created it) is deleted
// first, and created again after a new proof.
func EnsureBindings(ctx context.Context, c client.Client, p Prover, lock string) error {
	b := Bindings(lock)
	m, v := b.Mutating, b.Validating
	if err := apply(ctx, c, v); err != nil {
		return err
	}
	if err := apply(ctx, c, b.LeaseRequired); err != nil {
		return err
	}
	m.Annotations = map[string]string{ProvenAnnotation: string(v.UID)}
	var cur admissionregistrationv1.MutatingAdmissionPolicyBinding
	err := c.Get(ctx, client.ObjectKeyFromObject(m), &cur)
	switch {
	case err == nil && cur.Annotations[ProvenAnnotation] == string(v.UID):
		return apply(ctx, c, m)
	case err == nil:
		if err := c.Delete(ctx, &cur, client.Preconditions{UID: ptr.To(cur.UID)}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %s, not proven against %s uid %s: %w", m.Name, v.Name, v.UID, err)
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading %s: %w", m.Name, err)
	}
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.MatchingLabels{fkv1.LabelManagedBy: fkv1.ManagedByValue, fkv1.LabelLock: lock}); err != nil {
		return fmt.Errorf("listing Leases of lock %s: %w", lock, err)
	}
	var namespaces []string
	for _, l := range leases.Items {
		if l.Name == lock {
			namespaces = append(namespaces, l.Namespace)
		}
	}
	namespaces, err = policed(ctx, c, namespaces)
	if err != nil {
		return &PendingError{Step: "creating the mutating binding " + m.Name, Reasons: []string{err.Error()}}
	}
	if len(namespaces) == 0 {
		// No namespace the policies check holds the lock's Lease: there the
		// mutating binding would do nothing yet, and it must not be in
		// force unproven when the first one comes. That Lease's event
		// brings the lock back here.
		return nil
	}
	if err := p.Prove(ctx, FencingInForce(lock), namespaces); err != nil {
		var pending *PendingError
		if errors.As(err, &pending) {
			pending.Step = "creating the mutating binding " + m.Name + ": " + pending.Step
		}
		return err
	}
	if err := c.Create(ctx, m, client.FieldOwner(FieldOwner)); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// The cache had not seen it yet (or someone else made one):
			// its watch event brings the lock back here, and one that
			// does not record this proof is deleted then.
			return nil
		}
		return fmt.Errorf("creating %s: %w", m.Name, err)
	}
	return nil
}

// RemoveBindings deletes lock's three bindings, the mutating one first.
// Where no Lease named after the lock exists (read live, from live) in a
// namespace the policies check, neither per-lock binding does anything
// (both skip a missing parameter), so the validating ones follow at once. Where one does (a Lease of another owner,
// or a managed one the manager's cache has not seen), the validating
// bindings stay until every apiserver instance refuses MutatingGone there;
// until then RemoveBindings returns a *PendingError. A managed Lease seen
// live means the lock is still in use: nothing is deleted.
func RemoveBindings(ctx context.Context, c client.Client, live client.Reader, p Prover, lock string) error {
	b := Bindings(lock)
	var leases coordinationv1.LeaseList
	if err := live.List(ctx, &leases, client.MatchingFields{"metadata.name": lock}); err != nil {
		return fmt.Errorf("listing Leases named %s: %w", lock, err)
	}
	var namespaces []string
	for _, l := range leases.Items {
		if l.Labels[fkv1.LabelManagedBy] == fkv1.ManagedByValue {
			return &PendingError{Step: "removing the bindings of lock " + lock,
				Reasons: []string{fmt.Sprintf("its managed Lease %s/%s exists (the cache is behind)", l.Namespace, l.Name)}}
		}
		namespaces = append(namespaces, l.Namespace)
	}
	namespaces, err := policed(ctx, c, namespaces)
	if err != nil {
		return &PendingError{Step: "removing the bindings of lock " + lock, Reasons: []string{err.Error()}}
	}
	if err := c.Delete(ctx, b.Mutating); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting %s: %w", b.Mutating.Name, err)
	}
	left := false
	for _, vb := range []client.Object{b.LeaseRequired, b.Validating} {
		err := c.Get(ctx, client.ObjectKeyFromObject(vb), vb.DeepCopyObject().(client.Object))
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("reading %s: %w", vb.GetName(), err)
		}
		left = left || err == nil
	}
	if !left {
		return nil
	}
	if len(namespaces) > 0 {
		if err := p.Prove(ctx, MutatingGone(lock), namespaces); err != nil {
			var pending *PendingError
			if errors.As(err, &pending) {
				pending.Step = "deleting the validating binding " + b.Validating.Name + ": " + pending.Step
			}
			return err
		}
	}
	for _, vb := range []client.Object{b.LeaseRequired, b.Validating} {
		if err := c.Delete(ctx, vb); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %s: %w", vb.GetName(), err)
		}
	}
	return nil
}

// policed returns those of namespaces the fencing policy checks (its
// namespaceSelector names the excluded ones by kubernetes.io/metadata.name,
// Render): in the others neither per-lock binding does anything, and a
// probe proves nothing.
func policed(ctx context.Context, c client.Reader, namespaces []string) ([]string, error) {
	if len(namespaces) == 0 {
		return nil, nil
	}
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: PolicyName}, &vap); err != nil {
		return nil, fmt.Errorf("reading ValidatingAdmissionPolicy %s: %w", PolicyName, err)
	}
	sel := labels.Everything()
	if mc := vap.Spec.MatchConstraints; mc != nil && mc.NamespaceSelector != nil {
		var err error
		if sel, err = metav1.LabelSelectorAsSelector(mc.NamespaceSelector); err != nil {
			return nil, fmt.Errorf("the namespaceSelector of ValidatingAdmissionPolicy %s: %w", PolicyName, err)
		}
	}
	var out []string
	for _, ns := range namespaces {
		if sel.Matches(labels.Set{corev1.LabelMetadataName: ns}) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// Owned reports whether obj is one of the objects CEL mode applies: a
// policy Install applies, the base binding, or a per-lock binding, labelled
// as fencekeeper's.
func Owned(obj client.Object) bool {
	if obj.GetLabels()[fkv1.LabelManagedBy] != fkv1.ManagedByValue {
		return false
	}
	switch n := obj.GetName(); n {
	case PolicyName, BasePolicyName, LeaseRequiredPolicyName:
		return true
	default:
		return strings.HasPrefix(n, bindingPrefix)
	}
}

// Uninstall deletes every object CEL mode applied (Owned), for a manager
// in webhook mode that finds them after a switch from CEL mode: left in
// place, the mutating policy would consume each write's token before the
// webhook sees it, and the webhook would refuse the write as presenting
// none. The mutating policy's bindings and the policy go first (the webhook
// checks every write meanwhile), the validating ones after. It returns how
// many objects it deleted.
func Uninstall(ctx context.Context, c client.Client) (int, error) {
	lists := []client.ObjectList{
		&admissionregistrationv1.MutatingAdmissionPolicyBindingList{},
		&admissionregistrationv1.MutatingAdmissionPolicyList{},
		&admissionregistrationv1.ValidatingAdmissionPolicyBindingList{},
		&admissionregistrationv1.ValidatingAdmissionPolicyList{},
	}
	deleted := 0
	for _, list := range lists {
		if err := c.List(ctx, list, client.MatchingLabels{fkv1.LabelManagedBy: fkv1.ManagedByValue}); err != nil {
			return deleted, fmt.Errorf("listing CEL-mode objects: %w", err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return deleted, err
		}
		for _, item := range items {
			obj, ok := item.(client.Object)
			if !ok || !Owned(obj) {
				continue
			}
			if err := c.Delete(ctx, obj, client.Preconditions{UID: ptr.To(obj.GetUID())}); client.IgnoreNotFound(err) != nil {
				return deleted, fmt.Errorf("deleting %s: %w", obj.GetName(), err)
			}
			deleted++
		}
	}
	return deleted, nil
}

func fromMap(raw map[string]any, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(raw, into, true)
}

// Package celmode is the CEL enforcement mode (docs/design.md §3): the
// fencing rules as a MutatingAdmissionPolicy and two
// ValidatingAdmissionPolicies evaluated inside the apiserver, with no webhook
// hop. The manager applies the policies (Install) and keeps three bindings
// per lock name whose parameter is the lock's Lease (Bindings, kept in line
// by controllers/celbinding).
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
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
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

// apply creates obj, or updates the stored one when its labels or spec
// differ (controllerutil.CreateOrUpdate: no write when nothing changed).
func apply(ctx context.Context, c client.Client, obj client.Object) error {
	want := obj.DeepCopyObject().(client.Object)
	_, err := controllerutil.CreateOrUpdate(ctx, c, obj, func() error {
		labels := obj.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		for k, v := range want.GetLabels() {
			labels[k] = v
		}
		obj.SetLabels(labels)
		return copySpec(want, obj)
	})
	if err != nil {
		return fmt.Errorf("applying %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
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

// LoadDelay is how long a binding change takes to be in force on every
// apiserver: each reloads its policies and bindings on a 1-second timer
// after its informer delivers the change. The ordering below waits this
// long, plus a second for creationTimestamp's whole-second precision.
const LoadDelay = 3 * time.Second

// EnsureBindings creates or repairs lock's three bindings, the validating
// ones first: while only the mutating binding were in force, tokens would be
// consumed into the watermark and nothing would check them. The mutating
// binding is created only once the validating one has been in force for
// LoadDelay; until then EnsureBindings returns how long to wait (and
// presented epochs of the lock are refused: nothing consumes them). A
// validating binding younger than that with a mutating one beside it (someone
// deleted and re-created it) has the mutating one removed first.
func EnsureBindings(ctx context.Context, c client.Client, lock string, now time.Time) (time.Duration, error) {
	b := Bindings(lock)
	m, v := b.Mutating, b.Validating
	if err := apply(ctx, c, v); err != nil {
		return 0, err
	}
	if err := apply(ctx, c, b.LeaseRequired); err != nil {
		return 0, err
	}
	if age := now.Sub(v.CreationTimestamp.Time); age < LoadDelay+time.Second {
		if err := c.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("deleting %s until %s is in force: %w", m.Name, v.Name, err)
		}
		return LoadDelay + time.Second - age, nil
	}
	return 0, apply(ctx, c, m)
}

// RemoveBindings deletes lock's three bindings, the mutating one first; it
// returns how long to wait before calling again when the validating one
// must outlive the mutating one by LoadDelay (absent bindings are fine).
func RemoveBindings(ctx context.Context, c client.Client, lock string) (time.Duration, error) {
	b := Bindings(lock)
	m, v := b.Mutating, b.Validating
	err := c.Get(ctx, client.ObjectKeyFromObject(m), m)
	switch {
	case err == nil:
		if err := c.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("deleting %s: %w", m.Name, err)
		}
		return LoadDelay, nil
	case !apierrors.IsNotFound(err):
		return 0, fmt.Errorf("reading %s: %w", m.Name, err)
	}
	for _, vb := range []client.Object{b.LeaseRequired, v} {
		if err := c.Delete(ctx, vb); client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("deleting %s: %w", vb.GetName(), err)
		}
	}
	return 0, nil
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

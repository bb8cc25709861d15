package webhook

import (
	"fmt"
	"regexp"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// FencingWebhookName is the name of the webhook for fenced objects.
const FencingWebhookName = "fenced.fencekeeper.io"

// ScaleWebhookName is the name of the webhook for the scale subresource of
// guarded kinds.
const ScaleWebhookName = "fenced-scale.fencekeeper.io"

// DefaultGuardedResources are fenced when nothing else is configured.
var DefaultGuardedResources = []string{"configmaps"}

// GuardedResource is one kind of object the webhook guards.
type GuardedResource struct {
	Group, Version, Resource string
}

// apiVersion is what a Kubernetes API version looks like: v1, v2beta1.
var apiVersion = regexp.MustCompile(`^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$`)

// ParseGuardedResource parses "configmaps" (the core group, v1) or
// "RESOURCE.GROUP[/VERSION]" such as "reports.reports.example.com". Every
// version of the kind is fenced, whatever VERSION says (it is accepted, as
// earlier releases documented it): matched at one version only, a write
// through another would reach admission converted to it, where fields that
// version cannot express are annotations outside fencekeeper.io/ (built-in
// kinds) or gone (custom resources), and would pass as metadata-only.
func ParseGuardedResource(s string) (GuardedResource, error) {
	s = strings.TrimSpace(s)
	name, version, _ := strings.Cut(s, "/")
	resource, group, _ := strings.Cut(name, ".")
	if resource == "" || strings.ContainsAny(s, " *,") {
		return GuardedResource{}, fmt.Errorf("invalid guarded resource %q: want RESOURCE[.GROUP], e.g. configmaps or reports.reports.example.com", s)
	}
	if resource == "pods" && group == "" {
		// An eviction deletes a pod, and ephemeral containers and resizes
		// change one, through subresources whose writes never pass the
		// pod's own admission: a fence there would have holes.
		return GuardedResource{}, fmt.Errorf("invalid guarded resource %q: pods cannot be fenced (evictions, ephemeral containers and resizes bypass the pod's admission); request a lease for the pod with the fencekeeper.io/lease annotation and fence what it writes", s)
	}
	if version != "" && !apiVersion.MatchString(version) {
		return GuardedResource{}, fmt.Errorf("invalid guarded resource %q: %q is not an API version (subresources are not fenced on their own)", s, version)
	}
	version = "*"
	if group == "" {
		version = "v1" // the core group has no other
	}
	return GuardedResource{Group: group, Version: version, Resource: resource}, nil
}

// ParseGuardedResources parses a list, failing on the first bad entry.
func ParseGuardedResources(list []string) ([]GuardedResource, error) {
	out := make([]GuardedResource, 0, len(list))
	for _, s := range list {
		if strings.TrimSpace(s) == "" {
			continue
		}
		g, err := ParseGuardedResource(s)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no guarded resources given")
	}
	return out, nil
}

// ConfigOptions shape the webhook configuration.
type ConfigOptions struct {
	Guarded []GuardedResource
	// ClientConfig points at the webhook server (service or URL, and CA bundle).
	ClientConfig admissionregistrationv1.WebhookClientConfig
	// ExcludedNamespaces are never sent to the webhook (kube-system and the
	// manager's own namespace).
	ExcludedNamespaces []string
	TimeoutSeconds     int32
	// ScaleOnly leaves out the webhook for the objects themselves: in CEL
	// mode admission policies fence them, but a Scale carries no labels for
	// a policy binding to select, so the scale webhook stays.
	ScaleOnly bool
}

// FencingWebhookConfiguration builds the MutatingWebhookConfiguration: only
// objects carrying the fencekeeper.io/lock label are sent (so unfenced
// objects never depend on the webhook), failing closed for those. It is
// mutating because an accepted content write has its epoch token consumed
// and its watermark set in the same hop that checked it. It is never
// reinvoked: its decision stands for the object it saw, and a token it
// removed is not presented again.
func FencingWebhookConfiguration(o ConfigOptions) *admissionregistrationv1.MutatingWebhookConfiguration {
	timeout := o.TimeoutSeconds
	if timeout == 0 {
		timeout = 5
	}
	var rules []admissionregistrationv1.RuleWithOperations
	for _, g := range o.Guarded {
		rules = append(rules, admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{g.Group}, APIVersions: []string{g.Version}, Resources: []string{g.Resource},
				Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		})
	}
	scaleRules := subresourceUpdates(rules, "scale")
	// Writes to status are sent too (their objects carry the labels): some
	// built-in kinds keep the metadata a status write changes.
	rules = append(rules, subresourceUpdates(rules, "status")...)
	cc := o.ClientConfig
	if cc.Service != nil && cc.Service.Path == nil {
		cc.Service.Path = ptr.To(FencingPath)
	}
	// Both webhooks fail closed and are never reinvoked (see above).
	hook := func(name string, rules []admissionregistrationv1.RuleWithOperations) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{
			Name:                    name,
			ClientConfig:            cc,
			Rules:                   rules,
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(timeout),
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       excluded(o.ExcludedNamespaces),
		}
	}
	fenced := hook(FencingWebhookName, rules)
	fenced.ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: fkv1.LabelLock, Operator: metav1.LabelSelectorOpExists,
	}}}
	// The scale subresource's objects (autoscaling/v1 Scale) carry no labels,
	// so no objectSelector can pick the fenced ones: every scale of a guarded
	// kind is sent, and the handler reads the object to see whether it is
	// fenced.
	scale := hook(ScaleWebhookName, scaleRules)
	webhooks := []admissionregistrationv1.MutatingWebhook{fenced, scale}
	if o.ScaleOnly {
		webhooks = webhooks[1:]
	}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-fencing", Labels: map[string]string{fkv1.LabelManagedBy: fkv1.ManagedByValue}},
		Webhooks:   webhooks,
	}
}

// subresourceUpdates are UPDATE rules for sub of the resources in rules.
func subresourceUpdates(rules []admissionregistrationv1.RuleWithOperations, sub string) []admissionregistrationv1.RuleWithOperations {
	out := make([]admissionregistrationv1.RuleWithOperations, 0, len(rules))
	for _, r := range rules {
		r.Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
		r.Resources = []string{r.Resources[0] + "/" + sub}
		out = append(out, r)
	}
	return out
}

func excluded(namespaces []string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: namespaces,
	}}}
}

package localpods

import (
	"context"
	"errors"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// syncEndpointSlices plays the endpointslice controller for the pods run
// here: for each Service whose selector matches such a pod, one
// EndpointSlice with the pod's address (HostIP) and its host ports, ready
// while the pod is. Slices it wrote whose pod or Service is gone go.
func (p *player) syncEndpointSlices(ctx context.Context) error {
	existing, err := p.cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{LabelSelector: labelManagedBy + "=" + ManagedBy})
	if err != nil {
		return err
	}
	want := map[string]*discoveryv1.EndpointSlice{}
	for _, ns := range p.namespacesRun() {
		runs := p.runsIn(ns)
		svcs, err := p.cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range svcs.Items {
			svc := &svcs.Items[i]
			if len(svc.Spec.Selector) == 0 {
				continue
			}
			sel := labels.SelectorFromSet(svc.Spec.Selector)
			for _, r := range runs {
				if sel.Matches(labels.Set(r.labels)) && r.unsupported == "" {
					s := p.endpointSlice(svc, r)
					want[s.Namespace+"/"+s.Name] = s
				}
			}
		}
	}
	var errs []error
	for i := range existing.Items {
		cur := &existing.Items[i]
		w, ok := want[cur.Namespace+"/"+cur.Name]
		delete(want, cur.Namespace+"/"+cur.Name)
		switch {
		case !ok || w.AddressType != cur.AddressType:
			errs = append(errs, ignoreNotFound(p.cs.DiscoveryV1().EndpointSlices(cur.Namespace).Delete(ctx, cur.Name, metav1.DeleteOptions{})))
			if ok {
				want[w.Namespace+"/"+w.Name] = w // created again below
			}
		case !apiequality.Semantic.DeepEqual(w.Endpoints, cur.Endpoints) || !apiequality.Semantic.DeepEqual(w.Ports, cur.Ports) ||
			!apiequality.Semantic.DeepEqual(w.Labels, cur.Labels) || !apiequality.Semantic.DeepEqual(w.OwnerReferences, cur.OwnerReferences):
			cur = cur.DeepCopy()
			cur.Endpoints, cur.Ports, cur.Labels, cur.OwnerReferences = w.Endpoints, w.Ports, w.Labels, w.OwnerReferences
			_, err := p.cs.DiscoveryV1().EndpointSlices(cur.Namespace).Update(ctx, cur, metav1.UpdateOptions{FieldManager: ManagedBy})
			errs = append(errs, err)
		}
	}
	for _, w := range want {
		_, err := p.cs.DiscoveryV1().EndpointSlices(w.Namespace).Create(ctx, w, metav1.CreateOptions{FieldManager: ManagedBy})
		if err == nil {
			p.logf("endpointslice %s/%s: service %s -> pod %s at %s", w.Namespace, w.Name, w.Labels[labelService], w.Endpoints[0].TargetRef.Name, describePorts(w))
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func describePorts(s *discoveryv1.EndpointSlice) string {
	out := ""
	for i, pt := range s.Ports {
		if i > 0 {
			out += ","
		}
		out += fmt.Sprintf("%s:%d(%s)", s.Endpoints[0].Addresses[0], ptr.Deref(pt.Port, 0), ptr.Deref(pt.Name, ""))
	}
	return out
}

func (p *player) endpointSlice(svc *corev1.Service, r *podRun) *discoveryv1.EndpointSlice {
	s := r.snapshot()
	addressType := discoveryv1.AddressTypeIPv4
	if ip := net.ParseIP(p.o.HostIP); ip != nil && ip.To4() == nil {
		addressType = discoveryv1.AddressTypeIPv6
	}
	ready := (s.ready && !s.terminating) || svc.Spec.PublishNotReadyAddresses
	var ports []discoveryv1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		port := r.hostPort(sp.TargetPort)
		if port == 0 {
			continue // a named port the container does not declare
		}
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(sp.Name), Port: ptr.To(port), Protocol: ptr.To(sp.Protocol), AppProtocol: sp.AppProtocol})
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%s", shortName(svc.Name, 200), string(r.uid)[:8]), Namespace: svc.Namespace,
			Labels:          map[string]string{labelService: svc.Name, labelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(svc, corev1.SchemeGroupVersion.WithKind("Service"))},
		},
		AddressType: addressType,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{p.o.HostIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(s.ready), Terminating: ptr.To(s.terminating)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: r.namespace, Name: r.name, UID: r.uid},
			NodeName:   ptr.To(NodeName),
		}},
		Ports: ports,
	}
}

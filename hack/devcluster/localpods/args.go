package localpods

import (
	"context"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// portValue is a flag value naming a port: "9443", ":8080", "0.0.0.0:8080".
var portValue = regexp.MustCompile(`^(.*:)?([0-9]{1,5})$`)

// metaField is a downward API path to one label or annotation.
var metaField = regexp.MustCompile(`^metadata\.(labels|annotations)\['(.+)'\]$`)

// rewriteArgs maps a container's arguments to this host, where every pod
// shares one network and one file system:
//
//   - a value that is a mount path, or under one, names the directory
//     standing in for it (mounts; "" for a volume not provided here is an
//     error);
//   - a value that is a declared container port, alone or after a host
//     ("9443", ":8080"), names the pod's host port instead; every declared
//     port must be set by some argument, or the process would listen where
//     another pod's does.
//
// A value is what follows "=" in "--flag=value", or an argument that does
// not start with "-". Nothing else changes.
func rewriteArgs(args []string, mounts map[string]string, ports []portMap) ([]string, error) {
	paths := make([]string, 0, len(mounts))
	for p := range mounts {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	set := map[int32]bool{}
	out := make([]string, len(args))
	for i, a := range args {
		prefix, val := "", a
		if strings.HasPrefix(a, "-") {
			k := strings.IndexByte(a, '=')
			if k < 0 {
				out[i] = a
				continue
			}
			prefix, val = a[:k+1], a[k+1:]
		}
		nv, err := rewritePath(val, paths, mounts)
		if err != nil {
			return nil, fmt.Errorf("argument %q: %w", a, err)
		}
		if m := portValue.FindStringSubmatch(nv); m != nil {
			n, _ := strconv.Atoi(m[2])
			for _, pm := range ports {
				if int(pm.container) == n {
					nv = m[1] + strconv.Itoa(int(pm.host))
					set[pm.container] = true
					break
				}
			}
		}
		out[i] = prefix + nv
	}
	for _, pm := range ports {
		if !set[pm.container] {
			return nil, fmt.Errorf("no argument sets container port %d (%s): every pod runs on this host's network here, so each needs ports of its own, given by its arguments", pm.container, pm.name)
		}
	}
	return out, nil
}

func rewritePath(val string, paths []string, mounts map[string]string) (string, error) {
	for _, p := range paths {
		if val != p && !strings.HasPrefix(val, strings.TrimSuffix(p, "/")+"/") {
			continue
		}
		local := mounts[p]
		if local == "" {
			return "", fmt.Errorf("%s is the mount path of a volume %s does not provide (Secret, ConfigMap, emptyDir and the ServiceAccount token are)", p, ManagedBy)
		}
		return local + val[len(p):], nil
	}
	return val, nil
}

// environment is the process's environment: PATH, HOME (the pod's
// directory), HOSTNAME (the pod's name, as a container runtime sets it),
// KUBECONFIG (the pod's
// ServiceAccount, in place of the in-cluster configuration), then the
// container's envFrom and env. Values naming a mount path are mapped as
// rewriteArgs maps them; $(VAR) references are not expanded.
func (r *podRun) environment(ctx context.Context, mounts map[string]string) ([]string, error) {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + r.dir, "HOSTNAME=" + r.name, "KUBECONFIG=" + r.kubeconfig()}
	paths := make([]string, 0, len(mounts))
	for p := range mounts {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	add := func(k, v string) error {
		nv, err := rewritePath(v, paths, mounts)
		if err != nil {
			return fmt.Errorf("env %s: %w", k, err)
		}
		env = append(env, k+"="+nv)
		return nil
	}
	for _, from := range r.container.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := r.p.cs.CoreV1().ConfigMaps(r.namespace).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if ptr.Deref(from.ConfigMapRef.Optional, false) {
					continue
				}
				return nil, err
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := r.p.cs.CoreV1().Secrets(r.namespace).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if ptr.Deref(from.SecretRef.Optional, false) {
					continue
				}
				return nil, err
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		for k, v := range data {
			if err := add(from.Prefix+k, v); err != nil {
				return nil, err
			}
		}
	}
	for _, e := range r.container.Env {
		v, ok, err := r.envValue(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if !ok {
			continue
		}
		if err := add(e.Name, v); err != nil {
			return nil, err
		}
	}
	return env, nil
}

func (r *podRun) envValue(ctx context.Context, e corev1.EnvVar) (string, bool, error) {
	from := e.ValueFrom
	if from == nil {
		return e.Value, true, nil
	}
	switch {
	case from.FieldRef != nil:
		v, err := r.field(from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := r.resourceField(from.ResourceFieldRef)
		return v, err == nil, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := r.p.cs.CoreV1().ConfigMaps(r.namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return "", false, optional(ref.Optional, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			return "", false, optional(ref.Optional, fmt.Errorf("key %q not in ConfigMap %s", ref.Key, ref.Name))
		}
		return v, true, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := r.p.cs.CoreV1().Secrets(r.namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return "", false, optional(ref.Optional, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			return "", false, optional(ref.Optional, fmt.Errorf("key %q not in Secret %s", ref.Key, ref.Name))
		}
		return string(v), true, nil
	}
	return "", false, fmt.Errorf("%s does not resolve this kind of valueFrom", ManagedBy)
}

func optional(opt *bool, err error) error {
	if ptr.Deref(opt, false) {
		return nil
	}
	return err
}

// field is the downward API's value of a pod field.
func (r *podRun) field(path string) (string, error) {
	if m := metaField.FindStringSubmatch(path); m != nil {
		if m[1] == "labels" {
			return r.labels[m[2]], nil
		}
		return r.annotations[m[2]], nil
	}
	switch path {
	case "metadata.name":
		return r.name, nil
	case "metadata.namespace":
		return r.namespace, nil
	case "metadata.uid":
		return string(r.uid), nil
	case "spec.nodeName":
		return NodeName, nil
	case "spec.serviceAccountName":
		return r.spec.ServiceAccountName, nil
	case "status.hostIP", "status.podIP", "status.hostIPs", "status.podIPs":
		return r.p.o.HostIP, nil
	}
	return "", fmt.Errorf("%s does not resolve the field %s", ManagedBy, path)
}

// resourceField is the downward API's value of a container resource,
// rounded up in units of the divisor. Without a limit the kubelet reports
// the node's allocatable, which there is not here: that is an error.
func (r *podRun) resourceField(ref *corev1.ResourceFieldSelector) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("resource %q", ref.Resource)
	}
	list := r.container.Resources.Limits
	if kind == "requests" {
		list = r.container.Resources.Requests
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		return "", fmt.Errorf("%s is not set, and there is no node's allocatable to report in its place", ref.Resource)
	}
	div := resource.MustParse("1")
	if !ref.Divisor.IsZero() {
		div = ref.Divisor
	}
	return strconv.FormatInt(int64(math.Ceil(q.AsApproximateFloat64()/div.AsApproximateFloat64())), 10), nil
}

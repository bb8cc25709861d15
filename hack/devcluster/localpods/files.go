package localpods

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// tokenSeconds is the lifetime the kubelet asks for the token it projects.
const tokenSeconds = 3607

func (r *podRun) serviceAccountDir() string { return filepath.Join(r.dir, "serviceaccount") }
func (r *podRun) kubeconfig() string        { return filepath.Join(r.dir, "kubeconfig") }
func (r *podRun) volumeDir(v string) string { return filepath.Join(r.dir, "volumes", v) }

// syncFiles brings the pod's files up to date: the ServiceAccount token
// (renewed at 80% of its life, as the kubelet does) and the volumes.
func (r *podRun) syncFiles(ctx context.Context) error {
	r.files.Lock()
	defer r.files.Unlock()
	if err := r.syncToken(ctx); err != nil {
		return err
	}
	return r.syncVolumes(ctx)
}

// syncToken writes a token of the pod's ServiceAccount, bound to the pod
// (it stops working when the pod is deleted), with the apiserver's CA and
// the namespace, where the kubelet projects them
// (/var/run/secrets/kubernetes.io/serviceaccount), and a kubeconfig that
// reads the token from there, so renewals reach the process
// (client-go re-reads a tokenFile).
func (r *podRun) syncToken(ctx context.Context) error {
	if time.Now().Before(r.tokenDue) {
		return nil
	}
	sa := r.spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := r.p.cs.CoreV1().ServiceAccounts(r.namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](tokenSeconds),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: r.name, UID: r.uid},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("a token for ServiceAccount %s/%s: %w", r.namespace, sa, err)
	}
	ca := r.p.o.Config.CAData
	if len(ca) == 0 && r.p.o.Config.CAFile != "" {
		if ca, err = os.ReadFile(r.p.o.Config.CAFile); err != nil {
			return err
		}
	}
	if err := atomicWrite(r.serviceAccountDir(), map[string][]byte{
		"token": []byte(tr.Status.Token), "ca.crt": ca, "namespace": []byte(r.namespace),
	}); err != nil {
		return err
	}
	if _, err := os.Stat(r.kubeconfig()); err != nil {
		server := r.p.o.Config.Host
		if !strings.Contains(server, "://") {
			server = "https://" + server
		}
		kc := clientcmdapi.NewConfig()
		kc.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: filepath.Join(r.serviceAccountDir(), "ca.crt")}
		kc.AuthInfos["serviceaccount"] = &clientcmdapi.AuthInfo{TokenFile: filepath.Join(r.serviceAccountDir(), "token")}
		kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "serviceaccount", Namespace: r.namespace}
		kc.CurrentContext = "local"
		if err := clientcmd.WriteToFile(*kc, r.kubeconfig()); err != nil {
			return err
		}
	}
	life := time.Until(tr.Status.ExpirationTimestamp.Time)
	r.tokenDue = time.Now().Add(life * 8 / 10)
	return nil
}

// mounts maps the container's mount paths to the directories that stand in
// for them here ("" for a volume this package does not provide).
func (r *podRun) mounts() map[string]string {
	out := map[string]string{}
	for _, m := range r.container.VolumeMounts {
		v := r.volume(m.Name)
		switch {
		case v == nil:
			out[m.MountPath] = ""
		case v.Secret != nil, v.ConfigMap != nil, v.EmptyDir != nil:
			out[m.MountPath] = filepath.Join(r.volumeDir(m.Name), m.SubPath)
		case isServiceAccountVolume(v):
			out[m.MountPath] = r.serviceAccountDir()
		default:
			out[m.MountPath] = ""
		}
	}
	return out
}

func (r *podRun) volume(name string) *corev1.Volume {
	for i := range r.spec.Volumes {
		if r.spec.Volumes[i].Name == name {
			return &r.spec.Volumes[i]
		}
	}
	return nil
}

// isServiceAccountVolume: the projected volume the ServiceAccount
// admission plugin adds (kube-api-access-*): a token, the CA, the namespace.
func isServiceAccountVolume(v *corev1.Volume) bool {
	if v.Projected == nil {
		return false
	}
	for _, s := range v.Projected.Sources {
		if s.ServiceAccountToken != nil {
			return true
		}
	}
	return false
}

// syncVolumes writes the Secret and ConfigMap volumes the container mounts
// (again when their data changed) and makes its emptyDirs.
func (r *podRun) syncVolumes(ctx context.Context) error {
	seen := map[string]bool{}
	for _, m := range r.container.VolumeMounts {
		if seen[m.Name] {
			continue
		}
		seen[m.Name] = true
		v := r.volume(m.Name)
		if v == nil {
			continue
		}
		var files map[string][]byte
		switch {
		case v.EmptyDir != nil:
			if err := os.MkdirAll(r.volumeDir(v.Name), 0o700); err != nil {
				return err
			}
			continue
		case v.Secret != nil:
			s, err := r.p.cs.CoreV1().Secrets(r.namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && ptr.Deref(v.Secret.Optional, false):
				files = map[string][]byte{}
			case err != nil:
				return fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", v.Name, err)
			default:
				if files, err = project(s.Data, v.Secret.Items, ptr.Deref(v.Secret.Optional, false)); err != nil {
					return fmt.Errorf("volume %q: %w", v.Name, err)
				}
			}
		case v.ConfigMap != nil:
			cm, err := r.p.cs.CoreV1().ConfigMaps(r.namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && ptr.Deref(v.ConfigMap.Optional, false):
				files = map[string][]byte{}
			case err != nil:
				return fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", v.Name, err)
			default:
				data := map[string][]byte{}
				for k, val := range cm.Data {
					data[k] = []byte(val)
				}
				for k, val := range cm.BinaryData {
					data[k] = val
				}
				if files, err = project(data, v.ConfigMap.Items, ptr.Deref(v.ConfigMap.Optional, false)); err != nil {
					return fmt.Errorf("volume %q: %w", v.Name, err)
				}
			}
		default:
			continue
		}
		d := digest(files)
		if r.written[v.Name] == d {
			continue
		}
		if err := atomicWrite(r.volumeDir(v.Name), files); err != nil {
			return err
		}
		r.written[v.Name] = d
	}
	return nil
}

// project picks a volume's files from data: every key, or the items.
func project(data map[string][]byte, items []corev1.KeyToPath, optional bool) (map[string][]byte, error) {
	if len(items) == 0 {
		return data, nil
	}
	out := map[string][]byte{}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("key %q not found", it.Key)
		}
		out[it.Path] = v
	}
	return out, nil
}

func digest(files map[string][]byte) string {
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s%d:", len(k), k, len(files[k]))
		h.Write(files[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// atomicWrite replaces the files of dir all at once, the way the kubelet
// writes a Secret or ConfigMap volume: the data goes into a new hidden
// directory, the symlink ..data is switched to it in one rename, and each
// file is a symlink through ..data. A reader never sees a certificate from
// one version and its key from another.
func atomicWrite(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ts, err := os.MkdirTemp(dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	top := map[string]bool{}
	for rel, data := range files {
		clean := path.Clean(rel)
		if path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || strings.HasPrefix(clean, "..") {
			return fmt.Errorf("file name %q leaves the volume", rel)
		}
		p := filepath.Join(ts, filepath.FromSlash(clean))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return err
		}
		top[strings.SplitN(clean, "/", 2)[0]] = true
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n := e.Name(); n != "..data" && n != filepath.Base(ts) && !top[n] {
			_ = os.RemoveAll(filepath.Join(dir, n))
		}
	}
	return nil
}

// Package envtestutil starts fencekeeper's real test control plane: etcd and
// kube-apiserver built into bin/ by the Makefile, via controller-runtime's
// envtest, with the CRDs from config/crd installed. Nothing is downloaded.
package envtestutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir is where etcd, kube-apiserver and kubectl are: $KUBEBUILDER_ASSETS,
// else bin/ of the repository.
func BinDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin")
}

// New returns an envtest environment on the binaries in BinDir, with
// fencekeeper's CRDs. It fails early, with the fix, when a binary is missing.
func New() (*envtest.Environment, error) {
	dir := BinDir()
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run 'make tools' (builds it from the Go module proxy)", b, dir)
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	// The kubernetes Service lists the apiserver, as in a cluster: CEL mode
	// sends its proofs to each instance the Service's EndpointSlice lists.
	// envtest's apiserver would advertise 127.0.0.1, which an EndpointSlice
	// refuses (loopback), so it would list none: advertise this host's
	// first non-loopback address and listen there too (clients keep using
	// 127.0.0.1, which the serving certificate names).
	if ip := AdvertiseAddress(); ip != "" {
		env.ControlPlane.GetAPIServer().Configure().Set("advertise-address", ip).Set("bind-address", "0.0.0.0")
	}
	return env, nil
}

// AdvertiseAddress is the first global unicast IPv4 address of an
// interface that is up ("" if there is none): an address an EndpointSlice
// accepts that reaches this host.
func AdvertiseAddress() string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return ipn.IP.String()
			}
		}
	}
	return ""
}

var nsCounter atomic.Int64

// NewNamespace creates a namespace with a unique name starting with prefix.
func NewNamespace(ctx context.Context, c client.Client, prefix string) (string, error) {
	ns := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%100000, nsCounter.Add(1))
	return ns, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
}

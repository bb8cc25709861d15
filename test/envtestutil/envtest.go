// Package envtestutil starts fencekeeper's real test control plane: etcd and
// kube-apiserver built into bin/ by the Makefile, via controller-runtime's
// envtest, with the CRDs from config/crd installed. Nothing is downloaded.
package envtestutil

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

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
	return &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}, nil
}

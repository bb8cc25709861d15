// Package chart tests the Helm chart with helm and kubectl built into bin/,
// against a real kube-apiserver.
package chart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	ctx        = context.Background()
	env        *envtest.Environment
	adminCfg   *rest.Config
	admin      client.Client
	kubeconfig string
	helmHome   string
	chartDir   = filepath.Join(envtestutil.RepoRoot(), "charts", "fencekeeper")
	helmBin    = filepath.Join(envtestutil.BinDir(), "helm")
	kubectlBin = filepath.Join(envtestutil.BinDir(), "kubectl")
)

func TestChart(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Helm chart suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	_, err := os.Stat(helmBin)
	Expect(err).NotTo(HaveOccurred(), "bin/helm is missing: run 'make tools'")
	env, err = envtestutil.New()
	Expect(err).NotTo(HaveOccurred())
	// The chart installs the FencedLease CRD itself; only third-party CRDs
	// (and the test's Report kind) are preinstalled.
	env.CRDDirectoryPaths = []string{
		filepath.Join(envtestutil.RepoRoot(), "test", "crds"),
		filepath.Join(envtestutil.RepoRoot(), "test", "crds", "thirdparty"),
	}
	adminCfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	scheme := envtestutil.Scheme()
	Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
	admin, err = client.New(adminCfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	user, err := env.AddUser(envtest.User{Name: "platform-admin", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kc, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	helmHome = GinkgoT().TempDir()
	kubeconfig = filepath.Join(helmHome, "kubeconfig")
	Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// run runs a command with the test kubeconfig and returns stdout, stderr.
func run(stdin []byte, name string, args ...string) (string, string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "HELM_CACHE_HOME="+helmHome+"/cache",
		"HELM_CONFIG_HOME="+helmHome+"/config", "HELM_DATA_HOME="+helmHome+"/data")
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

func helm(args ...string) (string, string, error) { return run(nil, helmBin, args...) }

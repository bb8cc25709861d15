// Package chart tests the Helm chart with helm and kubectl built into bin/,
// against a real kube-apiserver.
package chart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	ctx        = context.Background()
	suite      *envtestutil.Suite
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
	_, err := os.Stat(helmBin)
	Expect(err).NotTo(HaveOccurred(), "bin/helm is missing: run 'make tools'")
	scheme := envtestutil.Scheme()
	Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
	// The chart installs the FencedLease CRD itself; only third-party CRDs
	// (and the test's Report kind) are preinstalled.
	suite, err = envtestutil.StartSuite(ctx, envtestutil.SuiteOptions{Log: GinkgoWriter, Scheme: scheme, ReplaceCRDs: true, CRDDirs: []string{
		filepath.Join(envtestutil.RepoRoot(), "test", "crds"),
		filepath.Join(envtestutil.RepoRoot(), "test", "crds", "thirdparty"),
	}})
	Expect(err).NotTo(HaveOccurred())
	env, adminCfg, admin = suite.Env, suite.Config, suite.Client
	helmHome = GinkgoT().TempDir()
	kubeconfig, err = suite.Kubeconfig("platform-admin", helmHome)
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if suite != nil {
		Expect(suite.Stop()).To(Succeed())
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

// testImage is the image repository the specs render and install the chart
// with: it requires one, and no pod runs on this control plane to pull it.
const testImage = "registry.example/fencekeeper/fencekeeper"

// helm runs bin/helm; template, install, upgrade and lint get --set
// image.repository=testImage first, so a spec's own --set still wins.
func helm(args ...string) (string, string, error) {
	if len(args) > 0 && slices.Contains([]string{"template", "install", "upgrade", "lint"}, args[0]) {
		args = append([]string{args[0], "--set", "image.repository=" + testImage}, args[1:]...)
	}
	return run(nil, helmBin, args...)
}

// helmNoImage runs bin/helm with exactly these arguments.
func helmNoImage(args ...string) (string, string, error) { return run(nil, helmBin, args...) }

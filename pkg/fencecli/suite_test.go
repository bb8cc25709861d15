package fencecli_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	ctx        = context.Background()
	env        *envtestutil.AdmissionEnv
	mgr        *envtestutil.Manager
	admin      client.WithWatch
	plugin     string // the built kubectl-fence binary
	kubeconfig string
)

func TestPlugin(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubectl fence suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	dir := GinkgoT().TempDir()
	plugin = filepath.Join(dir, "kubectl-fence")
	build := exec.Command("go", "build", "-o", plugin, "./cmd/kubectl-fence")
	build.Dir = envtestutil.RepoRoot()
	b, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(b))

	env, err = envtestutil.StartAdmissionEnv(ctx, []string{"configmaps"})
	Expect(err).NotTo(HaveOccurred())
	mgr, err = env.StartManager()
	Expect(err).NotTo(HaveOccurred())
	admin, err = client.NewWithWatch(env.Admin, client.Options{Scheme: lease.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	user, err := env.Env.AddUser(envtest.User{Name: "worker", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kc, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	kubeconfig = filepath.Join(dir, "kubeconfig")
	Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())
})

var _ = AfterSuite(func() {
	if mgr != nil {
		Expect(mgr.Stop()).To(Succeed())
	}
	if env != nil {
		Expect(env.Env.Stop()).To(Succeed())
	}
})

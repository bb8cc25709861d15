package chart

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var _ = Describe("Webhook certificate rotation", func() {
	It("provisions the serving certificate in the chart's Secret and injects its CA into the webhook configuration", func() {
		out, errOut, err := helm("install", "fk", chartDir, "-n", "fencekeeper-system", "--create-namespace", "--set", "crds.keep=false")
		Expect(err).NotTo(HaveOccurred(), out+errOut)
		DeferCleanup(func() { _, _, _ = helm("uninstall", "fk", "-n", "fencekeeper-system") })

		dir := GinkgoT().TempDir()
		manager := filepath.Join(dir, "manager")
		build := exec.Command("go", "build", "-o", manager, "./cmd/manager")
		build.Dir = envtestutil.RepoRoot()
		b, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(b))

		By("running bin/manager as the chart's ServiceAccount (impersonated), with --cert-rotation")
		kc, err := clientcmd.LoadFromFile(kubeconfig)
		Expect(err).NotTo(HaveOccurred())
		for _, u := range kc.AuthInfos {
			u.Impersonate = "system:serviceaccount:fencekeeper-system:fk-fencekeeper"
			u.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:fencekeeper-system", "system:authenticated"}
		}
		saKubeconfig := filepath.Join(dir, "sa.kubeconfig")
		Expect(clientcmd.WriteToFile(*kc, saKubeconfig)).To(Succeed())
		certDir := filepath.Join(dir, "certs")
		Expect(os.MkdirAll(certDir, 0o755)).To(Succeed())
		probe, hook := freePort(), freePort()
		cmd := exec.Command(manager, "--kubeconfig", saKubeconfig,
			"--leader-elect", "--leader-election-namespace", "fencekeeper-system",
			"--metrics-bind-address", "0", "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probe),
			"--webhook-port", fmt.Sprint(hook), "--webhook-cert-dir", certDir,
			"--cert-rotation", "--cert-namespace", "fencekeeper-system",
			"--cert-secret-name", "fk-fencekeeper-webhook-cert", "--webhook-service-name", "fk-fencekeeper-webhook",
			"--webhook-config-name", "fk-fencekeeper-fencing")
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_, _ = cmd.Process.Wait()
			GinkgoWriter.Println(logs.String())
		})

		By("the manager fills its Secret")
		var secret corev1.Secret
		Eventually(func() int {
			_ = admin.Get(ctx, client.ObjectKey{Namespace: "fencekeeper-system", Name: "fk-fencekeeper-webhook-cert"}, &secret)
			return len(secret.Data["tls.crt"])
		}, 60*time.Second, 250*time.Millisecond).ShouldNot(BeZero(), "manager log:\n%s", &logs)
		Expect(secret.Data).To(HaveKey("ca.crt"))

		By("playing the kubelet: the Secret volume appears in the cert directory")
		for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
			Expect(os.WriteFile(filepath.Join(certDir, k), secret.Data[k], 0o600)).To(Succeed())
		}

		By("the CA is injected into the webhook configuration, and the manager becomes ready")
		Eventually(func() []byte {
			var vwc admissionregistrationv1.MutatingWebhookConfiguration
			_ = admin.Get(ctx, client.ObjectKey{Name: "fk-fencekeeper-fencing"}, &vwc)
			if len(vwc.Webhooks) == 0 {
				return nil
			}
			return vwc.Webhooks[0].ClientConfig.CABundle
		}, 60*time.Second, 250*time.Millisecond).Should(Equal(secret.Data["ca.crt"]))
		Eventually(func() int {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", probe))
			if err != nil {
				return 0
			}
			_ = resp.Body.Close()
			return resp.StatusCode
		}, 60*time.Second, 250*time.Millisecond).Should(Equal(http.StatusOK), "manager log:\n%s", &logs)

		By("the webhook serves the provisioned certificate for the Service's DNS name")
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM(secret.Data["ca.crt"])).To(BeTrue())
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hook), &tls.Config{RootCAs: pool, ServerName: "fk-fencekeeper-webhook.fencekeeper-system.svc"})
		Expect(err).NotTo(HaveOccurred())
		_ = conn.Close()
	})
})

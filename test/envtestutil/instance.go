package envtestutil

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fencekeeper/fencekeeper/test/fault"
	"github.com/fencekeeper/fencekeeper/test/proc"
)

// ExtraInstance stands in for a second apiserver instance behind the
// kubernetes Service: an HTTPS server on this host's AdvertiseAddress,
// serving the envtest apiserver's certificate, listed in an extra
// EndpointSlice of Service default/kubernetes. While lagging it accepts
// every request unchecked (201, the request body echoed back), as an
// instance that has not loaded a binding yet would admit a write; otherwise
// it forwards each request to the real apiserver, as admin.
type ExtraInstance struct {
	// Addr is host:port, as the EndpointSlice lists it.
	Addr    string
	lagging atomic.Bool
	// Requests counts the requests it received.
	Requests atomic.Int64
	srv      *http.Server
	slice    *discoveryv1.EndpointSlice
	c        client.Client
}

// StartExtraInstance starts one, lagging, and publishes it.
func StartExtraInstance(ctx context.Context, env *envtest.Environment, admin *rest.Config) (*ExtraInstance, error) {
	ip := AdvertiseAddress()
	if ip == "" {
		return nil, errors.New("this host has no non-loopback address for an EndpointSlice to list")
	}
	dir := env.ControlPlane.GetAPIServer().CertDir
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key"))
	if err != nil {
		return nil, fmt.Errorf("the envtest apiserver's serving certificate: %w", err)
	}
	upstream, err := url.Parse(admin.Host)
	if err != nil {
		return nil, err
	}
	transport, err := rest.TransportFor(admin)
	if err != nil {
		return nil, err
	}
	c, err := client.New(admin, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, err
	}
	x := &ExtraInstance{Addr: ln.Addr().String(), c: c}
	x.lagging.Store(true)
	forward := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(upstream); r.Out.Host = upstream.Host },
		Transport: transport,
	}
	x.srv = &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			x.Requests.Add(1)
			if !x.lagging.Load() {
				forward.ServeHTTP(w, r)
				return
			}
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
		}),
	}
	go func() { _ = x.srv.ServeTLS(ln, "", "") }()
	port := ln.Addr().(*net.TCPAddr).Port
	x.slice = &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("kubernetes-extra-%d", port),
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := c.Create(ctx, x.slice); err != nil {
		_ = x.srv.Close()
		return nil, fmt.Errorf("publishing the extra instance: %w", err)
	}
	return x, nil
}

// SetLagging makes it accept everything unchecked (true) or forward to the
// real apiserver (false).
func (x *ExtraInstance) SetLagging(lagging bool) { x.lagging.Store(lagging) }

// Stop unpublishes it and stops its server.
func (x *ExtraInstance) Stop(ctx context.Context) error {
	err := client.IgnoreNotFound(x.c.Delete(ctx, x.slice))
	return errors.Join(err, x.srv.Close())
}

// SecondAPIServer is another kube-apiserver process on the envtest
// control plane's etcd, with the first one's flags (so the same
// certificates and credentials work) but its own port, no endpoint
// reconciler, and the flags given; it is listed in an extra EndpointSlice
// of Service default/kubernetes, like a second instance of a cluster.
type SecondAPIServer struct {
	// Addr is host:port, as the EndpointSlice lists it.
	Addr string
	// Config is admin's config aimed at it.
	Config *rest.Config
	cmd    *exec.Cmd
	exited chan error
	slice  *discoveryv1.EndpointSlice
	c      client.Client
}

// StartSecondAPIServer starts one (set overrides flags, "name" -> "value")
// and waits until it answers.
func StartSecondAPIServer(ctx context.Context, admin *rest.Config, set map[string]string, out io.Writer) (*SecondAPIServer, error) {
	ip := AdvertiseAddress()
	if ip == "" {
		return nil, errors.New("this host has no non-loopback address for an EndpointSlice to list")
	}
	first, err := fault.FindControlPlaneProcess("kube-apiserver", nil)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	flags := map[string]string{"secure-port": strconv.Itoa(port), "endpoint-reconciler-type": "none"}
	for k, v := range set {
		flags[k] = v
	}
	firstArgs := first.Args()
	args := []string{}
	for _, a := range firstArgs[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, ok := flags[name]; !ok {
			args = append(args, a)
		}
	}
	for k, v := range flags {
		args = append(args, "--"+k+"="+v)
	}
	cmd := exec.Command(firstArgs[0], args...)
	cmd.Stdout, cmd.Stderr = orDiscard(out), orDiscard(out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &SecondAPIServer{Addr: net.JoinHostPort(ip, strconv.Itoa(port)), cmd: cmd, exited: make(chan error, 1)}
	go func() { s.exited <- cmd.Wait() }()
	s.Config = rest.CopyConfig(admin)
	s.Config.Host = "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if s.c, err = client.New(s.Config, client.Options{Scheme: Scheme()}); err == nil {
		err = fault.WaitAnswering(ctx, s.c)
	}
	if err != nil {
		_ = s.Stop(ctx)
		return nil, fmt.Errorf("the second apiserver: %w", err)
	}
	s.slice = &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("kubernetes-second-%d", port),
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := s.c.Create(ctx, s.slice); err != nil {
		_ = s.Stop(ctx)
		return nil, fmt.Errorf("publishing the second apiserver: %w", err)
	}
	return s, nil
}

// Stop unpublishes it and stops it.
func (s *SecondAPIServer) Stop(ctx context.Context) error {
	var err error
	if s.slice != nil {
		err = client.IgnoreNotFound(s.c.Delete(ctx, s.slice))
		s.slice = nil
	}
	if s.cmd != nil {
		proc.Terminate(s.cmd.Process, s.exited, 20*time.Second)
		s.cmd = nil
	}
	return err
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

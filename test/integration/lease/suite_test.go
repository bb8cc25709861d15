package lease_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

var (
	ctx   = context.Background()
	suite *envtestutil.Suite
	env   *envtestutil.AdmissionEnv
	mgr   *envtestutil.Manager
	admin client.WithWatch
)

func TestLease(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Holder library suite")
}

var _ = BeforeSuite(func() {
	var err error
	suite, err = envtestutil.StartSuite(ctx, envtestutil.SuiteOptions{Log: GinkgoWriter,
		Guarded: []string{"configmaps"}, Manager: true, Scheme: lease.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	env, mgr, admin = suite.Admission, suite.Manager, suite.Client
})

var _ = AfterSuite(func() {
	if suite != nil {
		suite.Manager = mgr // a spec restarts the manager
		Expect(suite.Stop()).To(Succeed())
	}
})

func newNamespace() string {
	ns, err := envtestutil.NewNamespace(ctx, admin, "holders")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return ns
}

// faults sits between a holder's client and the apiserver. Each rule matches
// requests by method and path fragment.
type faults struct {
	mu sync.Mutex
	// dropReply: forward the request, then lose the reply (the server
	// committed; the client sees an error).
	dropReply []rule
	// block: never forward; the client sees an error.
	block []rule
	// hang: never forward, and never answer until the request's context
	// ends (an apiserver that stops responding).
	hang []rule
	// lateReply: forward the request, then hold the reply until the
	// request's context ends (the server committed; the caller gave up
	// before it heard).
	lateReply []rule
	// capture: forward, and keep a copy to replay later.
	capture  []rule
	captured []captured
	// holdWatch, while set, holds back every byte of watch streams whose
	// path contains holdWatchPath until it is closed: events are delayed,
	// not lost.
	holdWatch     chan struct{}
	holdWatchPath string
	next          http.RoundTripper
}

// heldBody delays each read of a watch stream while its faults hold watches.
type heldBody struct {
	io.ReadCloser
	f      *faults
	closed chan struct{}
	once   sync.Once
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.f.mu.Lock()
	hold := b.f.holdWatch
	b.f.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-b.closed:
		}
	}
	return n, err
}

func (b *heldBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.ReadCloser.Close()
}

type rule struct {
	method, path string
	times        int // 0: always
}

type captured struct {
	method, url string
	header      http.Header
	body        []byte
}

func (r *rule) matches(req *http.Request) bool {
	return (r.method == "" || req.Method == r.method) && strings.Contains(req.URL.Path, r.path) && !strings.Contains(req.URL.RawQuery, "watch=true")
}

// take reports whether a rule in list matches, consuming one use.
func take(list []rule, req *http.Request) bool {
	for i := range list {
		if list[i].matches(req) && list[i].times >= 0 {
			if list[i].times > 0 {
				list[i].times--
				if list[i].times == 0 {
					list[i].times = -1
				}
			}
			return true
		}
	}
	return false
}

var errInjected = errors.New("injected fault: connection reset")

func (f *faults) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	block, drop, capt, hang := take(f.block, req), take(f.dropReply, req), take(f.capture, req), take(f.hang, req)
	late := take(f.lateReply, req)
	f.mu.Unlock()
	if block {
		return nil, errInjected
	}
	if hang {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	var body []byte
	if req.Body != nil && capt {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := f.next.RoundTrip(req)
	if err == nil && strings.Contains(req.URL.RawQuery, "watch=true") {
		f.mu.Lock()
		if f.holdWatchPath != "" && strings.Contains(req.URL.Path, f.holdWatchPath) {
			resp.Body = &heldBody{ReadCloser: resp.Body, f: f, closed: make(chan struct{})}
		}
		f.mu.Unlock()
	}
	if capt {
		f.mu.Lock()
		f.captured = append(f.captured, captured{method: req.Method, url: req.URL.String(), header: req.Header.Clone(), body: body})
		f.mu.Unlock()
	}
	if drop && err == nil {
		_ = resp.Body.Close()
		return nil, errInjected
	}
	if late && err == nil {
		_ = resp.Body.Close()
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	return resp, err
}

func (f *faults) set(fn func(f *faults)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// replay sends a captured request again, as a delayed duplicate would arrive.
func (f *faults) replay(c captured) (int, string) {
	req, err := http.NewRequest(c.method, c.url, bytes.NewReader(c.body))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	req.Header = c.header.Clone()
	resp, err := f.next.RoundTrip(req)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// holderClient is a holder's client in ns whose traffic passes through f.
func holderClient(ns string) (*lease.Client, *faults, client.WithWatch) {
	f := &faults{}
	cfg := rest.CopyConfig(env.Admin)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: lease.Scheme()})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return lease.NewClientFrom(c, ns).WithLogger(logf.Log.WithName("holder")), f, c
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

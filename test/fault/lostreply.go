package fault

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
)

// LoseLeaseReply is a transport (envtestutil.ManagerOptions.WrapTransport)
// that, once armed, sends the next update of the Lease at Path and then
// loses its reply: the write commits, the manager is told it failed. It
// disarms itself and signals Happened.
type LoseLeaseReply struct {
	Next http.RoundTripper
	// Path is the end of the Lease's URL path: /namespaces/<ns>/leases/<name>.
	Path     string
	Armed    *atomic.Bool
	Happened chan struct{}
}

// NewLoseLeaseReply is a LoseLeaseReply for the Lease ns/name, disarmed;
// its Wrap is the WrapTransport.
func NewLoseLeaseReply(ns, name string) LoseLeaseReply {
	return LoseLeaseReply{Path: "/namespaces/" + ns + "/leases/" + name, Armed: &atomic.Bool{}, Happened: make(chan struct{}, 1)}
}

// Wrap returns t sending through next (it shares Armed and Happened).
func (t LoseLeaseReply) Wrap(next http.RoundTripper) http.RoundTripper {
	t.Next = next
	return t
}

// RoundTrip implements http.RoundTripper.
func (t LoseLeaseReply) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPut || !strings.HasSuffix(req.URL.Path, t.Path) || !t.Armed.Load() {
		return t.Next.RoundTrip(req)
	}
	resp, err := t.Next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	_ = resp.Body.Close()
	t.Armed.Store(false)
	select {
	case t.Happened <- struct{}{}:
	default:
	}
	return nil, errors.New("injected: the reply of the Lease write was lost after it committed")
}

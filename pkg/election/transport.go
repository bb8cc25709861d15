package election

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// WrapConfig returns a copy of cfg whose requests pass the write gate, for
// clients that are not controller-runtime's (client-go clientsets, dynamic
// clients): a POST, PUT or PATCH whose JSON body carries the label
// fencekeeper.io/lock=<Name> in the lock's namespace is refused without
// being sent unless the term is HELD, and otherwise gets the leader's epoch
// added. A write of a subresource in the lock's namespace (status, scale)
// needs the term whatever its body shows, and a JSON Scale body or merge
// patch of /scale gets the epoch too. The copy asks for JSON bodies (the
// gate reads them).
//
// What a body does not show, the gate cannot see: a JSON patch, or a merge
// patch that does not mention the label, passes unstamped, and the fencing
// admission refuses it as presenting no epoch. Include the label in such
// patches (lease.Stamp does), or use Gate. Denials come back as API errors;
// lease.IsStaleEpoch tells the stale ones.
func (l *Lock) WrapConfig(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.ContentType = "application/json"
	prev := out.WrapTransport
	out.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &gateTransport{next: rt, lock: l}
	}
	return out
}

type gateTransport struct {
	next http.RoundTripper
	lock *Lock
}

func (g *gateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || (req.Method != http.MethodPost && req.Method != http.MethodPut && req.Method != http.MethodPatch) {
		return g.next.RoundTrip(req)
	}
	ns, name, sub := requestScope(req.URL.Path)
	switch {
	case ns != g.lock.cfg.Namespace:
		return g.next.RoundTrip(req)
	case sub != "":
		return g.subresource(req, ns, name, sub)
	}
	ct, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	switch types.PatchType(ct) {
	case "application/json", types.MergePatchType, types.StrategicMergePatchType, types.ApplyYAMLPatchType:
	case types.JSONPatchType:
		return g.next.RoundTrip(req) // shows no labels: the admission check decides
	default:
		// CBOR or protobuf (a client that overrode WrapConfig's JSON): the
		// gate cannot tell whether the lock fences it, so it is not sent.
		_ = req.Body.Close()
		return nil, fmt.Errorf("write gate: %s %s: cannot read a %q body in the lock's namespace %s; use JSON (WrapConfig's ContentType)",
			req.Method, req.URL.Path, ct, ns)
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if lease.DecodeJSON(body, &obj) != nil {
		// Not a JSON object (an apply patch in YAML): unreadable, as above.
		return nil, fmt.Errorf("write gate: %s %s: cannot read the body as a JSON object in the lock's namespace %s; send JSON",
			req.Method, req.URL.Path, ns)
	}
	meta, _ := obj["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	if lock, _ := labels[fkv1.LabelLock].(string); lock != g.lock.cfg.Name {
		return g.next.RoundTrip(withBody(req, body))
	}
	name, _ = meta["name"].(string)
	t, ctx, cancel, err := g.permit(req, ns, name)
	if err != nil {
		return nil, err
	}
	lease.PresentIn(obj, t.Epoch)
	if body, err = json.Marshal(obj); err != nil {
		cancel()
		return nil, err
	}
	return g.within(ctx, cancel, withBody(req, body))
}

// subresource sends a write of a subresource in the lock's namespace only
// within the term, whatever its body shows: a Scale carries no labels and
// the server ignores a status body's, so neither tells whether the lock
// fences the object. Status has no check at the object, and a Scale stamped
// ahead of time must not go out after the term. A scale is fenced at the
// object, so its body also presents the term's epoch; a body that is not a
// JSON object (a JSON patch) goes as it is, and the object decides.
func (g *gateTransport) subresource(req *http.Request, ns, name, sub string) (*http.Response, error) {
	t, ctx, cancel, err := g.permit(req, ns, name)
	if err != nil {
		_ = req.Body.Close()
		return nil, err
	}
	if sub == "scale" {
		body, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			cancel()
			return nil, err
		}
		req = withBody(req, presentJSON(body, t.Epoch))
	}
	return g.within(ctx, cancel, req)
}

// permit is the live term for a request, and a context for it bounded by
// the moment the term would turn SUSPECT; or the refusal.
func (g *gateTransport) permit(req *http.Request, ns, name string) (*lease.Lease, context.Context, context.CancelFunc, error) {
	t, until, err := g.lock.leading()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("write gate: %s %s/%s refused before sending: %w", req.Method, ns, name, err)
	}
	ctx, cancel := context.WithDeadline(req.Context(), until)
	return t, ctx, cancel, nil
}

// within sends req under ctx, which ends once the reply has been read.
func (g *gateTransport) within(ctx context.Context, cancel context.CancelFunc, req *http.Request) (*http.Response, error) {
	resp, err := g.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose ends a request's context once its reply has been read.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// withBody is req carrying body (read from req already).
func withBody(req *http.Request, body []byte) *http.Request {
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return req
}

// presentJSON is data with the epoch token in its metadata.annotations
// when data is a JSON object (an object, a Scale, a merge or apply patch);
// anything else (a JSON patch, YAML) is returned as it is.
func presentJSON(data []byte, epoch int64) []byte {
	var obj map[string]any
	if lease.DecodeJSON(data, &obj) != nil || obj == nil {
		return data
	}
	lease.PresentIn(obj, epoch)
	out, err := json.Marshal(obj)
	if err != nil {
		return data
	}
	return out
}

// requestScope is the namespace of a namespaced resource path
// (/api/v1/namespaces/NS/RES[/NAME[/SUB]] or /apis/G/V/namespaces/...), the
// object's name and its subresource, if any.
func requestScope(path string) (ns, name, sub string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+1 < len(parts); i++ {
		if parts[i] == "namespaces" {
			rest := parts[i+2:] // RES, NAME, SUB
			if len(rest) >= 2 {
				name = rest[1]
			}
			if len(rest) >= 3 {
				sub = rest[2]
			}
			return parts[i+1], name, sub
		}
	}
	return "", "", ""
}

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
// added. The copy asks for JSON bodies (the gate reads them).
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
	ns, sub := requestScope(req.URL.Path)
	if ns != g.lock.cfg.Namespace {
		return g.next.RoundTrip(req)
	}
	// Status writes are not checked at the object: in the lock's namespace,
	// one whose body does not show the lock's label needs the term too.
	status := sub == "status"
	ct, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	switch types.PatchType(ct) {
	case "application/json", types.MergePatchType, types.StrategicMergePatchType, types.ApplyYAMLPatchType:
	case types.JSONPatchType:
		if !status {
			return g.next.RoundTrip(req) // shows no labels: the admission check decides
		}
		return g.send(req, nil, nil, "", false)
	default:
		// CBOR or protobuf (a client that overrode WrapConfig's JSON): the
		// gate cannot read it, and status writes have no check at the
		// object, so it is not sent.
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
	name, _ := meta["name"].(string)
	if lock, shown := labels[fkv1.LabelLock].(string); lock != g.lock.cfg.Name {
		if !status || shown {
			return g.forward(req, body)
		}
		return g.send(req, body, nil, name, false)
	}
	return g.send(req, body, obj, name, sub == "")
}

// send forwards a request that needs the term: refused unless HELD, bounded
// by the moment the term would turn SUSPECT, and (stamp) with the epoch
// added to obj, the body's object.
func (g *gateTransport) send(req *http.Request, body []byte, obj map[string]any, name string, stamp bool) (*http.Response, error) {
	t, until, err := g.lock.leading()
	if err != nil {
		if req.Body != nil && body == nil {
			_ = req.Body.Close()
		}
		ns, _ := requestScope(req.URL.Path)
		return nil, fmt.Errorf("write gate: %s %s/%s refused before sending: %w", req.Method, ns, name, err)
	}
	if stamp {
		meta := obj["metadata"].(map[string]any)
		ann, _ := meta["annotations"].(map[string]any)
		if ann == nil {
			ann = map[string]any{}
			meta["annotations"] = ann
		}
		ann[fkv1.AnnotationEpoch] = fkv1.FormatEpoch(t.Epoch)
		if body, err = json.Marshal(obj); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithDeadline(req.Context(), until)
	req = req.WithContext(ctx)
	var resp *http.Response
	if body == nil {
		resp, err = g.next.RoundTrip(req)
	} else {
		resp, err = g.forward(req, body)
	}
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

func (g *gateTransport) forward(req *http.Request, body []byte) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return g.next.RoundTrip(req)
}

// requestScope is the namespace of a namespaced resource path
// (/api/v1/namespaces/NS/RES[/NAME[/SUB]] or /apis/G/V/namespaces/...) and
// its subresource, if any.
func requestScope(path string) (ns, sub string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+1 < len(parts); i++ {
		if parts[i] == "namespaces" {
			rest := parts[i+2:] // RES, NAME, SUB
			if len(rest) >= 3 {
				sub = rest[2]
			}
			return parts[i+1], sub
		}
	}
	return "", ""
}

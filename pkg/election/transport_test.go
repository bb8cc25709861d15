package election

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

type recordingTransport struct{ bodies []string }

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	b := ""
	if req.Body != nil {
		raw, _ := io.ReadAll(req.Body)
		b = string(raw)
	}
	r.bodies = append(r.bodies, b)
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

// The transport gate without a term: what it forwards, what it refuses
// without sending, and what it cannot read. No server is involved.
func TestTransportGateWithoutATerm(t *testing.T) {
	l, err := NewFromClient(nil, Config{Namespace: "ops", Name: "allocator", Identity: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	fenced := `{"metadata":{"name":"table","labels":{"fencekeeper.io/lock":"allocator"}},"data":{"n":"1"}}`
	scale := `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"table","annotations":{"fencekeeper.io/epoch":"41"}},"spec":{"replicas":3}}`
	cases := []struct {
		name, method, path, contentType, body string
		forwarded                             bool
		wantErr                               error
	}{
		{"fenced create, no term", http.MethodPost, "/api/v1/namespaces/ops/configmaps", "application/json", fenced, false, ErrNotLeading},
		{"fenced merge patch, no term", http.MethodPatch, "/api/v1/namespaces/ops/configmaps/table", "application/merge-patch+json", fenced, false, ErrNotLeading},
		{"fenced status update, no term", http.MethodPut, "/apis/example.com/v1/namespaces/ops/reports/table/status", "application/json", fenced, false, ErrNotLeading},
		{"unfenced create", http.MethodPost, "/api/v1/namespaces/ops/configmaps", "application/json", `{"metadata":{"name":"plain"}}`, true, nil},
		{"another lock's object", http.MethodPost, "/api/v1/namespaces/ops/configmaps", "application/json", strings.ReplaceAll(fenced, `"allocator"`, `"other"`), true, nil},
		{"another namespace", http.MethodPost, "/api/v1/namespaces/dev/configmaps", "application/json", fenced, true, nil},
		{"JSON patch (the object decides)", http.MethodPatch, "/api/v1/namespaces/ops/configmaps/table", "application/json-patch+json", `[{"op":"add","path":"/data/x","value":"1"}]`, true, nil},
		{"protobuf in the lock's namespace", http.MethodPost, "/api/v1/namespaces/ops/configmaps", "application/vnd.kubernetes.protobuf", "k8s\x00", false, nil},
		{"YAML apply in the lock's namespace", http.MethodPatch, "/api/v1/namespaces/ops/configmaps/table", "application/apply-patch+yaml", "metadata:\n  name: table\n", false, nil},
		{"status merge patch not showing the label (no check at the object)", http.MethodPatch, "/apis/example.com/v1/namespaces/ops/reports/table/status", "application/merge-patch+json", `{"status":{"phase":"x"}}`, false, ErrNotLeading},
		{"status JSON patch (no check at the object)", http.MethodPatch, "/apis/example.com/v1/namespaces/ops/reports/table/status", "application/json-patch+json", `[{"op":"add","path":"/status/phase","value":"x"}]`, false, ErrNotLeading},
		// A body's labels do not decide for subresources: a Scale has none, and the server ignores a status body's.
		{"status of an object showing another lock", http.MethodPut, "/apis/example.com/v1/namespaces/ops/reports/other/status", "application/json", strings.ReplaceAll(fenced, `"allocator"`, `"other"`), false, ErrNotLeading},
		{"protobuf status in the lock's namespace", http.MethodPut, "/apis/example.com/v1/namespaces/ops/reports/table/status", "application/vnd.kubernetes.protobuf", "k8s\x00", false, ErrNotLeading},
		{"scale stamped ahead of time, no term", http.MethodPut, "/apis/example.com/v1/namespaces/ops/reports/table/scale", "application/json", scale, false, ErrNotLeading},
		{"scale merge patch, no term", http.MethodPatch, "/apis/example.com/v1/namespaces/ops/reports/table/scale", "application/merge-patch+json", `{"spec":{"replicas":3}}`, false, ErrNotLeading},
		{"scale JSON patch, no term", http.MethodPatch, "/apis/apps/v1/namespaces/ops/deployments/table/scale", "application/json-patch+json", `[{"op":"replace","path":"/spec/replicas","value":3}]`, false, ErrNotLeading},
		{"scale in another namespace", http.MethodPut, "/apis/example.com/v1/namespaces/dev/reports/table/scale", "application/json", scale, true, nil},
		{"status in another namespace", http.MethodPatch, "/apis/example.com/v1/namespaces/dev/reports/table/status", "application/merge-patch+json", `{"status":{"phase":"x"}}`, true, nil},
		{"delete", http.MethodDelete, "/api/v1/namespaces/ops/configmaps/table", "", "", true, nil},
	}
	for _, tc := range cases {
		rec := &recordingTransport{}
		gt := &gateTransport{next: rec, lock: l}
		req, _ := http.NewRequest(tc.method, "https://apiserver"+tc.path, strings.NewReader(tc.body))
		if tc.body == "" {
			req.Body = nil
		}
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		resp, err := gt.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		if got := len(rec.bodies) == 1; got != tc.forwarded {
			t.Errorf("%s: forwarded=%v, want %v (err %v)", tc.name, got, tc.forwarded, err)
		}
		if tc.forwarded && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if !tc.forwarded && err == nil {
			t.Errorf("%s: refused without an error", tc.name)
		}
		if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.wantErr)
		}
		if tc.forwarded && tc.body != "" && rec.bodies[0] != tc.body {
			t.Errorf("%s: the body was changed: %s", tc.name, rec.bodies[0])
		}
	}
}

// presentJSON puts the token where the object's check reads it, in a body
// that names no metadata too (a merge patch of /scale), keeps the rest as
// written (integers above 2^53 included), and leaves what is not a JSON
// object alone.
func TestPresentJSON(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"scale merge patch without metadata", `{"spec":{"replicas":3}}`, `{"metadata":{"annotations":{"fencekeeper.io/epoch":"42"}},"spec":{"replicas":3}}`},
		{"a stale token is replaced", `{"metadata":{"annotations":{"fencekeeper.io/epoch":"41","a":"b"}},"spec":{"n":9007199254740993}}`, `{"metadata":{"annotations":{"a":"b","fencekeeper.io/epoch":"42"}},"spec":{"n":9007199254740993}}`},
		{"JSON patch", `[{"op":"replace","path":"/spec/replicas","value":3}]`, `[{"op":"replace","path":"/spec/replicas","value":3}]`},
		{"YAML", "spec:\n  replicas: 3\n", "spec:\n  replicas: 3\n"},
	}
	for _, tc := range cases {
		if got := string(presentJSON([]byte(tc.in), 42)); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

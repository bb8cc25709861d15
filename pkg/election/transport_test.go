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
		{"status of another lock's object", http.MethodPut, "/apis/example.com/v1/namespaces/ops/reports/other/status", "application/json", strings.ReplaceAll(fenced, `"allocator"`, `"other"`), true, nil},
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
		_, err := gt.RoundTrip(req)
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

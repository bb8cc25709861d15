package webhook

import (
	"strings"
	"testing"
)

func TestParseGuardedResource(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    GuardedResource
		wantErr string
	}{
		{in: "configmaps", want: GuardedResource{Version: "v1", Resource: "configmaps"}},
		// A version listed still fences every version (a write through
		// another reaches admission converted, its own fields hidden).
		{in: "deployments.apps/v1", want: GuardedResource{Group: "apps", Version: "*", Resource: "deployments"}},
		{in: "reports.reports.example.com/v1beta1", want: GuardedResource{Group: "reports.example.com", Version: "*", Resource: "reports"}},
		{in: "configmaps/v1", want: GuardedResource{Version: "v1", Resource: "configmaps"}},
		{in: "configmaps/status", wantErr: `"status" is not an API version`},
		{in: "deployments.apps/scale", wantErr: `"scale" is not an API version`},
		{in: "deployments.apps/v1/scale", wantErr: `"v1/scale" is not an API version`},
		{in: "reports.reports.example.com", want: GuardedResource{Group: "reports.example.com", Version: "*", Resource: "reports"}},
		{in: "pods", wantErr: "pods cannot be fenced"},
		{in: "pods/v1", wantErr: "pods cannot be fenced"},
		{in: "pods.example.com", want: GuardedResource{Group: "example.com", Version: "*", Resource: "pods"}},
		{in: "*", wantErr: "want RESOURCE[.GROUP]"},
		{in: "config maps", wantErr: "want RESOURCE[.GROUP]"},
		{in: "", wantErr: "want RESOURCE[.GROUP]"},
	} {
		got, err := ParseGuardedResource(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseGuardedResource(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseGuardedResource(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

package election

import (
	"strings"
	"testing"
	"time"
)

// Bad configuration is refused by New with an error naming the field,
// before any claim is queued (the queueing goroutine would retry forever).
func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no namespace", Config{Name: "op", Identity: "r"}, "Config.Namespace and Config.Name are required"},
		{"no name", Config{Namespace: "ns", Identity: "r"}, "Config.Namespace and Config.Name are required"},
		{"upper-case name", Config{Namespace: "ns", Name: "Op", Identity: "r"}, `Config.Name: invalid lock name "Op"`},
		{"name too long", Config{Namespace: "ns", Name: strings.Repeat("a", 64), Identity: "r"}, "Config.Name: invalid lock name"},
		{"identity too long", Config{Namespace: "ns", Name: "op", Identity: strings.Repeat("r", 254)}, "Config.Identity: invalid holder"},
		{"TTL below a second", Config{Namespace: "ns", Name: "op", Identity: "r", TTL: 500 * time.Millisecond}, "TTL 500ms: want whole seconds"},
		{"TTL not whole seconds", Config{Namespace: "ns", Name: "op", Identity: "r", TTL: 1500 * time.Millisecond}, "TTL 1.5s: want whole seconds"},
	}
	for _, tc := range cases {
		_, err := NewFromClient(nil, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := NewFromClient(nil, Config{Namespace: "ns", Name: "range-allocator", Identity: "replica-a"}); err != nil {
		t.Errorf("a valid configuration: %v", err)
	}
}

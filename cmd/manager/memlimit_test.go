package main

import (
	"errors"
	"testing"
)

func TestSoftMemoryLimit(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(f string) ([]byte, error) {
			if s, ok := m[f]; ok {
				return []byte(s), nil
			}
			return nil, errors.New("no such file")
		}
	}
	env := func(v string) func(string) string { return func(string) string { return v } }
	const mi = 1 << 20
	for _, tc := range []struct {
		name  string
		env   string
		files map[string]string
		ratio float64
		want  int64
		ok    bool
	}{
		{"cgroup v2 limit", "", map[string]string{"/sys/fs/cgroup/memory.max": "805306368\n"}, 0.8, 644245094, true},
		{"cgroup v1 limit", "", map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "268435456"}, 0.8, 214748364, true},
		{"no limit (v2)", "", map[string]string{"/sys/fs/cgroup/memory.max": "max"}, 0.8, 0, false},
		{"no limit (v1)", "", map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}, 0.8, 0, false},
		{"no cgroup", "", nil, 0.8, 0, false},
		{"GOMEMLIMIT wins", "128MiB", map[string]string{"/sys/fs/cgroup/memory.max": "805306368"}, 0.8, 0, false},
		{"ratio 0 turns it off", "", map[string]string{"/sys/fs/cgroup/memory.max": "805306368"}, 0, 0, false},
		{"garbage", "", map[string]string{"/sys/fs/cgroup/memory.max": "lots"}, 0.8, 0, false},
	} {
		got, ok := softMemoryLimit(env(tc.env), files(tc.files), tc.ratio)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: got %d (%.0f MiB) %v, want %d %v", tc.name, got, float64(got)/mi, ok, tc.want, tc.ok)
		}
	}
}

func TestGCPercent(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	for _, tc := range []struct {
		name string
		env  string
		pct  int
		want int
		ok   bool
	}{
		{"default target", "", 50, 50, true},
		{"GOGC wins", "200", 50, 0, false},
		{"GOGC=off wins", "off", 50, 0, false},
		{"0 leaves the runtime's default", "", 0, 0, false},
	} {
		got, ok := gcPercent(env(tc.env), tc.pct)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: got %d %v, want %d %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

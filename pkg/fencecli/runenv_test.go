package fencecli

import (
	"slices"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// Each lock's epoch is in FENCEKEEPER_EPOCH_<LOCK>: the name upper-cased,
// '-' and '.' (valid in a lock name, not in a variable's) as '_'.
func TestEpochVar(t *testing.T) {
	for lock, want := range map[string]string{
		"a":              "FENCEKEEPER_EPOCH_A",
		"report-2026-07": "FENCEKEEPER_EPOCH_REPORT_2026_07",
		"ledger.v2":      "FENCEKEEPER_EPOCH_LEDGER_V2",
		"2026.q3-books":  "FENCEKEEPER_EPOCH_2026_Q3_BOOKS",
		"a-b":            "FENCEKEEPER_EPOCH_A_B",
		"a.b":            "FENCEKEEPER_EPOCH_A_B", // so a-b,a.b is refused (TestFlagAndArgumentErrors)
	} {
		got := EpochVar(lock)
		if got != want {
			t.Errorf("EpochVar(%q) = %q, want %q", lock, got, want)
		}
		for _, r := range got {
			if valid := r == '_' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9'; !valid {
				t.Errorf("EpochVar(%q) = %q: %q is not valid in a portable variable name", lock, got, r)
			}
		}
	}
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v // the last wins, as in exec.Cmd
	}
	return m
}

// One lock: the variables run always set, and FENCEKEEPER_EPOCH_<LOCK>.
// Several: FENCEKEEPER_EPOCH_<LOCK> for each, the holder and the namespace,
// and none of the variables that name one lock, not even inherited ones.
func TestRunEnv(t *testing.T) {
	inherited := []string{"PATH=/bin", "FENCEKEEPER_EPOCH=3", "FENCEKEEPER_LOCK=outer", "FENCEKEEPER_CLAIM=outer-1", "FENCEKEEPER_EPOCH_OUTER=3"}
	report := &lease.Lease{Lock: "report-2026-07", Epoch: 42, ClaimName: "report-2026-07-0123456789ab"}
	ledger := &lease.Lease{Lock: "ledger.2026-07", Epoch: 7, ClaimName: "ledger.2026-07-0123456789ab"}

	one := envMap(runEnv(inherited, "reports", "W1", []*lease.Lease{report}))
	for k, want := range map[string]string{
		"PATH": "/bin", "FENCEKEEPER_EPOCH": "42", "FENCEKEEPER_LOCK": "report-2026-07", "FENCEKEEPER_HOLDER": "W1",
		"FENCEKEEPER_CLAIM": "report-2026-07-0123456789ab", "FENCEKEEPER_NAMESPACE": "reports",
		"FENCEKEEPER_EPOCH_REPORT_2026_07": "42", "FENCEKEEPER_EPOCH_OUTER": "3",
	} {
		if one[k] != want {
			t.Errorf("one lock: %s=%q, want %q", k, one[k], want)
		}
	}

	several := runEnv(inherited, "reports", "W1", []*lease.Lease{ledger, report})
	got := envMap(several)
	for k, want := range map[string]string{
		"PATH": "/bin", "FENCEKEEPER_HOLDER": "W1", "FENCEKEEPER_NAMESPACE": "reports",
		"FENCEKEEPER_EPOCH_REPORT_2026_07": "42", "FENCEKEEPER_EPOCH_LEDGER_2026_07": "7", "FENCEKEEPER_EPOCH_OUTER": "3",
	} {
		if got[k] != want {
			t.Errorf("several locks: %s=%q, want %q", k, got[k], want)
		}
	}
	for _, k := range oneLockVars {
		if v, ok := got[k]; ok {
			t.Errorf("several locks: %s=%q is set; it names one lock", k, v)
		}
	}
	if !slices.Equal(inherited[:2], []string{"PATH=/bin", "FENCEKEEPER_EPOCH=3"}) {
		t.Errorf("runEnv changed the environment it was given: %q", inherited)
	}
}

// validLocks refuses before any request what AcquireAll would, and two
// locks that would share a variable; one lock is checked as always.
func TestValidLocks(t *testing.T) {
	for arg, want := range map[string]string{
		"a":                            "",
		"b,a":                          "",
		"a,b,c.d,e-f":                  "",
		"a,a":                          `lock "a" is given twice`,
		"a,":                           "lock 2 of 2 is empty",
		"":                             `invalid lock name ""`,
		"Bad_Lock":                     `invalid lock name "Bad_Lock"`,
		"ok,Bad_Lock":                  `invalid lock name "Bad_Lock"`,
		"x-y.z,x.y-z":                  `would both export FENCEKEEPER_EPOCH_X_Y_Z`,
		"a," + strings.Repeat("b", 64): `invalid lock name "` + strings.Repeat("b", 64) + `"`,
	} {
		err := validLocks(arg)
		switch {
		case want == "" && err != nil:
			t.Errorf("validLocks(%q): %v", arg, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("validLocks(%q): %v, want an error saying %q", arg, err, want)
		}
	}
}

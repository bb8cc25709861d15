package fencecli

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func semaphoreLedger(permits ...fkv1.Permit) fkv1.Ledger {
	return fkv1.Ledger{Exists: true, Epoch: 43, EpochValid: true, Capacity: 3, Permits: permits}
}

var (
	p41 = fkv1.Permit{Epoch: 41, Claim: "w1-warehouse", UID: "u1", Holder: "W1"}
	p43 = fkv1.Permit{Epoch: 43, Claim: "w3-warehouse", UID: "u3", Holder: "W3"}
)

// break on a semaphore lock needs to be told which permit, and refuses
// otherwise, listing the live ones; on a mutex lock --epoch and --claim
// check the hold is still the one meant.
func TestBreakPicksTheHold(t *testing.T) {
	mutex := fkv1.Ledger{Exists: true, Epoch: 42, EpochValid: true, HolderClaim: "w1-report", HolderUID: "m1", HolderIdentity: "W1"}
	for _, tc := range []struct {
		name   string
		flags  breakFlags
		led    fkv1.Ledger
		claim  string
		uid    types.UID
		errHas []string
	}{
		{"mutex: its holder", breakFlags{}, mutex, "w1-report", "m1", nil},
		{"mutex: --epoch of the holder", breakFlags{epoch: 42}, mutex, "w1-report", "m1", nil},
		{"mutex: --claim of the holder", breakFlags{claim: "w1-report"}, mutex, "w1-report", "m1", nil},
		{"mutex: another epoch", breakFlags{epoch: 41}, mutex, "", "", []string{"held by claim w1-report with epoch 42, not the hold named by --epoch 41"}},
		{"mutex: another claim", breakFlags{claim: "w0"}, mutex, "", "", []string{"not the hold named by --claim w0"}},
		{"mutex: free", breakFlags{}, fkv1.Ledger{Exists: true, Epoch: 42, EpochValid: true}, "", "", []string{"is free (last epoch 42)"}},
		{"semaphore: by epoch", breakFlags{epoch: 43}, semaphoreLedger(p41, p43), "w3-warehouse", "u3", nil},
		{"semaphore: by claim", breakFlags{claim: "w1-warehouse"}, semaphoreLedger(p41, p43), "w1-warehouse", "u1", nil},
		{"semaphore: which one?", breakFlags{}, semaphoreLedger(p41, p43), "", "", []string{
			"is a semaphore (capacity 3) with 2 live permits: say which to break with --epoch E or --claim NAME",
			"epoch 41  holder W1  claim w1-warehouse", "epoch 43  holder W3  claim w3-warehouse"}},
		{"semaphore: no such permit", breakFlags{epoch: 42}, semaphoreLedger(p41, p43), "", "", []string{"has no live permit with --epoch 42", "epoch 41  holder W1"}},
		{"semaphore: none live", breakFlags{epoch: 41}, semaphoreLedger(), "", "", []string{"(capacity 3) has no live permit: nothing to break"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim, uid, err := tc.flags.pick("ns", "lock", tc.led)
			if tc.errHas == nil {
				if err != nil || claim != tc.claim || uid != tc.uid {
					t.Fatalf("got %q %q %v, want %q %q", claim, uid, err, tc.claim, tc.uid)
				}
				return
			}
			if err == nil {
				t.Fatalf("got %q, want an error", claim)
			}
			for _, w := range tc.errHas {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestPermitList(t *testing.T) {
	if got, want := permitList([]fkv1.Permit{p41, p43}), "W1 with epoch 41 (claim w1-warehouse), W3 with epoch 43 (claim w3-warehouse)"; got != want {
		t.Errorf("permitList = %q, want %q", got, want)
	}
	if ledgerCapacity(fkv1.Ledger{}) != 1 || ledgerCapacity(semaphoreLedger()) != 3 {
		t.Error("ledgerCapacity")
	}
}

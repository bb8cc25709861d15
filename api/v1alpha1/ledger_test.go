package v1alpha1

import (
	"testing"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestParseEpoch(t *testing.T) {
	good := map[string]int64{"1": 1, "42": 42, "9223372036854775807": 9223372036854775807}
	for s, want := range good {
		if got, err := ParseEpoch(s); err != nil || got != want {
			t.Errorf("ParseEpoch(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "0", "abc", "-1", "+5", " 5", "5 ", "05", "9223372036854775808", "1e3", "0x10", "٤٢"} {
		if _, err := ParseEpoch(s); err == nil {
			t.Errorf("ParseEpoch(%q) succeeded, want an error", s)
		}
	}
}

func TestReadLedgerCounterGrammar(t *testing.T) {
	// The Lease's counter uses the epoch grammar plus 0 (a Lease that never granted).
	cases := map[string]struct {
		epoch int64
		valid bool
	}{
		"0": {0, true}, "1": {1, true}, "42": {42, true}, "9223372036854775807": {9223372036854775807, true},
		"": {0, false}, "-1": {0, false}, "+5": {0, false}, "05": {0, false}, "00": {0, false},
		"9223372036854775808": {0, false}, "-9223372036854775808": {0, false},
	}
	for raw, want := range cases {
		l := ReadLedger(managedLease(map[string]string{AnnotationEpoch: raw}), "report-2026-07")
		if l.Epoch != want.epoch || l.EpochValid != want.valid {
			t.Errorf("counter %q: got %d/%v, want %d/%v", raw, l.Epoch, l.EpochValid, want.epoch, want.valid)
		}
	}
	if l := ReadLedger(managedLease(nil), "report-2026-07"); l.EpochValid {
		t.Errorf("a missing counter read as valid")
	}
}

func TestReadLedger(t *testing.T) {
	g := NewWithT(t)
	g.Expect(ReadLedger(nil, "x")).To(Equal(Ledger{EpochValid: true}), "no Lease: a fresh, empty ledger")

	lease := managedLease(map[string]string{
		AnnotationEpoch: "42", AnnotationClaim: "w2-report", AnnotationClaimUID: "uid-w2", AnnotationPreviousClaimUID: "uid-w1",
	})
	lease.Spec.HolderIdentity = ptr.To("W2")
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(30))
	l := ReadLedger(lease, "report-2026-07")
	g.Expect(l).To(Equal(Ledger{Exists: true, Epoch: 42, EpochValid: true, HolderClaim: "w2-report", HolderUID: "uid-w2",
		HolderIdentity: "W2", PreviousUID: "uid-w1", LeaseDurationSeconds: 30, Adopted: true}))
	g.Expect(l.Held()).To(BeTrue())
	g.Expect(l.HeldEpoch()).To(Equal(int64(42)))

	g.Expect(ReadLedger(lease, "another-lock").Adopted).To(BeFalse(), "lock label must name this lock")
	lease.Finalizers = nil
	g.Expect(ReadLedger(lease, "report-2026-07").Adopted).To(BeFalse(), "finalizer missing")
	delete(lease.Labels, LabelManagedBy)
	g.Expect(ReadLedger(lease, "report-2026-07").Exists).To(BeFalse(), "an unmanaged Lease is no ledger")

	free := ReadLedger(managedLease(map[string]string{AnnotationEpoch: "42"}), "report-2026-07")
	g.Expect(free.Held()).To(BeFalse())
	g.Expect(free.HeldEpoch()).To(BeZero())
}

func TestLedgerApplyToRoundTrips(t *testing.T) {
	g := NewWithT(t)
	in := Ledger{Exists: true, Epoch: 43, EpochValid: true, HolderClaim: "w3", HolderUID: "uid-w3", PreviousUID: "uid-w2"}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "report-2026-07",
		Annotations: map[string]string{"unrelated": "kept"}, Finalizers: []string{LeaseFinalizer}}}
	in.ApplyTo(lease, "report-2026-07")
	g.Expect(lease.Labels).To(Equal(map[string]string{LabelManagedBy: ManagedByValue, LabelLock: "report-2026-07"}))
	g.Expect(lease.Annotations).To(HaveKeyWithValue("unrelated", "kept"))
	out := ReadLedger(lease, "report-2026-07")
	g.Expect(out.Epoch).To(Equal(in.Epoch))
	g.Expect(out.HolderUID).To(Equal(in.HolderUID))
	g.Expect(out.HolderClaim).To(Equal(in.HolderClaim))
	g.Expect(out.PreviousUID).To(Equal(in.PreviousUID))
	g.Expect(out.Adopted).To(BeTrue())

	// Freeing the lock removes the holder annotations and keeps the epoch.
	out.HolderClaim, out.HolderUID = "", ""
	out.ApplyTo(lease, "report-2026-07")
	g.Expect(lease.Annotations).NotTo(HaveKey(AnnotationClaim))
	g.Expect(lease.Annotations).NotTo(HaveKey(AnnotationClaimUID))
	g.Expect(lease.Annotations).To(HaveKeyWithValue(AnnotationEpoch, "43"))
}

func TestAdmissionReasonCauses(t *testing.T) {
	g := NewWithT(t)
	g.Expect(AdmissionStaleEpoch.CauseType()).To(Equal("fencekeeper.io/StaleEpoch"))
	for _, r := range []AdmissionReason{AdmissionStaleEpoch, AdmissionNotCurrentEpoch} {
		g.Expect(r.IsStaleHolder()).To(BeTrue(), string(r))
	}
	for _, r := range []AdmissionReason{AdmissionFutureEpoch, AdmissionMissingEpoch, AdmissionMalformedEpoch, AdmissionEpochAccepted} {
		g.Expect(r.IsStaleHolder()).To(BeFalse(), string(r))
	}
}

func managedLease(ann map[string]string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: "report-2026-07", Namespace: "reports", Annotations: ann,
		Labels:     map[string]string{LabelManagedBy: ManagedByValue, LabelLock: "report-2026-07"},
		Finalizers: []string{LeaseFinalizer},
	}}
}

func TestLedgerPermitsRoundTrip(t *testing.T) {
	g := NewWithT(t)
	lease := managedLease(map[string]string{AnnotationEpoch: "12"})
	l := ReadLedger(lease, "warehouse")
	g.Expect(l.MaxHolders()).To(Equal(int32(1)))
	g.Expect(l.IsMutexLedger()).To(BeTrue())
	g.Expect(l.IsSemaphore()).To(BeFalse())
	l.Capacity = 3
	l.Permits = []Permit{
		{Epoch: 12, Claim: "w2", UID: "u2", Holder: "worker-2", User: "alice", TTL: 15},
		{Epoch: 11, Claim: "w1", UID: "u1", Holder: "worker-1", PodUID: "p1", TTL: 30},
	}
	l.ApplyTo(lease, "warehouse")
	g.Expect(lease.Annotations).To(HaveKeyWithValue(AnnotationMaxHolders, "3"))
	g.Expect(lease.Annotations).To(HaveKey("fencekeeper.io/permit-11"))
	back := ReadLedger(lease, "warehouse")
	g.Expect(back.IsSemaphore()).To(BeTrue())
	g.Expect(back.PermitsInvalid).To(BeFalse())
	g.Expect(back.IsMutexLedger()).To(BeFalse())
	g.Expect(back.Permits).To(HaveLen(2))
	g.Expect(back.Permits[0].Epoch).To(Equal(int64(11)), "by epoch")
	p, ok := back.PermitOf(12)
	g.Expect(ok).To(BeTrue())
	g.Expect(p.User).To(Equal("alice"))
	_, ok = back.PermitFor("u1")
	g.Expect(ok).To(BeTrue())
	_, ok = back.PermitOf(10)
	g.Expect(ok).To(BeFalse())

	// Back to a mutex: every permit annotation and the capacity go.
	back.Capacity, back.Permits = 1, nil
	back.ApplyTo(lease, "warehouse")
	for k := range lease.Annotations {
		g.Expect(k).NotTo(HavePrefix(AnnotationPermitPrefix))
	}
	g.Expect(lease.Annotations).NotTo(HaveKey(AnnotationMaxHolders))
}

func TestLedgerPermitsMalformed(t *testing.T) {
	for name, ann := range map[string]map[string]string{
		"bad epoch key":   {"fencekeeper.io/permit-012": `{"claim":"a","uid":"u"}`},
		"zero epoch key":  {"fencekeeper.io/permit-0": `{"claim":"a","uid":"u"}`},
		"not json":        {"fencekeeper.io/permit-3": `claim=a`},
		"no claim uid":    {"fencekeeper.io/permit-3": `{"claim":"a"}`},
		"no claim name":   {"fencekeeper.io/permit-3": `{"uid":"u"}`},
		"non-digit epoch": {"fencekeeper.io/permit-x": `{"claim":"a","uid":"u"}`},
	} {
		ann[AnnotationEpoch] = "3"
		if l := ReadLedger(managedLease(ann), "warehouse"); !l.PermitsInvalid || len(l.Permits) != 0 || l.IsMutexLedger() {
			t.Errorf("%s: PermitsInvalid %v, permits %v; want invalid and none", name, l.PermitsInvalid, l.Permits)
		}
	}
	for raw, want := range map[string]int32{"2": 2, "100": 100, "1": 1} {
		if l := ReadLedger(managedLease(map[string]string{AnnotationEpoch: "3", AnnotationMaxHolders: raw}), "w"); l.CapacityInvalid || l.MaxHolders() != want {
			t.Errorf("capacity %q: got %d/%v", raw, l.Capacity, l.CapacityInvalid)
		}
	}
	for _, raw := range []string{"0", "101", "-1", "03", "x", ""} {
		if l := ReadLedger(managedLease(map[string]string{AnnotationEpoch: "3", AnnotationMaxHolders: raw}), "w"); !l.CapacityInvalid || l.IsMutexLedger() {
			t.Errorf("capacity %q read as valid (%d)", raw, l.Capacity)
		}
	}
}

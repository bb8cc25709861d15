package authority_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var _ = Describe("FencedLease validation by the apiserver", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	DescribeTable("rejects invalid specs with a clear message",
		func(lock, holder string, ttl *int32, want string) {
			c := newClaim(ns, "bad", lock, holder, 1)
			c.Spec.LeaseDurationSeconds = ttl
			err := k8s.Create(ctx, c)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("lockName not DNS-1123", "Bad_Name", "W1", nil, "spec.lockName"),
		Entry("lockName too long for a label value", string(make([]byte, 0))+"a23456789012345678901234567890123456789012345678901234567890abcd", "W1", nil, "spec.lockName"),
		Entry("empty holder", "report", "", nil, "spec.holderIdentity"),
		Entry("TTL 0", "report", "W1", ptr.To(int32(0)), "spec.leaseDurationSeconds"),
		Entry("TTL 10^6", "report", "W1", ptr.To(int32(1000000)), "spec.leaseDurationSeconds"),
	)

	It("says what a lock name may be, not the regular expression", func() {
		err := k8s.Create(ctx, newClaim(ns, "bad", "Not_A_Lock", "W1", 30))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.lockName: Invalid value: \"Not_A_Lock\": lockName must be a DNS-1123 subdomain: " +
			"lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (e.g. report-2026-07)"))
		Expect(err.Error()).NotTo(ContainSubstring("[a-z0-9]"))
	})

	It("reports a spec field of the wrong type as the schema's error, not the claim-identity policy's", func() {
		for field, value := range map[string]any{"leaseDurationSeconds": "30", "lockName": 7, "holderIdentity": true, "acquireTimeoutSeconds": "5"} {
			spec := map[string]any{"lockName": "report", "holderIdentity": "W1", "leaseDurationSeconds": int64(30)}
			spec[field] = value
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": fkv1.GroupVersion.String(), "kind": "FencedLease",
				"metadata": map[string]any{"name": "typed", "namespace": ns},
				"spec":     spec,
			}}
			err := k8s.Create(ctx, u)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s: %v", field, err)
			Expect(err.Error()).To(ContainSubstring("spec."+field+" in body must be of type"), field)
			Expect(err.Error()).NotTo(ContainSubstring("typed object"), field)
			Expect(err.Error()).NotTo(ContainSubstring("fencekeeper-claim-identity"), field)
		}
		By("a TTL with a fraction is numeric to the policy and refused by the schema")
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": fkv1.GroupVersion.String(), "kind": "FencedLease",
			"metadata": map[string]any{"name": "typed", "namespace": ns},
			"spec":     map[string]any{"lockName": "report", "holderIdentity": "W1", "leaseDurationSeconds": 30.5},
		}}
		err := k8s.Create(ctx, u)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.leaseDurationSeconds"))
	})

	It("bounds acquireTimeoutSeconds and keeps it immutable: not changed, added or removed after creation", func() {
		for _, bad := range []int32{-1, 86401} {
			c := newClaim(ns, "bad-timeout", "report", "W1", 30)
			c.Spec.AcquireTimeoutSeconds = ptr.To(bad)
			err := k8s.Create(ctx, c)
			Expect(err).To(HaveOccurred(), "acquireTimeoutSeconds %d", bad)
			Expect(err.Error()).To(ContainSubstring("spec.acquireTimeoutSeconds"))
		}
		c := newClaim(ns, "timeout", "report-timeout", "W1", 30)
		c.Spec.AcquireTimeoutSeconds = ptr.To(int32(60))
		Expect(k8s.Create(ctx, c)).To(Succeed())
		for _, patch := range []string{`{"spec":{"acquireTimeoutSeconds":5}}`, `{"spec":{"acquireTimeoutSeconds":null}}`} {
			err := k8s.Patch(ctx, getClaim(ns, "timeout"), client.RawPatch(types.MergePatchType, []byte(patch)))
			Expect(err).To(HaveOccurred(), patch)
			Expect(err.Error()).To(ContainSubstring("acquireTimeoutSeconds is immutable"), patch)
		}
		plain := createClaim(ns, "no-timeout", "report-timeout", "W2", 30)
		err := k8s.Patch(ctx, plain, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"acquireTimeoutSeconds":0}}`)))
		Expect(err).To(HaveOccurred(), "adding a deadline after creation")
		Expect(err.Error()).To(ContainSubstring("acquireTimeoutSeconds is immutable"))
		Expect(*getClaim(ns, "timeout").Spec.AcquireTimeoutSeconds).To(Equal(int32(60)))
		Expect(getClaim(ns, "no-timeout").Spec.AcquireTimeoutSeconds).To(BeNil())
	})

	It("bounds maxHolders to 1..100, defaults it to 1 and keeps it immutable, whatever the patch", func() {
		for _, bad := range []int32{0, -3, 101} {
			c := newClaim(ns, "bad-capacity", "warehouse", "W1", 30)
			c.Spec.MaxHolders = ptr.To(bad)
			err := k8s.Create(ctx, c)
			Expect(err).To(HaveOccurred(), "maxHolders %d", bad)
			Expect(err.Error()).To(ContainSubstring("spec.maxHolders"))
		}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad-capacity"}, &fkv1.FencedLease{})).NotTo(Succeed(), "nothing stored")
		plain := createClaim(ns, "mutex", "warehouse-plain", "W1", 30)
		Expect(getClaim(ns, plain.Name).Spec.MaxHolders).To(Equal(ptr.To(int32(1))), "defaulted to a mutex")
		c := newClaim(ns, "three", "warehouse", "W1", 30)
		c.Spec.MaxHolders = ptr.To(int32(3))
		Expect(k8s.Create(ctx, c)).To(Succeed())
		for _, patch := range []string{`{"spec":{"maxHolders":4}}`, `{"spec":{"maxHolders":null}}`, `{"spec":{"maxHolders":1}}`} {
			err := k8s.Patch(ctx, getClaim(ns, "three"), client.RawPatch(types.MergePatchType, []byte(patch)))
			Expect(err).To(HaveOccurred(), patch)
			Expect(err.Error()).To(ContainSubstring("maxHolders is immutable"), patch)
		}
		err := k8s.Patch(ctx, getClaim(ns, "three"), client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/spec/maxHolders"}]`)))
		Expect(err).To(HaveOccurred(), "a JSON patch removing it")
		err = k8s.Patch(ctx, getClaim(ns, "mutex"), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"maxHolders":3}}`)))
		Expect(err).To(HaveOccurred(), "a mutex claim made a semaphore claim")
		Expect(*getClaim(ns, "three").Spec.MaxHolders).To(Equal(int32(3)))
		Expect(*getClaim(ns, "mutex").Spec.MaxHolders).To(Equal(int32(1)))
	})

	It("defaults the TTL to 15 seconds", func() {
		c := newClaim(ns, "ok", "report", "W1", 1)
		c.Spec.LeaseDurationSeconds = nil
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Expect(*getClaim(ns, "ok").Spec.LeaseDurationSeconds).To(Equal(int32(15)))
	})

	It("keeps lockName and holderIdentity immutable", func() {
		c := createClaim(ns, "imm", "report", "W1", 30)
		c.Spec.LockName = "other"
		err := k8s.Update(ctx, c)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("lockName is immutable"))
		c = getClaim(ns, "imm")
		c.Spec.HolderIdentity = "W2"
		err = k8s.Update(ctx, c)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("holderIdentity is immutable"))
	})

	It("keeps the TTL of a claim immutable, including a Held one, whatever the write", func() {
		m := startManager(0)
		DeferCleanup(m.Stop)
		createClaim(ns, "ttl", "report-ttl", "W1", 60)
		eventuallyPhase(ns, "ttl", fkv1.PhaseHeld)
		c := getClaim(ns, "ttl")
		c.Spec.LeaseDurationSeconds = ptr.To(int32(1))
		err := k8s.Update(ctx, c)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("leaseDurationSeconds is immutable"))
		err = k8s.Patch(ctx, getClaim(ns, "ttl"), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"leaseDurationSeconds":null}}`)))
		Expect(err).To(HaveOccurred(), "removing the field would default it to 15")
		Expect(*getClaim(ns, "ttl").Spec.LeaseDurationSeconds).To(Equal(int32(60)))
		Expect(getClaim(ns, "ttl").Status.Phase).To(Equal(fkv1.PhaseHeld))
	})
})

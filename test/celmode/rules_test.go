// Package celmode_test runs one table of fencing rules (docs/design.md §3)
// against both enforcement modes on a real apiserver: the webhook, and the
// CEL-mode admission policies (webhook/celmode) evaluated inside the
// apiserver. Where CEL mode differs, the case pins what it does and why;
// docs/fencing.md lists the same differences.
package celmode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
	"github.com/fencekeeper/fencekeeper/webhook"
	"github.com/fencekeeper/fencekeeper/webhook/celmode"
)

const lockName = "report-2026-07"

// scen is one case's world: a fresh namespace where W1 holds the lock with
// epoch e1 and (unless the case says otherwise) wrote ConfigMap "report".
type scen struct {
	b      *bed
	ns     string
	w1     *fkv1.FencedLease
	e1, e2 int64
	// eElsewhere is elsewhereLock's epoch in its own namespace.
	eElsewhere int64
	// stale is a copy of the object read before a setup changed it.
	stale *corev1.ConfigMap
}

// heldElsewhere has elsewhereLock held in another namespace and waits until
// admission refuses a token-less create of an object it fences in this one.
func (s *scen) heldElsewhere() {
	s.b.t.Helper()
	s.eElsewhere = s.b.hold(s.b.namespace(), elsewhereLock, "w-elsewhere").Status.Epoch
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r := reasonOf(s.b.admin.Create(ctx, configMap(s.ns, "probe", elsewhereLock, nil, "probe"), client.DryRunAll))
		return r == fkv1.AdmissionMissingEpoch || r == fkv1.AdmissionNoLease, nil
	})
	if err != nil {
		s.b.t.Fatalf("a token-less create fenced by %s in %s is still accepted", elsewhereLock, s.ns)
	}
}

func (s *scen) key() client.ObjectKey { return client.ObjectKey{Namespace: s.ns, Name: "report"} }

func (s *scen) get() *corev1.ConfigMap {
	var cm corev1.ConfigMap
	if err := s.b.admin.Get(context.Background(), s.key(), &cm); err != nil {
		s.b.t.Fatal(err)
	}
	return &cm
}

// update reads the object, applies mutate, presents epoch (0: none) and
// updates it as c.
func (s *scen) update(c client.Client, epoch int64, mutate func(*corev1.ConfigMap)) error {
	cm := s.get()
	if mutate != nil {
		mutate(cm)
	}
	if epoch != 0 {
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[fkv1.AnnotationEpoch] = fkv1.FormatEpoch(epoch)
	}
	return c.Update(context.Background(), cm)
}

func (s *scen) patch(c client.Client, pt types.PatchType, body string) error {
	return c.Patch(context.Background(), &corev1.ConfigMap{ObjectMeta: s.get().ObjectMeta}, client.RawPatch(pt, []byte(body)))
}

// apply server-side applies ConfigMap "report" as field manager owner,
// with its data and extra metadata JSON (a leading comma) after the labels.
func (s *scen) apply(owner, extraMeta, data string) error {
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"report","namespace":%q,"labels":{%q:%q}%s},"data":{"report":%q}}`,
		s.ns, fkv1.LabelLock, lockName, extraMeta, data)
	return s.b.admin.Patch(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "report"}},
		client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner(owner), client.ForceOwnership)
}

func (s *scen) must(err error) {
	s.b.t.Helper()
	if err != nil {
		s.b.t.Fatal(err)
	}
}

// handoff: W2 queues, W1 releases, W2 holds with e2.
func (s *scen) handoff() {
	s.b.t.Helper()
	s.b.release(s.w1)
	w2 := s.b.hold(s.ns, lockName, "w2")
	s.e2 = w2.Status.Epoch
	s.b.settleGone(s.ns, lockName, s.e1)
}

// unboundHandoff: "w-unbound", created as admin while the claim-identity
// policy is not in effect (so it records no identity), queues at the head,
// W2 (bound) queues behind it, and W1 releases. A claim that records no
// identity is never granted (docs/design.md §2, rev. 3): W2 holds with e2,
// and w-unbound stays Pending with a condition saying why, and a Warning
// Event. It waits until admission judges e2 the current epoch.
func (s *scen) unboundHandoff() {
	s.b.t.Helper()
	ctx := context.Background()
	w := &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "w-unbound"},
		Spec:       fkv1.FencedLeaseSpec{LockName: lockName, HolderIdentity: "w-unbound", LeaseDurationSeconds: ptr.To(int32(3600))},
	}
	if err := envtestutil.WithoutClaimIdentity(ctx, s.b.env.Admin, func() { s.must(s.b.admin.Create(ctx, w)) }); err != nil {
		s.b.t.Fatal(err)
	}
	for _, k := range []string{fkv1.AnnotationCreatedBy, fkv1.AnnotationCreatedByPodUID} {
		if v, ok := w.Annotations[k]; ok {
			s.b.t.Fatalf("the claim made without the claim-identity policy records %s=%q", k, v)
		}
	}
	// Behind it in FIFO order (a tie in creationTimestamp goes by name, and
	// "w-unbound" < "w2").
	w2 := &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "w2"},
		Spec:       fkv1.FencedLeaseSpec{LockName: lockName, HolderIdentity: "w2", LeaseDurationSeconds: ptr.To(int32(3600))},
	}
	s.must(s.b.admin.Create(ctx, w2))
	s.b.release(s.w1)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return s.b.admin.Get(ctx, client.ObjectKeyFromObject(w2), w2) == nil && w2.Status.Phase == fkv1.PhaseHeld, nil
	}); err != nil {
		s.b.t.Fatalf("claim w2, queued behind a claim that records no identity, never held (phase %q)", w2.Status.Phase)
	}
	s.e2 = w2.Status.Epoch
	s.b.settle(s.ns, lockName, s.e2)
	s.must(s.b.admin.Get(ctx, client.ObjectKeyFromObject(w), w))
	cond := apimeta.FindStatusCondition(w.Status.Conditions, fkv1.ConditionHeld)
	if w.Status.Phase != fkv1.PhasePending || w.Status.Epoch != 0 || cond == nil || cond.Reason != fkv1.ReasonNoIdentity ||
		!strings.Contains(cond.Message, "records no identity") {
		s.b.t.Fatalf("claim w-unbound: phase %q, epoch %d, condition %+v; want Pending, no epoch, Held=False %s saying it records no identity",
			w.Status.Phase, w.Status.Epoch, cond, fkv1.ReasonNoIdentity)
	}
	// A Warning Event on the claim says so; it was never granted.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := s.b.admin.List(ctx, &evs, client.InNamespace(s.ns)); err != nil {
			return false, nil //nolint:nilerr // an error would end the poll; a failed List is retried until the timeout
		}
		found := false
		for _, e := range evs.Items {
			if e.Regarding.Name != w.Name {
				continue
			}
			if e.Reason == fkv1.ReasonGranted {
				return false, fmt.Errorf("claim w-unbound has a %s Event: %s", e.Reason, e.Note)
			}
			found = found || (e.Reason == fkv1.ReasonNoIdentity && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "records no identity"))
		}
		return found, nil
	})
	if err != nil {
		s.b.t.Fatalf("no Warning Event on claim w-unbound says that it records no identity (or it was granted): %v", err)
	}
	s.b.settleGone(s.ns, lockName, s.e1)
}

func data(v string) func(*corev1.ConfigMap) {
	return func(cm *corev1.ConfigMap) { cm.Data = map[string]string{"report": v} }
}

func annotate(k, v string) func(*corev1.ConfigMap) {
	return func(cm *corev1.ConfigMap) {
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[k] = v
	}
}

// plantUnfenced creates "report" without the lock label, carrying one
// fencekeeper.io/ annotation (anyone may write an unfenced object).
func plantUnfenced(k, v string) func(s *scen) {
	return func(s *scen) {
		s.must(s.b.mallory.Create(context.Background(), configMap(s.ns, "report", "-", map[string]string{k: v}, "v1")))
	}
}

// plantOwned creates "report" without the lock label, owned by another
// object (deleting the owner would have the garbage collector delete it).
func plantOwned(s *scen) {
	ctx := context.Background()
	bait := configMap(s.ns, "bait", "-", nil, "")
	s.must(s.b.mallory.Create(ctx, bait))
	cm := configMap(s.ns, "report", "-", nil, "v1")
	cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "bait", UID: bait.UID}}
	s.must(s.b.mallory.Create(ctx, cm))
}

// moveField rewrites managedFields by hand: data field f moves from
// manager from's entry into manager to's.
func moveField(from, to, f string) func(*corev1.ConfigMap) {
	return func(cm *corev1.ConfigMap) {
		for i := range cm.ManagedFields {
			e := &cm.ManagedFields[i]
			var tree map[string]any
			if e.FieldsV1 == nil || json.Unmarshal(e.FieldsV1.GetRawBytes(), &tree) != nil {
				continue
			}
			d, _ := tree["f:data"].(map[string]any)
			switch e.Manager {
			case from:
				delete(d, f)
			case to:
				if d == nil {
					d = map[string]any{}
					tree["f:data"] = d
				}
				d[f] = map[string]any{}
			default:
				continue
			}
			raw, _ := json.Marshal(tree)
			e.FieldsV1.SetRawBytes(raw)
		}
	}
}

// fence adds the lock label, and new data.
func fence(cm *corev1.ConfigMap) {
	cm.Labels = map[string]string{fkv1.LabelLock: lockName}
	data("v2")(cm)
}

type ruleCase struct {
	name string
	// noObject: W1 does not write "report" first.
	noObject bool
	// setup runs before the write under test (writes here must succeed).
	setup func(s *scen)
	write func(s *scen) error
	// want is the reason of the denial, or "" for allowed.
	want fkv1.AdmissionReason
	// cel, when set, is what CEL mode does instead, pinned with why.
	cel *fkv1.AdmissionReason
	// celOr, when set, is a second refusal CEL mode may give instead of
	// want (two policies refuse; why says so).
	celOr fkv1.AdmissionReason
	why   string
	// watermark is the fenced-epoch an allowed write leaves (nil: unchecked).
	watermark func(s *scen) int64
}

var (
	allowed = fkv1.AdmissionReason("")
	noLease = fkv1.AdmissionNoLease
)

// elsewhereLock is held in a namespace of its own (heldElsewhere), so it
// has bindings but no Lease in the case's namespace.
const elsewhereLock = "held-elsewhere"

func cases() []ruleCase {
	e1 := func(s *scen) int64 { return s.e1 }
	e2 := func(s *scen) int64 { return s.e2 }
	return []ruleCase{
		{name: "create presenting the current epoch", noObject: true, watermark: e1,
			write: func(s *scen) error {
				return s.b.admin.Create(context.Background(), configMap(s.ns, "report", lockName, map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(s.e1)}, "v1"))
			}},
		{name: "create presenting no epoch", noObject: true, want: fkv1.AdmissionMissingEpoch,
			write: func(s *scen) error {
				return s.b.admin.Create(context.Background(), configMap(s.ns, "report", lockName, nil, "v1"))
			}},
		{name: "create with an empty lock label", noObject: true, want: fkv1.AdmissionEmptyLockLabel,
			write: func(s *scen) error {
				return s.b.admin.Create(context.Background(), configMap(s.ns, "report", "", map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(s.e1)}, "v1"))
			}},
		{name: "create fenced by a lock with no Lease in the namespace, presenting an epoch", noObject: true, want: fkv1.AdmissionFutureEpoch,
			write: func(s *scen) error {
				return s.b.admin.Create(context.Background(), configMap(s.ns, "report", "never-held", map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(s.e1)}, "v1"))
			}},
		{name: "create fenced by a lock held in another namespace but not here, presenting nothing", noObject: true, want: fkv1.AdmissionMissingEpoch,
			cel: &noLease, why: "the lock's lease-required binding finds no Lease to pass and refuses; the apiserver's own message carries no reason of ours",
			setup: func(s *scen) { s.heldElsewhere() },
			write: func(s *scen) error {
				return s.b.admin.Create(context.Background(), configMap(s.ns, "report", elsewhereLock, nil, "v1"))
			}},
		{name: "create fenced by a lock held in another namespace but not here, presenting its epoch there", noObject: true, want: fkv1.AdmissionFutureEpoch,
			celOr: noLease, why: "the lease-required binding refuses too, and the apiserver reports whichever refusal it met first (its order of policies is not fixed)",
			setup: func(s *scen) { s.heldElsewhere() },
			write: func(s *scen) error {
				return s.b.admin.Create(context.Background(), configMap(s.ns, "report", elsewhereLock, map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(s.eElsewhere)}, "v1"))
			}},
		{name: "create through server-side apply, fenced by a lock held in another namespace but not here, presenting nothing", noObject: true,
			want: fkv1.AdmissionMissingEpoch, cel: &noLease, why: "an apply that creates is a CREATE: the lease-required binding refuses it as it refuses a create",
			setup: func(s *scen) { s.heldElsewhere() },
			write: func(s *scen) error {
				body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"report","namespace":%q,"labels":{%q:%q}},"data":{"report":"v1"}}`,
					s.ns, fkv1.LabelLock, elsewhereLock)
				return s.b.admin.Patch(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "report"}},
					client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner("w1"), client.ForceOwnership)
			}},
		{name: "create fenced by a lock nobody has claimed, presenting nothing", noObject: true, want: fkv1.AdmissionMissingEpoch,
			cel: &allowed, why: "a lock name no claim or Lease names has no bindings at all, and the base policy cannot tell a missing token from a consumed one",
			write: func(s *scen) error {
				return s.b.admin.Create(context.Background(), configMap(s.ns, "report", "never-held", nil, "v1"))
			}},
		{name: "labelling an object with a lock that has no Lease here, planting opt-outs and a watermark, presenting nothing",
			noObject: true, want: fkv1.AdmissionMissingEpoch,
			cel: &allowed, why: "no Lease, so the per-lock policies do not run (an update cannot be refused for a missing Lease: the garbage collector and namespace deletion must reach such objects); what this write plants (fence-identity any, monotonic, a watermark) is trusted once the lock is first granted here",
			setup: func(s *scen) {
				s.must(s.b.admin.Create(context.Background(), configMap(s.ns, "report", "-", nil, "v1")))
			},
			write: func(s *scen) error {
				return s.update(s.b.mallory, 0, func(cm *corev1.ConfigMap) {
					cm.Labels = map[string]string{fkv1.LabelLock: "never-held"}
					annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)(cm)
					annotate(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)(cm)
					annotate(fkv1.AnnotationFencedEpoch, "1")(cm)
				})
			}},
		{name: "labelling an object that carried fence-identity any while unfenced, presenting the current epoch", noObject: true,
			want: fkv1.AdmissionInheritedFromUnfenced, setup: plantUnfenced(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny),
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, fence) }},
		{name: "labelling an object that carried fence-policy monotonic while unfenced, presenting the current epoch", noObject: true,
			want: fkv1.AdmissionInheritedFromUnfenced, setup: plantUnfenced(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic),
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, fence) }},
		{name: "labelling an object that carried a deletion mark for the current epoch while unfenced", noObject: true,
			want:  fkv1.AdmissionInheritedFromUnfenced,
			setup: func(s *scen) { plantUnfenced(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1))(s) },
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, fence) }},
		{name: "labelling an object that carried a deletion mark of another epoch while unfenced: the mark is dropped", noObject: true, watermark: e1,
			setup: func(s *scen) { plantUnfenced(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1+1000))(s) },
			write: func(s *scen) error {
				if err := s.update(s.b.admin, s.e1, fence); err != nil {
					return err
				}
				if m, ok := s.get().Annotations[fkv1.AnnotationDeleteEpoch]; ok {
					return fmt.Errorf("the inherited mark %s of another epoch was kept", m)
				}
				return nil
			}},
		{name: "labelling an object that was given an owner while unfenced (deleting the owner would have the garbage collector delete it)",
			noObject: true, want: fkv1.AdmissionInheritedFromUnfenced,
			setup: plantOwned,
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, fence) }},
		{name: "labelling an object whose deletion was requested while unfenced (removing its finalizer would complete it)",
			noObject: true, want: fkv1.AdmissionInheritedFromUnfenced,
			setup: func(s *scen) {
				ctx := context.Background()
				cm := configMap(s.ns, "report", "-", nil, "v1")
				cm.Finalizers = []string{"example.com/hold"}
				s.must(s.b.mallory.Create(ctx, cm))
				s.must(s.b.mallory.Delete(ctx, cm))
			},
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, fence) }},
		{name: "labelling an object and removing the opt-out it carried unfenced, in one write", noObject: true, watermark: e1,
			setup: plantUnfenced(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny),
			write: func(s *scen) error {
				return s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					fence(cm)
					delete(cm.Annotations, fkv1.AnnotationFenceIdentity)
				})
			}},
		{name: "another identity labels an object that carried fence-identity any while unfenced, removing it", noObject: true,
			want: fkv1.AdmissionIdentityMismatch, setup: plantUnfenced(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny),
			write: func(s *scen) error {
				return s.update(s.b.mallory, s.e1, func(cm *corev1.ConfigMap) {
					fence(cm)
					delete(cm.Annotations, fkv1.AnnotationFenceIdentity)
				})
			}},
		{name: "labelling an object that carried fence-identity any while unfenced, by merge patch", noObject: true,
			want: fkv1.AdmissionInheritedFromUnfenced, setup: plantUnfenced(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny),
			write: func(s *scen) error {
				return s.patch(s.b.admin, types.MergePatchType, fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}},"data":{"report":"v2"}}`,
					fkv1.LabelLock, lockName, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1)))
			}},
		{name: "labelling an object that carried fence-policy monotonic while unfenced, by strategic merge patch", noObject: true,
			want: fkv1.AdmissionInheritedFromUnfenced, setup: plantUnfenced(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic),
			write: func(s *scen) error {
				return s.patch(s.b.admin, types.StrategicMergePatchType, fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}},"data":{"report":"v2"}}`,
					fkv1.LabelLock, lockName, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1)))
			}},
		{name: "labelling an object that carried fence-identity any while unfenced, by JSON patch", noObject: true,
			want: fkv1.AdmissionInheritedFromUnfenced, setup: plantUnfenced(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny),
			write: func(s *scen) error {
				return s.patch(s.b.admin, types.JSONPatchType, fmt.Sprintf(`[{"op":"add","path":"/metadata/labels","value":{%q:%q}},`+
					`{"op":"add","path":"/metadata/annotations/%s","value":%q}]`,
					fkv1.LabelLock, lockName, strings.ReplaceAll(fkv1.AnnotationEpoch, "/", "~1"), fkv1.FormatEpoch(s.e1)))
			}},
		{name: "labelling an object that carried fence-identity any while unfenced, by server-side apply", noObject: true,
			want: fkv1.AdmissionInheritedFromUnfenced, setup: plantUnfenced(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny),
			write: func(s *scen) error {
				return s.apply("w1", fmt.Sprintf(`,"annotations":{%q:%q}`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1)), "v2")
			}},
		{name: "labelling an object that was given an owner while unfenced, by client.MergeFrom", noObject: true,
			want:  fkv1.AdmissionInheritedFromUnfenced,
			setup: plantOwned,
			write: func(s *scen) error {
				cm := s.get()
				base := cm.DeepCopy()
				fence(cm)
				annotate(fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1))(cm)
				return s.b.admin.Patch(context.Background(), cm, client.MergeFrom(base))
			}},
		{name: "labelling a clean unfenced object by server-side apply (the refusals above are for what it inherited)", noObject: true, watermark: e1,
			setup: func(s *scen) {
				s.must(s.b.mallory.Create(context.Background(), configMap(s.ns, "report", "-", nil, "v1")))
			},
			write: func(s *scen) error {
				return s.apply("w1", fmt.Sprintf(`,"annotations":{%q:%q}`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1)), "v2")
			}},
		{name: "update presenting the current epoch", watermark: e1,
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("v2")) }},
		{name: "a second update presenting the same epoch", watermark: e1,
			setup: func(s *scen) { s.must(s.update(s.b.admin, s.e1, data("v2"))) },
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("v3")) }},
		{name: "merge patch presenting no epoch", want: fkv1.AdmissionMissingEpoch,
			write: func(s *scen) error { return s.patch(s.b.admin, types.MergePatchType, `{"data":{"report":"v2"}}`) }},
		{name: "JSON patch presenting the current epoch", watermark: e1,
			write: func(s *scen) error {
				return s.patch(s.b.admin, types.JSONPatchType, fmt.Sprintf(`[{"op":"replace","path":"/data/report","value":"v2"},`+
					`{"op":"add","path":"/metadata/annotations/fencekeeper.io~1epoch","value":"%d"}]`, s.e1))
			}},
		{name: "strategic merge patch presenting a malformed epoch", want: fkv1.AdmissionMalformedEpoch,
			write: func(s *scen) error {
				return s.patch(s.b.admin, types.StrategicMergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"fencekeeper.io/epoch":"0%d"}},"data":{"report":"v2"}}`, s.e1))
			}},
		{name: "server-side apply presenting the current epoch", watermark: e1,
			write: func(s *scen) error {
				return s.apply("w1", fmt.Sprintf(`,"annotations":{"fencekeeper.io/epoch":"%d"}`, s.e1), "v2")
			}},
		{name: "server-side apply presenting no epoch", want: fkv1.AdmissionMissingEpoch,
			write: func(s *scen) error { return s.apply("w1", "", "v2") }},
		{name: "server-side apply by W1 after W2 took over", want: fkv1.AdmissionNotCurrentEpoch,
			setup: func(s *scen) { s.handoff() },
			write: func(s *scen) error {
				return s.apply("w1", fmt.Sprintf(`,"annotations":{"fencekeeper.io/epoch":"%d"}`, s.e1), "late")
			}},
		{name: "server-side apply whose configuration leaves out the watermark: it stays", watermark: e1,
			setup: func(s *scen) {
				s.must(s.apply("w1", fmt.Sprintf(`,"annotations":{"fencekeeper.io/epoch":"%d"}`, s.e1), "v2"))
			},
			write: func(s *scen) error { return s.apply("w1", "", "v2") }},
		{name: "W1's client.MergeFrom patch from a copy read before W2 wrote", want: fkv1.AdmissionStaleEpoch,
			setup: func(s *scen) {
				s.stale = s.get()
				s.handoff()
				s.must(s.update(s.b.admin, s.e2, data("w2's")))
			},
			write: func(s *scen) error {
				mine := s.stale.DeepCopy()
				mine.Annotations[fkv1.AnnotationEpoch] = fkv1.FormatEpoch(s.e1)
				mine.Data = map[string]string{"report": "w1's late"}
				return s.b.admin.Patch(context.Background(), mine, client.MergeFrom(s.stale))
			}},
		{name: "update presenting an epoch never issued", want: fkv1.AdmissionFutureEpoch,
			write: func(s *scen) error { return s.update(s.b.admin, s.e1+1000, data("v2")) }},
		{name: "writer sets fenced-epoch itself, presenting no epoch", want: fkv1.AdmissionMissingEpoch,
			write: func(s *scen) error {
				return s.update(s.b.admin, 0, annotate(fkv1.AnnotationFencedEpoch, "9000000000000000000"))
			}},
		{name: "writer sets fenced-epoch itself while presenting the current epoch: the presented one is stored", watermark: e1,
			write: func(s *scen) error {
				return s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					annotate(fkv1.AnnotationFencedEpoch, "9000000000000000000")(cm)
					data("v2")(cm)
				})
			}},
		{name: "renaming an owner in place, same UID (the garbage collector would find none and delete the object), presenting nothing",
			want: fkv1.AdmissionMissingEpoch,
			setup: func(s *scen) {
				bait := configMap(s.ns, "bait", "-", nil, "")
				s.must(s.b.admin.Create(context.Background(), bait))
				s.must(s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "bait", UID: bait.UID}}
				}))
			},
			write: func(s *scen) error {
				return s.update(s.b.mallory, 0, func(cm *corev1.ConfigMap) { cm.OwnerReferences[0].Name = "elsewhere" })
			}},
		{name: "another identity rewrites kubectl's last-applied-configuration (what the holder's next kubectl apply prunes by), presenting nothing",
			want: fkv1.AdmissionMissingEpoch,
			write: func(s *scen) error {
				return s.update(s.b.mallory, 0, annotate("kubectl.kubernetes.io/last-applied-configuration", `{"apiVersion":"v1","kind":"ConfigMap","data":{"report":"v1","x":"1"}}`))
			}},
		{name: "another identity moves a data field into the holder's apply entry of managedFields, presenting nothing", want: fkv1.AdmissionMissingEpoch,
			setup: func(s *scen) {
				s.must(s.apply("w1", fmt.Sprintf(`,"annotations":{%q:%q}`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1)), "v2"))
				s.must(s.b.admin.Patch(context.Background(), s.get(), client.RawPatch(types.MergePatchType,
					[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"data":{"x":"kept"}}`, fkv1.AnnotationEpoch, s.e1))), client.FieldOwner("other")))
			},
			write: func(s *scen) error { return s.update(s.b.mallory, 0, moveField("other", "w1", "f:x")) }},
		{name: "another identity co-owns fence-policy by server-side apply of the same value (the holder's apply that drops it would not remove it), presenting nothing",
			want: fkv1.AdmissionMissingEpoch,
			setup: func(s *scen) {
				s.must(s.apply("w1", fmt.Sprintf(`,"annotations":{%q:%q,%q:%q}`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1), fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic), "v2"))
			},
			write: func(s *scen) error {
				body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"report","namespace":%q,"annotations":{%q:%q}}}`, s.ns, fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)
				return s.b.mallory.Patch(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "report"}},
					client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner("mallory"))
			}},
		{name: "metadata-only: a label by another field manager on an object with applied fields (the apiserver's bookkeeping), no epoch", watermark: e1,
			setup: func(s *scen) {
				s.must(s.apply("w1", fmt.Sprintf(`,"annotations":{%q:%q}`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1)), "v2"))
			},
			write: func(s *scen) error {
				return s.b.mallory.Patch(context.Background(), s.get(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"reports"}}}`)),
					client.FieldOwner("kubectl-label"))
			}},
		{name: "monotonic object: W1 adds an owner after W2 took over (the garbage collector would delete the object with it)", want: fkv1.AdmissionNotCurrentEpoch,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					annotate(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)(cm)
					annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)(cm)
				}))
				s.must(s.b.admin.Create(context.Background(), configMap(s.ns, "bait", "-", nil, "")))
				s.handoff()
			},
			write: func(s *scen) error {
				var bait corev1.ConfigMap
				s.must(s.b.admin.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: "bait"}, &bait))
				return s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "bait", UID: bait.UID}}
				})
			}},
		{name: "monotonic object: a delete marked by W1 after W2 took over (W2 has not written)", want: fkv1.AdmissionNotCurrentEpoch,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					annotate(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)(cm)
					annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)(cm)
					annotate(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1))(cm)
				}))
				s.handoff()
			},
			write: func(s *scen) error { return s.b.admin.Delete(context.Background(), s.get()) }},
		{name: "metadata-only: an unrelated label, no epoch", watermark: e1,
			write: func(s *scen) error {
				return s.update(s.b.admin, 0, func(cm *corev1.ConfigMap) { cm.Labels["team"] = "reports" })
			}},
		{name: "metadata-only: a finalizer, no epoch", watermark: e1,
			write: func(s *scen) error {
				return s.update(s.b.admin, 0, func(cm *corev1.ConfigMap) { cm.Finalizers = append(cm.Finalizers, "example.com/keep") })
			}},
		{name: "lock label removed", want: fkv1.AdmissionLockLabelImmutable,
			write: func(s *scen) error {
				return s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) { delete(cm.Labels, fkv1.LabelLock) })
			}},
		{name: "lock label changed", want: fkv1.AdmissionLockLabelImmutable,
			write: func(s *scen) error {
				return s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) { cm.Labels[fkv1.LabelLock] = "other" })
			}},
		{name: "invalid fence-policy", want: fkv1.AdmissionInvalidPolicy,
			write: func(s *scen) error {
				return s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationFencePolicy, "whenever"))
			}},
		{name: "W1 after W2 took over and wrote: below the watermark", want: fkv1.AdmissionStaleEpoch,
			setup: func(s *scen) { s.handoff(); s.must(s.update(s.b.admin, s.e2, data("W2"))) },
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("W1 late")) }},
		{name: "W1 after W2 took over, object untouched by W2: not current", want: fkv1.AdmissionNotCurrentEpoch,
			setup: func(s *scen) { s.handoff() },
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("W1 late")) }},
		{name: "W1 after W2 took over, object untouched by W2 and open to any identity: not current", want: fkv1.AdmissionNotCurrentEpoch,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)))
				s.handoff()
			},
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("W1 late")) }},
		{name: "monotonic object open to any identity: W1 after W2 wrote is below the watermark", want: fkv1.AdmissionStaleEpoch,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					annotate(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)(cm)
					annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)(cm)
				}))
				s.handoff()
				s.must(s.update(s.b.admin, s.e2, data("W2")))
			},
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("W1 late")) }},
		{name: "W2 after taking over", watermark: e2,
			setup: func(s *scen) { s.handoff() },
			write: func(s *scen) error { return s.update(s.b.admin, s.e2, data("W2")) }},
		{name: "monotonic object: W1's old epoch at the watermark, identity opted out", watermark: e1,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, func(cm *corev1.ConfigMap) {
					annotate(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)(cm)
					annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)(cm)
				}))
				s.handoff()
			},
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("W1 late but allowed")) }},
		{name: "monotonic object: W1's old epoch, identity not opted out (its claim is gone)", want: fkv1.AdmissionIdentityMismatch,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationFencePolicy, fkv1.FencePolicyMonotonic)))
				s.handoff()
			},
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, data("W1 late")) }},
		{name: "another identity presents the holder's epoch", want: fkv1.AdmissionIdentityMismatch,
			write: func(s *scen) error { return s.update(s.b.mallory, s.e1, data("mallory")) }},
		// A claim that records no identity (made while the claim-identity
		// policy was not in effect) is never granted (rev. 3): the lock goes
		// to the bound waiter behind it.
		{name: "a claim that records no identity is never granted: the waiter behind it holds the next epoch and writes with it", watermark: e2,
			setup: func(s *scen) { s.unboundHandoff() },
			write: func(s *scen) error { return s.update(s.b.admin, s.e2, data("W2 past the unbound claim")) }},
		{name: "a claim that records no identity is never granted: another identity presenting the next epoch is refused",
			want: fkv1.AdmissionIdentityMismatch, setup: func(s *scen) { s.unboundHandoff() },
			write: func(s *scen) error { return s.update(s.b.mallory, s.e2, data("mallory")) }},
		{name: "a claim that records no identity is never granted: on an object open to any identity, another identity presents the next epoch", watermark: e2,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)))
				s.unboundHandoff()
			},
			write: func(s *scen) error { return s.update(s.b.mallory, s.e2, data("helper")) }},
		{name: "another identity presents the holder's epoch on an object that opted out", watermark: e1,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)))
			},
			write: func(s *scen) error { return s.update(s.b.mallory, s.e1, data("helper")) }},
		{name: "a stale token equal to the watermark on a write that changes nothing else", want: fkv1.AdmissionNotCurrentEpoch,
			cel: &allowed, why: "the mutating policy consumes the token before validation sees the object, which is then unchanged: nothing is written but a new resourceVersion",
			setup: func(s *scen) { s.handoff() },
			write: func(s *scen) error { return s.update(s.b.admin, s.e1, nil) }},
		{name: "delete without a mark", want: fkv1.AdmissionDeleteNotMarked,
			write: func(s *scen) error { return s.b.admin.Delete(context.Background(), s.get()) }},
		{name: "delete after the current holder marked it",
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1))))
			},
			write: func(s *scen) error { return s.b.admin.Delete(context.Background(), s.get()) }},
		{name: "a mark that is not the presented epoch", want: fkv1.AdmissionInvalidDeleteMark,
			write: func(s *scen) error {
				return s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1+1)))
			}},
		{name: "delete marked by W1 after W2 took over", want: fkv1.AdmissionNotCurrentEpoch,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1))))
				s.handoff()
			},
			write: func(s *scen) error { return s.b.admin.Delete(context.Background(), s.get()) }},
		{name: "delete marked by W1 after W2 wrote: W2's write dropped the mark", want: fkv1.AdmissionDeleteNotMarked,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1))))
				s.handoff()
				s.must(s.update(s.b.admin, s.e2, data("W2")))
			},
			write: func(s *scen) error { return s.b.admin.Delete(context.Background(), s.get()) }},
		{name: "delete collection of fenced objects without a mark (admitted item by item)", want: fkv1.AdmissionDeleteNotMarked,
			write: func(s *scen) error {
				return s.b.admin.DeleteAllOf(context.Background(), &corev1.ConfigMap{}, client.InNamespace(s.ns), client.MatchingLabels{fkv1.LabelLock: lockName})
			}},
		{name: "delete collection after the current holder marked the object",
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1))))
			},
			write: func(s *scen) error {
				return s.b.admin.DeleteAllOf(context.Background(), &corev1.ConfigMap{}, client.InNamespace(s.ns), client.MatchingLabels{fkv1.LabelLock: lockName})
			}},
		{name: "the garbage collector deletes without a mark",
			write: func(s *scen) error { return s.b.gc.Delete(context.Background(), s.get()) }},
		{name: "another identity deletes after the holder marked it", want: fkv1.AdmissionIdentityMismatch,
			setup: func(s *scen) {
				s.must(s.update(s.b.admin, s.e1, annotate(fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(s.e1))))
			},
			write: func(s *scen) error { return s.b.mallory.Delete(context.Background(), s.get()) }},
	}
}

func TestCELMode(t *testing.T) {
	for _, mode := range []string{modeWebhook, modeCEL} {
		t.Run(mode, func(t *testing.T) {
			b := startBed(t, mode)
			for _, tc := range cases() {
				t.Run(tc.name, func(t *testing.T) { runCase(t, b, tc) })
			}
			t.Run("current after a handoff", func(t *testing.T) { currentAfterHandoff(t, b) })
			t.Run("scale subresource", func(t *testing.T) { scaleFenced(t, b) })
			t.Run("the holder's apply prunes only what the holder applied", func(t *testing.T) { applyInputs(t, b) })
			t.Run("an apply to /scale that keeps the count takes ownership of the replicas", func(t *testing.T) { scaleOwnership(t, b) })
			t.Run("status subresource", func(t *testing.T) { statusWrites(t, b) })
			t.Run("a write through another version of the kind", func(t *testing.T) { otherVersions(t, b) })
			if mode == modeWebhook {
				t.Run("CEL-mode policies left behind by a switch to webhook mode", func(t *testing.T) { celLeftovers(t, b) })
			}
			if mode == modeCEL {
				t.Run("a deleted policy is put back", func(t *testing.T) { policiesPutBack(t, b) })
			}
		})
	}
}

func runCase(t *testing.T, b *bed, tc ruleCase) {
	b.t = t
	ctx := context.Background()
	s := &scen{b: b, ns: b.namespace()}
	s.w1 = b.hold(s.ns, lockName, "w1")
	s.e1 = s.w1.Status.Epoch
	if !tc.noObject {
		s.must(b.admin.Create(ctx, configMap(s.ns, "report", lockName, map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(s.e1)}, "v1")))
	}
	if tc.setup != nil {
		tc.setup(s)
	}
	var before corev1.ConfigMap
	existed := b.admin.Get(ctx, s.key(), &before) == nil

	err := tc.write(s)

	want := tc.want
	if b.mode == modeCEL && tc.cel != nil {
		want = *tc.cel
		t.Logf("CEL mode differs here (pinned): %s", tc.why)
	}
	got := reasonOf(err)
	if b.mode == modeCEL && tc.celOr != "" && got == tc.celOr {
		t.Logf("CEL mode may differ here (pinned): %s", tc.why)
		got = want
	}
	if got != want {
		t.Fatalf("got %q (%v), want %q", got, err, want)
	}
	var after corev1.ConfigMap
	exists := b.admin.Get(ctx, s.key(), &after) == nil
	if want != "" {
		// A denied write changed nothing.
		if exists != existed || (exists && after.ResourceVersion != before.ResourceVersion) {
			t.Fatalf("a denied write changed the object: existed %v now %v, resourceVersion %s -> %s", existed, exists, before.ResourceVersion, after.ResourceVersion)
		}
		return
	}
	if !exists {
		return // an allowed delete
	}
	if tok, ok := after.Annotations[fkv1.AnnotationEpoch]; ok {
		t.Fatalf("the stored object kept the token %s (admission consumes it)", tok)
	}
	if tc.watermark != nil {
		if got, want := after.Annotations[fkv1.AnnotationFencedEpoch], fkv1.FormatEpoch(tc.watermark(s)); got != want {
			t.Fatalf("stored fenced-epoch %q, want %q", got, want)
		}
	}
}

// currentAfterHandoff measures how the current-holder rule (rule 4) holds
// right after a handoff: the old holder watches the Lease and, as soon as
// the grant is written, writes with its epoch to an object the new holder
// has not touched. The webhook checks against a Lease view the authority vouches
// for (or reads it live), so it refuses every time. CEL mode reads the Lease
// from the apiserver's own cache, which trails the grant by a watch
// delivery: there the write may pass, and the count is reported (pinned as
// a difference, docs/fencing.md). In both modes the watermark rule still
// holds: once the new holder wrote, the old epoch is refused, every round.
func currentAfterHandoff(t *testing.T, b *bed) {
	b.t = t
	ctx := context.Background()
	ns := b.namespace()
	const rounds = 20
	holder := b.hold(ns, lockName, "h0")
	accepted := 0
	for i := 1; i <= rounds; i++ {
		old := holder
		s := &scen{b: b, ns: ns}
		if i == 1 {
			s.must(b.admin.Create(ctx, configMap(ns, "report", lockName, map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(old.Status.Epoch)}, "h0")))
		}
		next := &fkv1.FencedLease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("h%d", i)},
			Spec:       fkv1.FencedLeaseSpec{LockName: lockName, HolderIdentity: fmt.Sprintf("h%d", i), LeaseDurationSeconds: ptr.To(int32(3600))},
		}
		s.must(b.admin.Create(ctx, next))
		// Watch the Lease: the old holder writes the moment the grant is
		// written, before the new holder even learns of it.
		cm := s.get()
		w, err := b.watcher.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(ns),
			client.MatchingFields{"metadata.name": lockName})
		s.must(err)
		b.release(old)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if ok && l.Annotations[fkv1.AnnotationEpoch] != fkv1.FormatEpoch(old.Status.Epoch) && l.Annotations[fkv1.AnnotationClaimUID] != "" {
				break
			}
		}
		w.Stop()
		cm.Annotations[fkv1.AnnotationEpoch] = fkv1.FormatEpoch(old.Status.Epoch)
		cm.Data = map[string]string{"report": fmt.Sprintf("late write of epoch %d", old.Status.Epoch)}
		err = b.admin.Update(ctx, cm)
		s.must(wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return next.Status.Phase == fkv1.PhaseHeld, b.admin.Get(ctx, client.ObjectKeyFromObject(next), next)
		}))
		switch reasonOf(err) {
		case "":
			accepted++
		case fkv1.AdmissionNotCurrentEpoch:
		default:
			t.Fatalf("round %d: the old holder's write got %v", i, err)
		}
		// The new holder writes (once admission knows its epoch), and from
		// then on the old epoch is below the watermark.
		b.settle(ns, lockName, next.Status.Epoch)
		s.must(s.update(b.admin, next.Status.Epoch, data(fmt.Sprintf("epoch %d", next.Status.Epoch))))
		if got := reasonOf(s.update(b.admin, old.Status.Epoch, data("later write"))); got != fkv1.AdmissionStaleEpoch {
			t.Fatalf("round %d: the old holder's write after the new holder wrote got %q, want StaleEpoch", i, got)
		}
		if got := s.get().Data["report"]; got != fmt.Sprintf("epoch %d", next.Status.Epoch) {
			t.Fatalf("round %d: the object holds %q after the new holder's write", i, got)
		}
		holder = next
	}
	t.Logf("%s mode: %d of %d late writes of the old holder passed, each sent the moment a watch of the Lease showed the new grant", b.mode, accepted, rounds)
	if b.mode == modeWebhook && accepted > 0 {
		t.Fatalf("the webhook let %d late writes of an old holder through", accepted)
	}
}

// held starts a subtest in a fresh namespace where W1 holds the lock.
func (b *bed) held(t *testing.T) (*scen, *fkv1.FencedLease) {
	b.t = t
	s := &scen{b: b, ns: b.namespace()}
	return s, b.hold(s.ns, lockName, "w1")
}

// scaleFenced checks rule 7 in both modes: a write to the scale subresource
// of a guarded kind presents its epoch on the Scale and is fenced like a
// write of the object. A Scale carries no labels for a policy binding to
// select, so CEL mode keeps the scale webhook; without it these writes
// would all pass. A scale cannot move the watermark, so it is accepted only
// from the current holder over its own watermark, under every policy: the
// object here is monotonic and marked for deletion by W1, and after W2's
// scale W1 must still be unable to scale, write or delete it.
func scaleFenced(t *testing.T, b *bed) {
	ctx := context.Background()
	s, w1 := b.held(t)
	ns := s.ns
	key := client.ObjectKey{Namespace: ns, Name: "scaled"}
	report := func() *unstructured.Unstructured { return envtestutil.Report(ns, key.Name) }
	r := report()
	r.SetLabels(map[string]string{fkv1.LabelLock: lockName})
	r.SetAnnotations(map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(w1.Status.Epoch),
		fkv1.AnnotationFencePolicy: fkv1.FencePolicyMonotonic, fkv1.AnnotationDeleteEpoch: fkv1.FormatEpoch(w1.Status.Epoch)})
	r.Object["spec"] = map[string]any{"body": "v1", "replicas": int64(1)}
	s.must(b.admin.Create(ctx, r))
	// write updates the object as read, presenting epoch.
	write := func(epoch int64, mutate func(*unstructured.Unstructured)) error {
		got := report()
		s.must(b.admin.Get(ctx, key, got))
		mutate(got)
		a := got.GetAnnotations()
		a[fkv1.AnnotationEpoch] = fkv1.FormatEpoch(epoch)
		got.SetAnnotations(a)
		return b.admin.Update(ctx, got)
	}
	replicas := func() int64 {
		got := report()
		s.must(b.admin.Get(ctx, key, got))
		n, _, _ := unstructured.NestedInt64(got.Object, "spec", "replicas")
		return n
	}
	scale := func(epoch int64, n int) error {
		ann := ""
		if epoch != 0 {
			ann = fmt.Sprintf(`"metadata":{"annotations":{%q:%q}},`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(epoch))
		}
		body := fmt.Sprintf(`{%s"spec":{"replicas":%d}}`, ann, n)
		return b.admin.SubResource("scale").Patch(ctx, report(), client.RawPatch(types.MergePatchType, []byte(body)))
	}
	expect := func(step string, err error, want fkv1.AdmissionReason, wantReplicas int64) {
		t.Helper()
		if got := reasonOf(err); got != want {
			t.Fatalf("%s: got %q (%v), want %q", step, got, err, want)
		}
		if got := replicas(); got != wantReplicas {
			t.Fatalf("%s: the object has %d replicas, want %d", step, got, wantReplicas)
		}
	}
	expect("a scale presenting no epoch", scale(0, 5), fkv1.AdmissionMissingEpoch, 1)
	expect("the holder scales presenting its epoch", scale(w1.Status.Epoch, 2), "", 2)
	b.release(w1)
	w2 := b.hold(ns, lockName, "w2")
	b.settleGone(ns, lockName, w1.Status.Epoch)
	expect("the old holder scales after the handoff (monotonic object)", scale(w1.Status.Epoch, 7), fkv1.AdmissionNotCurrentEpoch, 2)
	expect("the new holder scales before writing the object (watermark still the old epoch)", scale(w2.Status.Epoch, 3), fkv1.AdmissionScaleBeforeFencedWrite, 2)
	expect("the old holder deletes by its mark (monotonic object)", b.admin.Delete(ctx, report()), fkv1.AdmissionNotCurrentEpoch, 2)
	s.must(write(w2.Status.Epoch, func(u *unstructured.Unstructured) { u.Object["spec"].(map[string]any)["body"] = "v2" }))
	expect("the new holder scales after one fenced write", scale(w2.Status.Epoch, 3), "", 3)
	expect("the old holder writes the replicas (monotonic object)", write(w1.Status.Epoch, func(u *unstructured.Unstructured) {
		u.Object["spec"].(map[string]any)["replicas"] = int64(1)
	}), fkv1.AdmissionStaleEpoch, 3)
	expect("the old holder scales again (below the watermark now)", scale(w1.Status.Epoch, 1), fkv1.AdmissionStaleEpoch, 3)
	expect("the old holder deletes again", b.admin.Delete(ctx, report()), fkv1.AdmissionDeleteNotMarked, 3)

	// The other ways a scale arrives: a JSON patch, and a PUT of the Scale
	// read back (what kubectl scale and the autoscalers send).
	jsonScale := func(epoch int64, n int) error {
		ops := fmt.Sprintf(`{"op":"replace","path":"/spec/replicas","value":%d}`, n)
		if epoch != 0 {
			ops = fmt.Sprintf(`{"op":"add","path":"/metadata/annotations","value":{%q:%q}},`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(epoch)) + ops
		}
		return b.admin.SubResource("scale").Patch(ctx, report(), client.RawPatch(types.JSONPatchType, []byte("["+ops+"]")))
	}
	putScale := func(epoch int64, n int64) error {
		sc := &unstructured.Unstructured{}
		sc.SetGroupVersionKind(autoscalingv1.SchemeGroupVersion.WithKind("Scale"))
		s.must(b.admin.SubResource("scale").Get(ctx, report(), sc))
		s.must(unstructured.SetNestedField(sc.Object, n, "spec", "replicas"))
		if epoch != 0 {
			sc.SetAnnotations(map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(epoch)})
		}
		return b.admin.SubResource("scale").Update(ctx, report(), client.WithSubResourceBody(sc))
	}
	expect("a JSON-patch scale presenting no epoch", jsonScale(0, 8), fkv1.AdmissionMissingEpoch, 3)
	expect("the old holder's JSON-patch scale", jsonScale(w1.Status.Epoch, 8), fkv1.AdmissionStaleEpoch, 3)
	expect("the holder's JSON-patch scale", jsonScale(w2.Status.Epoch, 4), "", 4)
	expect("a scale PUT presenting no epoch", putScale(0, 9), fkv1.AdmissionMissingEpoch, 4)
	expect("the old holder's scale PUT", putScale(w1.Status.Epoch, 9), fkv1.AdmissionStaleEpoch, 4)
	expect("the holder's scale PUT", putScale(w2.Status.Epoch, 5), "", 5)
}

// applyInputs: managedFields decide what a server-side apply prunes (a
// field its manager applied before and applies no longer, owned by nobody
// else). The holder applies data.a; another manager wrote data.x. Another
// identity, presenting nothing, moves data.x into the holder's apply entry;
// were that accepted, the holder's next apply of {a} would delete data.x
// under the holder's own, current epoch. The rewrite is refused in both
// modes, and data.x survives the holder's apply.
func applyInputs(t *testing.T, b *bed) {
	ctx := context.Background()
	s, w1 := b.held(t)
	s.w1, s.e1 = w1, w1.Status.Epoch
	stamp := fmt.Sprintf(`,"annotations":{%q:%q}`, fkv1.AnnotationEpoch, fkv1.FormatEpoch(s.e1))
	s.must(s.apply("w1", stamp, "v1"))
	s.must(b.admin.Patch(ctx, s.get(), client.RawPatch(types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"data":{"x":"kept"}}`, fkv1.AnnotationEpoch, s.e1))), client.FieldOwner("other")))
	if got := reasonOf(s.update(b.mallory, 0, moveField("other", "w1", "f:x"))); got != fkv1.AdmissionMissingEpoch {
		t.Errorf("moving data.x into the holder's apply entry, presenting nothing: got %q, want %q", got, fkv1.AdmissionMissingEpoch)
	}
	if got := reasonOf(s.update(b.mallory, 0, annotate("kubectl.kubernetes.io/last-applied-configuration", `{"data":{"x":"kept"}}`))); got != fkv1.AdmissionMissingEpoch {
		t.Errorf("rewriting last-applied-configuration, presenting nothing: got %q, want %q", got, fkv1.AdmissionMissingEpoch)
	}
	s.must(s.apply("w1", stamp, "v2"))
	if got := s.get().Data; got["x"] != "kept" || got["report"] != "v2" {
		t.Fatalf("after the holder's apply the object holds %v: a field the holder never applied was pruned", got)
	}
}

// scaleOwnership: another identity's server-side apply to a Deployment's
// /scale that repeats the current count changes no replicas, but it makes
// that manager an owner of the Deployment's spec.replicas, so the holder's
// next apply conflicts on it (or, dropping replicas, no longer resets it).
// Presenting nothing, it is refused in both modes (the scale webhook) and
// the Deployment's managedFields stay as they were.
func scaleOwnership(t *testing.T, b *bed) {
	ctx := context.Background()
	s, w1 := b.held(t)
	labels := map[string]string{"app": "scaled"}
	body := fmt.Sprintf(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"scaled","namespace":%q,"labels":{%q:%q},"annotations":{%q:%q}},`+
		`"spec":{"replicas":3,"selector":{"matchLabels":{"app":"scaled"}},"template":{"metadata":{"labels":{"app":"scaled"}},"spec":{"containers":[{"name":"c","image":"report:1"}]}}}}`,
		s.ns, fkv1.LabelLock, lockName, fkv1.AnnotationEpoch, fkv1.FormatEpoch(w1.Status.Epoch))
	ref := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "scaled", Labels: labels}}
	s.must(b.admin.Patch(ctx, ref, client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner("w1")))
	managed := func() string {
		var d appsv1.Deployment
		s.must(b.admin.Get(ctx, client.ObjectKeyFromObject(ref), &d))
		var out []string
		for _, e := range d.ManagedFields {
			out = append(out, e.Manager+"/"+string(e.Operation)+"/"+e.Subresource)
		}
		return strings.Join(out, ",")
	}
	before := managed()
	scale := `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"scaled","namespace":"` + s.ns + `"},"spec":{"replicas":3}}`
	err := b.mallory.SubResource("scale").Patch(ctx, ref, client.RawPatch(types.ApplyPatchType, []byte(scale)), client.FieldOwner("mallory"))
	if got := reasonOf(err); got != fkv1.AdmissionMissingEpoch {
		t.Fatalf("an apply to /scale repeating the count, presenting nothing: got %q (%v), want %q", got, err, fkv1.AdmissionMissingEpoch)
	}
	if after := managed(); after != before {
		t.Fatalf("the refused apply changed the Deployment's field managers: %s -> %s", before, after)
	}
}

// otherVersions: HorizontalPodAutoscalers are guarded as
// "horizontalpodautoscalers.autoscaling/v1", yet a write through
// autoscaling/v2 is fenced as well. Were only v1 matched, the apiserver
// would convert a v2 write to v1 for admission, where the v2-only fields
// (spec.behavior, metrics other than CPU) are annotations outside
// fencekeeper.io/: the write would look metadata-only and pass without an
// epoch, from anyone.
func otherVersions(t *testing.T, b *bed) {
	ctx := context.Background()
	s, w1 := b.held(t)
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "report",
			Labels:      map[string]string{fkv1.LabelLock: lockName},
			Annotations: map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(w1.Status.Epoch)}},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "report"},
			MaxReplicas:    3,
		},
	}
	s.must(b.admin.Create(ctx, hpa))
	behavior := func() string {
		var got autoscalingv2.HorizontalPodAutoscaler
		s.must(b.admin.Get(ctx, client.ObjectKeyFromObject(hpa), &got))
		return fmt.Sprint(got.Spec.Behavior)
	}
	before := behavior()
	ref := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "report"}}
	err := b.mallory.Patch(ctx, ref, client.RawPatch(types.MergePatchType,
		[]byte(`{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":5}}}}`)))
	if got := reasonOf(err); got != fkv1.AdmissionMissingEpoch {
		t.Fatalf("a v2 write of a v2-only field without an epoch got %q (%v), want %q", got, err, fkv1.AdmissionMissingEpoch)
	}
	if after := behavior(); after != before {
		t.Fatalf("the refused v2 write changed spec.behavior: %s -> %s", before, after)
	}
	// The version listed is fenced as before, and there the v2-only fields
	// are annotations: content all the same.
	v1ref := &autoscalingv1.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "report"}}
	err = b.mallory.Patch(ctx, v1ref, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"maxReplicas":9}}`)))
	if got := reasonOf(err); got != fkv1.AdmissionMissingEpoch {
		t.Fatalf("a v1 write without an epoch got %q (%v), want %q", got, err, fkv1.AdmissionMissingEpoch)
	}
	behaviorV1, _ := json.Marshal(map[string]any{"ScaleDown": map[string]any{"StabilizationWindowSeconds": 5, "SelectPolicy": "Max",
		"Policies": []any{map[string]any{"Type": "Pods", "Value": 1, "PeriodSeconds": 60}}}})
	annotationPatch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		"autoscaling.alpha.kubernetes.io/behavior": string(behaviorV1)}}})
	err = b.mallory.Patch(ctx, v1ref, client.RawPatch(types.MergePatchType, annotationPatch))
	if got := reasonOf(err); got != fkv1.AdmissionMissingEpoch {
		t.Fatalf("a v1 write of spec.behavior's annotation without an epoch got %q (%v), want %q", got, err, fkv1.AdmissionMissingEpoch)
	}
	if after := behavior(); after != before {
		t.Fatalf("a v1 write of spec.behavior's annotation changed spec.behavior: %s -> %s", before, after)
	}
	// The holder's v2 write, presenting its epoch, passes.
	s.must(b.admin.Patch(ctx, ref, client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(
		`{"metadata":{"annotations":{%q:%q}},"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":7}}}}`,
		fkv1.AnnotationEpoch, fkv1.FormatEpoch(w1.Status.Epoch))))))
}

// statusWrites: a status write is not fenced (rule 7), but a Deployment
// keeps the annotations its status writes send, so there the fencing
// metadata must not change: otherwise a stale holder could open the object
// to any identity, relax it to monotonic or lower its watermark, then
// write with its old epoch. (A custom resource drops metadata sent to
// status: pkg/election's tests send such writes without labels.)
func statusWrites(t *testing.T, b *bed) {
	ctx := context.Background()
	s, w1 := b.held(t)
	ns := s.ns
	labels := map[string]string{"app": "report"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report",
			Labels:      map[string]string{fkv1.LabelLock: lockName},
			Annotations: map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(w1.Status.Epoch)}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "report:1"}}}},
		},
	}
	s.must(b.admin.Create(ctx, d))
	status := func(body string) error {
		ref := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report"}}
		if strings.HasPrefix(body, `{"apiVersion"`) { // a server-side apply configuration
			return b.mallory.Status().Patch(ctx, ref, client.RawPatch(types.ApplyPatchType, []byte(body)),
				client.FieldOwner("mallory"), client.ForceOwnership)
		}
		return b.mallory.Status().Patch(ctx, ref, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	// stored is what fences the object: annotations and owners.
	stored := func() string {
		var got appsv1.Deployment
		s.must(b.admin.Get(ctx, client.ObjectKeyFromObject(d), &got))
		return fmt.Sprint(got.Annotations, got.OwnerReferences)
	}
	for _, tc := range []struct {
		name, body string
		// leftOut: the write leaves fencing metadata out, which the webhook
		// puts back (it sees the request before the kind's status rules,
		// and clients send objects without it); CEL mode sees the object as
		// it would be stored and refuses (pinned difference).
		leftOut bool
	}{
		{name: "open it to any identity", body: fmt.Sprintf(`{"metadata":{"annotations":{%q:"any"}}}`, fkv1.AnnotationFenceIdentity)},
		{name: "relax it to monotonic", body: fmt.Sprintf(`{"metadata":{"annotations":{%q:"monotonic"}}}`, fkv1.AnnotationFencePolicy)},
		{name: "lower the watermark", body: fmt.Sprintf(`{"metadata":{"annotations":{%q:"1"}}}`, fkv1.AnnotationFencedEpoch)},
		{name: "give it an owner that does not exist, for the garbage collector to delete it",
			body: `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"ghost","uid":"6a1b0c9e-0000-4000-8000-000000000001"}]}}`},
		{name: "open it to any identity with a server-side apply",
			body: fmt.Sprintf(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"report","namespace":%q,"annotations":{%q:"any"}}}`, ns, fkv1.AnnotationFenceIdentity)},
		{name: "rewrite what the holder's next kubectl apply prunes by",
			body: `{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"spec\":{}}"}}}`},
		{name: "remove the watermark", body: fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, fkv1.AnnotationFencedEpoch), leftOut: true},
	} {
		before := stored()
		want := fkv1.AdmissionStatusChangesFencing
		if tc.leftOut && b.mode == modeWebhook {
			want = ""
		}
		if got := reasonOf(status(tc.body)); got != want {
			t.Fatalf("a status write meant to %s got %q, want %q", tc.name, got, want)
		}
		if after := stored(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("a status write meant to %s changed the fencing metadata: %v -> %v", tc.name, before, after)
		}
	}
	// A PUT of the object read back (what the deployment controller sends)
	// and a JSON patch are judged the same way.
	put := func(mutate func(*appsv1.Deployment)) error {
		var cur appsv1.Deployment
		s.must(b.mallory.Get(ctx, client.ObjectKeyFromObject(d), &cur))
		mutate(&cur)
		return b.mallory.Status().Update(ctx, &cur)
	}
	before := stored()
	if got := reasonOf(put(func(d *appsv1.Deployment) { d.Annotations[fkv1.AnnotationFenceIdentity] = fkv1.FenceIdentityAny })); got != fkv1.AdmissionStatusChangesFencing {
		t.Fatalf("a status PUT opening the object to any identity got %q, want %q", got, fkv1.AdmissionStatusChangesFencing)
	}
	jsonBody := fmt.Sprintf(`[{"op":"add","path":"/metadata/annotations/%s","value":"monotonic"}]`, strings.ReplaceAll(fkv1.AnnotationFencePolicy, "/", "~1"))
	if got := reasonOf(b.mallory.Status().Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report"}},
		client.RawPatch(types.JSONPatchType, []byte(jsonBody)))); got != fkv1.AdmissionStatusChangesFencing {
		t.Fatalf("a JSON-patch status write relaxing the object to monotonic got %q, want %q", got, fkv1.AdmissionStatusChangesFencing)
	}
	if after := stored(); after != before {
		t.Fatalf("a refused status PUT or JSON patch changed the fencing metadata: %v -> %v", before, after)
	}
	s.must(put(func(d *appsv1.Deployment) { d.Status.ObservedGeneration = 1 }))

	// A status write cannot fence an unfenced object either (the label
	// would come without an epoch). The webhook puts the label back as
	// stored (absent); a Deployment's status strategy drops labels anyway,
	// so CEL mode, which sees the object as it would be stored, has nothing
	// to refuse here (on a kind that kept them it refuses).
	plain := d.DeepCopy()
	plain.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: "plain"}
	s.must(b.admin.Create(ctx, plain))
	labelBody := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, fkv1.LabelLock, lockName)
	if got := reasonOf(b.mallory.Status().Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}},
		client.RawPatch(types.MergePatchType, []byte(labelBody)))); got != "" && got != fkv1.AdmissionStatusChangesFencing {
		t.Fatalf("a status write adding the lock label got %q, want it kept out or refused", got)
	}
	s.must(b.admin.Get(ctx, client.ObjectKeyFromObject(plain), plain))
	if l, ok := plain.Labels[fkv1.LabelLock]; ok {
		t.Fatalf("a status write fenced an object with lock %q, presenting no epoch", l)
	}

	// What the deployment controller sends passes: status, and metadata
	// that is not fencekeeper's.
	s.must(status(`{"metadata":{"annotations":{"example.com/note":"x"}},"status":{"observedGeneration":1,"replicas":0}}`))
	var got appsv1.Deployment
	s.must(b.admin.Get(ctx, client.ObjectKeyFromObject(d), &got))
	if got.Annotations[fkv1.AnnotationFencedEpoch] != fkv1.FormatEpoch(w1.Status.Epoch) || got.Annotations["example.com/note"] != "x" {
		t.Fatalf("after an allowed status write the annotations are %v", got.Annotations)
	}
}

// policiesPutBack: the per-lock bindings select the policies by name, and
// the apiserver ignores a binding whose policy is gone, so a deleted policy
// (by hand, or by a webhook-mode replica's cleanup during a switch) would
// leave every lock unfenced. The manager applies them again.
func policiesPutBack(t *testing.T, b *bed) {
	ctx := context.Background()
	s, w1 := b.held(t)
	s.must(b.admin.Create(ctx, configMap(s.ns, "report", lockName, map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(w1.Status.Epoch)}, "v1")))
	policies := []client.Object{&admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: celmode.PolicyName}}}
	for _, name := range []string{celmode.PolicyName, celmode.BasePolicyName, celmode.LeaseRequiredPolicyName} {
		policies = append(policies, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	deleted := map[string]types.UID{}
	for _, p := range policies {
		s.must(b.admin.Get(ctx, client.ObjectKeyFromObject(p), p))
		deleted[fmt.Sprintf("%T", p)+p.GetName()] = p.GetUID()
		s.must(b.admin.Delete(ctx, p))
	}
	// Each comes back as a new object (the apiserver may go on enforcing a
	// deleted policy for a moment from its cache, so enforcement alone would
	// not show it).
	for _, p := range policies {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := b.admin.Get(ctx, client.ObjectKeyFromObject(p), p)
			return err == nil && p.GetUID() != deleted[fmt.Sprintf("%T", p)+p.GetName()], client.IgnoreNotFound(err)
		})
		if err != nil {
			t.Fatalf("%T %s was not put back: %v", p, p.GetName(), err)
		}
	}
	b.waitForPolicies()
	// A write without an epoch is refused again, by the lock's own policy,
	// once the apiserver has loaded it (probed with dry runs, which write
	// nothing; then a real write).
	dryRun := func() error {
		cm := s.get()
		cm.Data = map[string]string{"report": "stale"}
		return b.mallory.Update(ctx, cm, client.DryRunAll)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return reasonOf(dryRun()) == fkv1.AdmissionMissingEpoch, nil
	})
	if err != nil {
		t.Fatalf("a token-less write to a fenced object is not refused after the policies were deleted: %v", dryRun())
	}
	if got := reasonOf(s.update(b.mallory, 0, data("stale"))); got != fkv1.AdmissionMissingEpoch {
		t.Fatalf("a token-less write got %q, want %q", got, fkv1.AdmissionMissingEpoch)
	}
	if got := s.get().Data["report"]; got != "v1" {
		t.Fatalf("the refused write changed the object: %q", got)
	}
}

// celLeftovers: a switch from CEL mode to webhook mode leaves the policies
// and bindings the CEL-mode manager applied (Helm did not). Left in place,
// the mutating policy would consume each write's token before the webhook
// saw it; a webhook-mode manager removes them (controllers/celmode),
// and the holder's writes pass again.
func celLeftovers(t *testing.T, b *bed) {
	ctx := context.Background()
	s, w1 := b.held(t)
	guarded, err := webhook.ParseGuardedResources([]string{"configmaps"})
	s.must(err)
	policies, err := celmode.Render(celmode.Options{Guarded: guarded})
	s.must(err)
	s.must(celmode.Install(ctx, b.admin, policies))
	for _, obj := range celmode.Bindings(lockName).Objects() {
		s.must(client.IgnoreAlreadyExists(b.admin.Create(ctx, obj)))
	}
	left := func() []string {
		var names []string
		for _, list := range []client.ObjectList{
			&admissionregistrationv1.MutatingAdmissionPolicyBindingList{}, &admissionregistrationv1.MutatingAdmissionPolicyList{},
			&admissionregistrationv1.ValidatingAdmissionPolicyBindingList{}, &admissionregistrationv1.ValidatingAdmissionPolicyList{},
		} {
			s.must(b.admin.List(ctx, list))
			items, err := apimeta.ExtractList(list)
			s.must(err)
			for _, it := range items {
				if o := it.(client.Object); celmode.Owned(o) {
					names = append(names, o.GetName())
				}
			}
		}
		return names
	}
	var last []string
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = left()
		return len(last) == 0, nil
	}); err != nil {
		t.Fatalf("the webhook-mode manager left the CEL-mode objects in place: %v", last)
	}
	// The holder writes as usual, after every apiserver had time to drop
	// the policies (they reload on a timer).
	time.Sleep(celmode.LoadDelay)
	s.must(b.admin.Create(ctx, configMap(s.ns, "report", lockName, map[string]string{fkv1.AnnotationEpoch: fkv1.FormatEpoch(w1.Status.Epoch)}, "v1")))
	s.must(s.update(b.admin, w1.Status.Epoch, data("v2")))
	if got := s.get().Annotations[fkv1.AnnotationFencedEpoch]; got != fkv1.FormatEpoch(w1.Status.Epoch) {
		t.Fatalf("stored fenced-epoch %q, want %d", got, w1.Status.Epoch)
	}
}

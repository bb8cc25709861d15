package election

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
)

// Gate wraps c so that every create, update, patch, apply and delete of an
// object the lock fences (label fencekeeper.io/lock=<Name>, in the lock's
// namespace) presents the leader's current epoch, and is refused without
// being sent (ErrNotLeading) unless the term is HELD. The server's fencing
// denials come back matching lease.ErrStaleEpoch. Other objects, and all
// reads, pass through untouched.
//
// The gate is the client-side half; the admission check at the object is
// the backstop that holds even when a stale leader's write gets past it
// (a pause between the gate's check and the request reaching the server).
func (l *Lock) Gate(c client.Client) client.Client { return &gated{Client: c, lock: l} }

type gated struct {
	client.Client
	lock *Lock
}

// fences reports whether obj belongs to this lock.
func (l *Lock) fences(obj interface {
	GetLabels() map[string]string
	GetNamespace() string
}) bool {
	return obj.GetNamespace() == l.cfg.Namespace && obj.GetLabels()[fkv1.LabelLock] == l.cfg.Name
}

func (g *gated) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if !g.lock.fences(obj) {
		return g.Client.Create(ctx, obj, opts...)
	}
	t, err := g.lock.leading()
	if err != nil {
		return refused(obj, "create", err)
	}
	ctx, cancel := sendBy(ctx, t)
	defer cancel()
	return t.Create(ctx, g.Client, obj, opts...)
}

func (g *gated) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if !g.lock.fences(obj) {
		return g.Client.Update(ctx, obj, opts...)
	}
	t, err := g.lock.leading()
	if err != nil {
		return refused(obj, "update", err)
	}
	ctx, cancel := sendBy(ctx, t)
	defer cancel()
	return t.Update(ctx, g.Client, obj, opts...)
}

func (g *gated) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if !g.lock.fences(obj) {
		return g.Client.Patch(ctx, obj, patch, opts...)
	}
	t, err := g.lock.leading()
	if err != nil {
		return refused(obj, "patch", err)
	}
	ctx, cancel := sendBy(ctx, t)
	defer cancel()
	return t.Patch(ctx, g.Client, obj, patch, opts...)
}

// Apply reads the apply configuration's labels; a fenced one is stamped
// and sent as unstructured (the same fields, plus the epoch).
func (g *gated) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	u, err := unstructuredOf(obj)
	if err != nil {
		return err
	}
	if !g.lock.fences(u) {
		return g.Client.Apply(ctx, obj, opts...)
	}
	t, err := g.lock.leading()
	if err != nil {
		return refused(u, "apply", err)
	}
	ctx, cancel := sendBy(ctx, t)
	defer cancel()
	t.Stamp(u)
	return lease.Fenced(g.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...))
}

// Delete of a fenced object follows DESIGN §3 rule 6's path for the
// current holder: a fenced write marks the object with the epoch (guarded by
// the resourceVersion in hand, if any), then the delete is sent with UID and
// resourceVersion preconditions (the caller's, if given), so nothing written
// between the two is deleted unseen; a delete that fails takes the mark off
// again. When obj carries no labels (a delete by name) in the lock's
// namespace, the gate reads it first to learn whether it is fenced. A dry
// run is passed through unmarked: it shows what the object says to a
// delete, and writes nothing.
func (g *gated) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	obj = g.lock.withLabels(ctx, g.Client, obj)
	do := (&client.DeleteOptions{}).ApplyOptions(opts)
	if !g.lock.fences(obj) || len(do.DryRun) > 0 {
		return g.Client.Delete(ctx, obj, opts...)
	}
	t, err := g.lock.leading()
	if err != nil {
		return refused(obj, "delete", err)
	}
	ctx, cancel := sendBy(ctx, t)
	defer cancel()
	mark := map[string]any{"annotations": map[string]any{fkv1.AnnotationDeleteEpoch: fkv1.FormatEpoch(t.Epoch)}}
	if do.Preconditions != nil && do.Preconditions.ResourceVersion != nil {
		mark["resourceVersion"] = *do.Preconditions.ResourceVersion
	} else if rv := obj.GetResourceVersion(); rv != "" {
		mark["resourceVersion"] = rv
	}
	body, _ := json.Marshal(map[string]any{"metadata": mark})
	if err := t.Patch(ctx, g.Client, obj, client.RawPatch(types.MergePatchType, body)); err != nil {
		return err
	}
	if do.Preconditions == nil {
		uid, rv := obj.GetUID(), obj.GetResourceVersion()
		opts = append(opts, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	} else if do.Preconditions.ResourceVersion != nil {
		// The mark moved the resourceVersion the caller named.
		rv := obj.GetResourceVersion()
		opts = append(opts, client.Preconditions{UID: do.Preconditions.UID, ResourceVersion: &rv})
	}
	err = lease.Fenced(g.Client.Delete(ctx, obj, opts...))
	if err != nil && !apierrors.IsNotFound(err) {
		// Leave no mark behind: a later unmarked path must not find it.
		unmark := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, fkv1.AnnotationDeleteEpoch))
		_ = t.Patch(ctx, g.Client, obj, client.RawPatch(types.MergePatchType, unmark))
	}
	return err
}

// DeleteAllOf passes through: the admission check refuses each fenced
// object it would delete (none is marked), so a collection delete can never
// remove fenced objects; delete them one by one through the gate.

// Status writes are not checked at the object (DESIGN §3 rule 7), so the
// gate is their only guard: a fenced object's status is written only while
// the term is HELD.
func (g *gated) Status() client.SubResourceWriter {
	return &gatedSub{SubResourceWriter: g.Client.Status(), lock: g.lock, reader: g.Client}
}

// SubResource writes (scale, status, ...) of fenced objects are refused
// unless HELD; the scale subresource is also fenced at the object.
func (g *gated) SubResource(sub string) client.SubResourceClient {
	return &gatedSubClient{SubResourceClient: g.Client.SubResource(sub), lock: g.lock, reader: g.Client}
}

type gatedSub struct {
	client.SubResourceWriter
	lock   *Lock
	reader client.Reader
}

// check refuses a subresource write of a fenced object unless HELD. The
// object's labels are read when the copy in hand has none: status writes
// have no check at the object, so the gate must not miss one.
func (s *gatedSub) check(ctx context.Context, obj client.Object, verb string) error {
	if !s.lock.fences(s.lock.withLabels(ctx, s.reader, obj)) {
		return nil
	}
	if _, err := s.lock.leading(); err != nil {
		return refused(obj, verb, err)
	}
	return nil
}

func (s *gatedSub) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if err := s.check(ctx, obj, "create subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Create(ctx, obj, sub, opts...)
}

func (s *gatedSub) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := s.check(ctx, obj, "update subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *gatedSub) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := s.check(ctx, obj, "patch subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

func (s *gatedSub) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	u, err := unstructuredOf(obj)
	if err != nil {
		return err
	}
	if err := s.check(ctx, u, "apply subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Apply(ctx, obj, opts...)
}

type gatedSubClient struct {
	client.SubResourceClient
	lock   *Lock
	reader client.Reader
}

func (s *gatedSubClient) writer() *gatedSub {
	return &gatedSub{SubResourceWriter: s.SubResourceClient, lock: s.lock, reader: s.reader}
}

func (s *gatedSubClient) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return s.writer().Create(ctx, obj, sub, opts...)
}

func (s *gatedSubClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return s.writer().Update(ctx, obj, opts...)
}

func (s *gatedSubClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return s.writer().Patch(ctx, obj, patch, opts...)
}

func (s *gatedSubClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return s.writer().Apply(ctx, obj, opts...)
}

func refused(obj interface {
	GetNamespace() string
	GetName() string
}, verb string, err error) error {
	return fmt.Errorf("write gate: %s %s/%s refused before sending: %w", verb, obj.GetNamespace(), obj.GetName(), err)
}

// withLabels is obj, or when obj is in the lock's namespace but carries no
// labels (a write by name), the stored object as the reader shows it.
func (l *Lock) withLabels(ctx context.Context, r client.Reader, obj client.Object) client.Object {
	if obj.GetNamespace() != l.cfg.Namespace || len(obj.GetLabels()) > 0 {
		return obj
	}
	cur, ok := obj.DeepCopyObject().(client.Object)
	if !ok || r.Get(ctx, client.ObjectKeyFromObject(obj), cur) != nil {
		return obj
	}
	return cur
}

// sendBy bounds a gated write by the term's safe time: a write still
// waiting (client rate limiter, connection set-up, a pause) when the term
// turns SUSPECT is not sent late.
func sendBy(ctx context.Context, t *lease.Lease) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.Remaining()-t.TTL/3)
}

// unstructuredOf reads an apply configuration as an object.
func unstructuredOf(obj runtime.ApplyConfiguration) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("write gate: reading the apply configuration: %w", err)
	}
	u := &unstructured.Unstructured{}
	if err := lease.DecodeJSON(b, &u.Object); err != nil {
		return nil, fmt.Errorf("write gate: reading the apply configuration: %w", err)
	}
	return u, nil
}

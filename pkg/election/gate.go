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
	return t.Patch(ctx, g.Client, obj, patch, opts...)
}

// Apply reads the apply configuration's labels; a fenced one is stamped
// and sent as unstructured (the same fields, plus the epoch).
func (g *gated) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("write gate: reading the apply configuration: %w", err)
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &u.Object); err != nil {
		return fmt.Errorf("write gate: reading the apply configuration: %w", err)
	}
	if !g.lock.fences(u) {
		return g.Client.Apply(ctx, obj, opts...)
	}
	t, err := g.lock.leading()
	if err != nil {
		return refused(u, "apply", err)
	}
	t.Stamp(u)
	return lease.Fenced(g.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...))
}

// Delete of a fenced object follows DESIGN §3 rule 6's path for the
// current holder: a fenced write marks the object with the epoch, then the
// delete is sent with UID and resourceVersion preconditions, so nothing
// written between the two is deleted unseen. When obj carries no labels
// (a delete by name), the gate reads it first to learn whether it is fenced.
func (g *gated) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if len(obj.GetLabels()) == 0 {
		cur := obj.DeepCopyObject().(client.Object)
		if err := g.Client.Get(ctx, client.ObjectKeyFromObject(obj), cur); err == nil {
			obj = cur
		} else if !apierrors.IsNotFound(err) {
			return err
		}
	}
	if !g.lock.fences(obj) {
		return g.Client.Delete(ctx, obj, opts...)
	}
	t, err := g.lock.leading()
	if err != nil {
		return refused(obj, "delete", err)
	}
	mark := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, fkv1.AnnotationDeleteEpoch, fkv1.FormatEpoch(t.Epoch))
	if err := t.Patch(ctx, g.Client, obj, client.RawPatch(types.MergePatchType, []byte(mark))); err != nil {
		return err
	}
	uid, rv := obj.GetUID(), obj.GetResourceVersion()
	opts = append(opts, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	return lease.Fenced(g.Client.Delete(ctx, obj, opts...))
}

// DeleteAllOf passes through: the admission check refuses each fenced
// object it would delete (none is marked), so a collection delete can never
// remove fenced objects; delete them one by one through the gate.

// Status writes are not checked at the object (DESIGN §3 rule 7), so the
// gate is their only guard: a fenced object's status is written only while
// the term is HELD.
func (g *gated) Status() client.SubResourceWriter {
	return &gatedSub{SubResourceWriter: g.Client.Status(), lock: g.lock}
}

// SubResource writes (scale, status, ...) of fenced objects are refused
// unless HELD; the scale subresource is also fenced at the object.
func (g *gated) SubResource(sub string) client.SubResourceClient {
	return &gatedSubClient{SubResourceClient: g.Client.SubResource(sub), lock: g.lock}
}

type gatedSub struct {
	client.SubResourceWriter
	lock *Lock
}

func (s *gatedSub) check(obj client.Object, verb string) error {
	if !s.lock.fences(obj) {
		return nil
	}
	if _, err := s.lock.leading(); err != nil {
		return refused(obj, verb, err)
	}
	return nil
}

func (s *gatedSub) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if err := s.check(obj, "create subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Create(ctx, obj, sub, opts...)
}

func (s *gatedSub) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := s.check(obj, "update subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *gatedSub) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := s.check(obj, "patch subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

func (s *gatedSub) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &u.Object); err != nil {
		return err
	}
	if err := s.check(u, "apply subresource of"); err != nil {
		return err
	}
	return s.SubResourceWriter.Apply(ctx, obj, opts...)
}

type gatedSubClient struct {
	client.SubResourceClient
	lock *Lock
}

func (s *gatedSubClient) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return (&gatedSub{SubResourceWriter: s.SubResourceClient, lock: s.lock}).Create(ctx, obj, sub, opts...)
}

func (s *gatedSubClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return (&gatedSub{SubResourceWriter: s.SubResourceClient, lock: s.lock}).Update(ctx, obj, opts...)
}

func (s *gatedSubClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return (&gatedSub{SubResourceWriter: s.SubResourceClient, lock: s.lock}).Patch(ctx, obj, patch, opts...)
}

func (s *gatedSubClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return (&gatedSub{SubResourceWriter: s.SubResourceClient, lock: s.lock}).Apply(ctx, obj, opts...)
}

func refused(obj interface {
	GetNamespace() string
	GetName() string
}, verb string, err error) error {
	return fmt.Errorf("write gate: %s %s/%s refused before sending: %w", verb, obj.GetNamespace(), obj.GetName(), err)
}

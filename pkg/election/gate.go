package election

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// being sent (ErrNotLeading) unless the term is HELD. Every gated request
// carries a deadline: the moment the term would turn SUSPECT. The server's
// fencing denials come back matching lease.ErrStaleEpoch. Subresource
// writes in the lock's namespace need the term whatever the object in hand
// shows, and scale writes present the epoch in the Scale (see SubResource).
// Other objects, and all reads, pass through untouched.
//
// The gate is the client-side half; the admission check at the object is
// the backstop that holds even when a stale leader's write gets past it
// (a pause between the gate's check and the request reaching the server).
// Status writes have no backstop (DESIGN §3 rule 7): the gate is their
// only guard.
func (l *Lock) Gate(c client.Client) client.Client { return l.gateWith(c, c) }

// gateWith is Gate with the reader its lookups use (a live, uncached one
// from ManagerOptions: a cached read of an unwatched kind would start an
// informer).
func (l *Lock) gateWith(c client.Client, live client.Reader) client.Client {
	return &gated{Client: c, lock: l, live: live}
}

type gated struct {
	client.Client
	lock *Lock
	live client.Reader
}

// fences reports whether obj belongs to this lock.
func (l *Lock) fences(obj interface {
	GetLabels() map[string]string
	GetNamespace() string
}) bool {
	return obj.GetNamespace() == l.cfg.Namespace && obj.GetLabels()[fkv1.LabelLock] == l.cfg.Name
}

// permit is the live term for one gated request, and ctx bounded by the
// moment the term would turn SUSPECT: a write still waiting then (the
// client's rate limiter, connection set-up, a pause) is not sent late.
func (l *Lock) permit(ctx context.Context, obj interface {
	GetNamespace() string
	GetName() string
}, verb string) (*lease.Lease, context.Context, context.CancelFunc, error) {
	t, until, err := l.leading()
	if err != nil {
		return nil, nil, nil, refused(obj, verb, err)
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	return t, ctx, cancel, nil
}

func (g *gated) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if !g.lock.fences(obj) {
		return g.Client.Create(ctx, obj, opts...)
	}
	t, ctx, cancel, err := g.lock.permit(ctx, obj, "create")
	if err != nil {
		return err
	}
	defer cancel()
	return t.Create(ctx, g.Client, obj, opts...)
}

func (g *gated) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if !g.lock.fences(obj) {
		return g.Client.Update(ctx, obj, opts...)
	}
	t, ctx, cancel, err := g.lock.permit(ctx, obj, "update")
	if err != nil {
		return err
	}
	defer cancel()
	return t.Update(ctx, g.Client, obj, opts...)
}

func (g *gated) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if !g.lock.fences(obj) {
		return g.Client.Patch(ctx, obj, patch, opts...)
	}
	t, ctx, cancel, err := g.lock.permit(ctx, obj, "patch")
	if err != nil {
		return err
	}
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
	t, ctx, cancel, err := g.lock.permit(ctx, u, "apply")
	if err != nil {
		return err
	}
	defer cancel()
	t.Stamp(u)
	return lease.Fenced(g.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...))
}

// Delete of a fenced object follows DESIGN §3 rule 6's path for the
// current holder: a fenced write marks the object with the epoch (guarded by
// a resourceVersion: the caller's precondition or the copy in hand), then
// the delete is sent with UID and resourceVersion preconditions, so nothing
// written between the two is deleted unseen; a delete that fails takes the
// mark off again. A copy without the lock label in the lock's namespace (a
// delete by name) is looked up first. A dry run is sent unmarked: it shows
// what the object says to a delete, and writes nothing.
func (g *gated) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	do := (&client.DeleteOptions{}).ApplyOptions(opts)
	fenced, cur, lookupErr := g.lock.lookup(ctx, g.live, obj)
	if apierrors.IsNotFound(lookupErr) || (!fenced && lookupErr == nil) || len(do.DryRun) > 0 {
		return g.Client.Delete(ctx, obj, opts...)
	}
	if lookupErr != nil {
		return fmt.Errorf("write gate: delete %s/%s: cannot tell whether the lock fences it: %w", obj.GetNamespace(), obj.GetName(), lookupErr)
	}
	t, ctx, cancel, err := g.lock.permit(ctx, cur, "delete")
	if err != nil {
		return err
	}
	defer cancel()
	rv := cur.GetResourceVersion()
	if do.Preconditions != nil && do.Preconditions.ResourceVersion != nil {
		rv = *do.Preconditions.ResourceVersion
	}
	uid := cur.GetUID()
	if do.Preconditions != nil && do.Preconditions.UID != nil {
		uid = *do.Preconditions.UID
	}
	meta := map[string]any{"annotations": map[string]any{fkv1.AnnotationDeleteEpoch: fkv1.FormatEpoch(t.Epoch)}}
	if rv != "" {
		meta["resourceVersion"] = rv
	}
	if uid != "" {
		meta["uid"] = string(uid)
	}
	body, _ := json.Marshal(map[string]any{"metadata": meta})
	if err := t.Patch(ctx, g.Client, cur, client.RawPatch(types.MergePatchType, body)); err != nil {
		return err
	}
	uid, marked := cur.GetUID(), cur.GetResourceVersion()
	opts = append(opts, client.Preconditions{UID: &uid, ResourceVersion: &marked})
	err = lease.Fenced(g.Client.Delete(ctx, cur, opts...))
	if err != nil && !apierrors.IsNotFound(err) {
		// Leave no mark behind (with its own time: ctx may be what ran out),
		// even if the term has ended since: a mark left standing lets the
		// holder's identity delete the object while it equals the watermark
		// (under policy monotonic, in later terms too), and this write,
		// stamped with the old epoch, is refused once anything newer was
		// written, and otherwise only takes the mark off.
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer ucancel()
		unmark := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, fkv1.AnnotationDeleteEpoch))
		_ = t.Patch(uctx, g.Client, cur, client.RawPatch(types.MergePatchType, unmark))
	}
	return err
}

// DeleteAllOf passes through: the admission check refuses each fenced
// object it would delete unless marked, so delete fenced objects one by one
// through the gate.

// Status returns the status writer; its writes follow SubResource's rules.
func (g *gated) Status() client.SubResourceWriter {
	return &gatedSub{SubResourceWriter: g.Client.Status(), lock: g.lock, sub: "status"}
}

// SubResource writes in the lock's namespace are refused unless HELD,
// whatever labels the object in hand shows: a Scale carries none, the
// server ignores a status body's, and a copy by name shows none, so labels
// cannot tell which of them the lock fences. Status has no check at the
// object (DESIGN §3 rule 7), so the gate is its only guard; and a Scale
// stamped ahead of time (from Epoch) must not go out after the term. Scale
// writes also present the term's epoch in the Scale body's annotations,
// where the object's check reads it.
func (g *gated) SubResource(sub string) client.SubResourceClient {
	return &gatedSubClient{SubResourceClient: g.Client.SubResource(sub), lock: g.lock, sub: sub}
}

type gatedSub struct {
	client.SubResourceWriter
	lock *Lock
	sub  string
}

// check returns the live term and ctx bounded by its safe time for a write
// of obj's subresource, or why not. Outside the lock's namespace the lock
// fences nothing: the write passes as it is, with no term.
func (s *gatedSub) check(ctx context.Context, obj interface {
	GetNamespace() string
	GetName() string
}, verb string) (*lease.Lease, context.Context, context.CancelFunc, error) {
	if obj.GetNamespace() != s.lock.cfg.Namespace {
		return nil, ctx, func() {}, nil
	}
	return s.lock.permit(ctx, obj, verb+" "+s.sub+" of")
}

// presents reports whether a write under term t must carry its epoch.
func (s *gatedSub) presents(t *lease.Lease) bool { return t != nil && s.sub == "scale" }

func (s *gatedSub) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	_, ctx, cancel, err := s.check(ctx, obj, "create")
	if err != nil {
		return err
	}
	defer cancel()
	return s.SubResourceWriter.Create(ctx, obj, sub, opts...)
}

func (s *gatedSub) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	t, ctx, cancel, err := s.check(ctx, obj, "update")
	if err != nil {
		return err
	}
	defer cancel()
	if s.presents(t) {
		// What is sent: the body option's object, else obj itself.
		body := (&client.SubResourceUpdateOptions{}).ApplyOptions(opts).SubResourceBody
		if body == nil {
			body = obj
		}
		present(body, t.Epoch)
	}
	return lease.Fenced(s.SubResourceWriter.Update(ctx, obj, opts...))
}

func (s *gatedSub) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	t, ctx, cancel, err := s.check(ctx, obj, "patch")
	if err != nil {
		return err
	}
	defer cancel()
	if s.presents(t) {
		patch = presenting{Patch: patch, epoch: t.Epoch}
	}
	return lease.Fenced(s.SubResourceWriter.Patch(ctx, obj, patch, opts...))
}

func (s *gatedSub) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	u, err := unstructuredOf(obj)
	if err != nil {
		return err
	}
	t, ctx, cancel, err := s.check(ctx, u, "apply")
	if err != nil {
		return err
	}
	defer cancel()
	if s.presents(t) {
		if obj, opts, err = presentApply(obj, u, opts, t.Epoch); err != nil {
			return err
		}
	}
	return lease.Fenced(s.SubResourceWriter.Apply(ctx, obj, opts...))
}

// presentApply stamps the apply configuration that is sent: the body
// option's, else obj (u, read as unstructured).
func presentApply(obj runtime.ApplyConfiguration, u *unstructured.Unstructured, opts []client.SubResourceApplyOption, epoch int64) (runtime.ApplyConfiguration, []client.SubResourceApplyOption, error) {
	body := (&client.SubResourceApplyOptions{}).ApplyOpts(opts).SubResourceBody
	if body == nil {
		present(u, epoch)
		return client.ApplyConfigurationFromUnstructured(u), opts, nil
	}
	b, err := unstructuredOf(body)
	if err != nil {
		return nil, nil, err
	}
	present(b, epoch)
	// Options apply in order: this body replaces the caller's.
	return obj, append(opts, &client.SubResourceApplyOptions{SubResourceBody: client.ApplyConfigurationFromUnstructured(b)}), nil
}

// present sets the epoch token on obj, and nothing else: obj may be a
// Scale, or an object this lock does not fence (its label is not added).
func present(obj metav1.Object, epoch int64) {
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[fkv1.AnnotationEpoch] = fkv1.FormatEpoch(epoch)
	obj.SetAnnotations(ann)
}

// presenting adds the epoch token to the patch it wraps, when the patch is
// a JSON object (merge, strategic merge, apply): a patch computed from a
// copy that already carried the token would leave it out. A JSON patch is
// sent as it is (a Scale has no annotations for it to add to), and the
// object's check refuses it for presenting no epoch if the object is fenced.
type presenting struct {
	client.Patch
	epoch int64
}

func (p presenting) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	return presentJSON(data, p.epoch), nil
}

type gatedSubClient struct {
	client.SubResourceClient
	lock *Lock
	sub  string
}

func (s *gatedSubClient) writer() *gatedSub {
	return &gatedSub{SubResourceWriter: s.SubResourceClient, lock: s.lock, sub: s.sub}
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

// lookup tells whether obj is fenced by this lock. A copy that shows the
// label answers itself; in the lock's namespace, one that does not is read
// from r (bounded to a few seconds), and the stored object is returned.
func (l *Lock) lookup(ctx context.Context, r client.Reader, obj client.Object) (bool, client.Object, error) {
	if l.fences(obj) || obj.GetNamespace() != l.cfg.Namespace {
		return l.fences(obj), obj, nil
	}
	cur, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return false, obj, fmt.Errorf("cannot copy %T", obj)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.Get(rctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return false, obj, err
	}
	return l.fences(cur), cur, nil
}

func refused(obj interface {
	GetNamespace() string
	GetName() string
}, verb string, err error) error {
	return fmt.Errorf("write gate: %s %s/%s refused before sending: %w", verb, obj.GetNamespace(), obj.GetName(), err)
}

// unstructuredOf reads an apply configuration as an object, numbers as
// int64 where they are integers (exactly, even above 2^53), else float64.
func unstructuredOf(obj runtime.ApplyConfiguration) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("write gate: reading the apply configuration: %w", err)
	}
	var m map[string]any
	if err := lease.DecodeJSON(b, &m); err != nil {
		return nil, fmt.Errorf("write gate: reading the apply configuration: %w", err)
	}
	return &unstructured.Unstructured{Object: numbers(m).(map[string]any)}, nil
}

func numbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	}
	return v
}

package lock

import (
	"context"
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// statusReplies is a client whose only call is a status Patch, answered the
// way the real client answers: the patch is computed from its base (the
// real MergeFrom, which must leave that base alone), then the reply is
// decoded into the object passed in (encoding/json keeps a non-nil map and
// writes into it, and reuses a slice's backing array).
type statusReplies struct {
	client.Client
	reply string
}

func (s *statusReplies) Status() client.SubResourceWriter { return replyWriter{reply: s.reply} }

type replyWriter struct {
	client.SubResourceWriter
	reply string
}

func (w replyWriter) Patch(_ context.Context, obj client.Object, patch client.Patch, _ ...client.SubResourcePatchOption) error {
	if _, err := patch.Data(obj); err != nil {
		return err
	}
	return json.Unmarshal([]byte(w.reply), obj)
}

// listClaims hands out the cache's claims without deep copies (their maps
// and slices are the cache's): patching one's status must leave the
// cache's object as it was, even though the client decodes the reply into
// what it is given.
func TestStatusPatchLeavesTheCachedClaimAlone(t *testing.T) {
	g := NewWithT(t)
	cached := &fkv1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w", UID: "u1", ResourceVersion: "10",
			Annotations:   map[string]string{"a": "cached"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "cached"}}},
		Spec: fkv1.FencedLeaseSpec{LockName: "x", HolderIdentity: "w"},
	}
	shallow := *cached // what a list with UnsafeDisableDeepCopy returns
	c := &statusReplies{reply: `{"metadata":{"resourceVersion":"11","annotations":{"a":"reply","b":"reply"},` +
		`"managedFields":[{"manager":"reply"}]},"status":{"phase":"Pending"}}`}
	r := NewReconciler(c, nil, events.NewFakeRecorder(10), Options{})

	g.Expect(r.syncStatuses(context.Background(), &lockMemory{}, []*fkv1.FencedLease{&shallow}, statusInputs{})).To(Succeed())
	g.Expect(shallow.ResourceVersion).To(Equal("11"), "the patched claim did not get the reply")
	g.Expect(cached.Annotations).To(Equal(map[string]string{"a": "cached"}), "the reply was written into the cache's annotations")
	g.Expect(cached.ManagedFields[0].Manager).To(Equal("cached"), "the reply was written into the cache's managedFields")
	g.Expect(cached.Status.Phase).To(BeEmpty())
}

package lock

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestQueueFull(t *testing.T) {
	holder := claim("w0", 0, fkv1.PhaseHeld, 41)
	queued := func(name string, created int) *fkv1.FencedLease { return claim(name, created, fkv1.PhasePending, 0) }
	fresh := func(name string, created int) *fkv1.FencedLease { return claim(name, created, "", 0) }
	podClaim := madeByBridge(fresh("pod-w", 9), "p")
	// A user's claim naming a pod as its controller is no pod's claim: only
	// what admission recorded about its creator says the bridge made it.
	handMade := fresh("hand-w", 9)
	handMade.Annotations = map[string]string{fkv1.AnnotationCreatedBy: "mallory", fkv1.AnnotationCreatedByPodUID: ""}
	handMade.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "p", Controller: ptr.To(true)}}
	for _, tc := range []struct {
		name   string
		claims []*fkv1.FencedLease
		max    int
		want   []string
	}{
		{"room for all", []*fkv1.FencedLease{holder, queued("w1", 1), fresh("w2", 2)}, 2, nil},
		{"the newest beyond the limit is turned away", []*fkv1.FencedLease{holder, queued("w1", 1), fresh("w2", 2), fresh("w3", 3)}, 2, []string{"w3"}},
		{"the holder takes no place", []*fkv1.FencedLease{holder, fresh("w1", 1), fresh("w2", 2)}, 2, nil},
		{"already queued claims are never turned away, even over a lowered limit", []*fkv1.FencedLease{holder, queued("w1", 1), queued("w2", 2), queued("w3", 3), fresh("w4", 4)}, 2, []string{"w4"}},
		{"queued claims count first even when a new one sorts before them", []*fkv1.FencedLease{holder, queued("w1", 5), queued("w2", 5), fresh("a-new", 5)}, 2, []string{"a-new"}},
		{"a pod's claim takes a place but is never turned away", []*fkv1.FencedLease{holder, queued("w1", 1), podClaim, fresh("w3", 10)}, 2, []string{"w3"}},
		{"a hand-made claim with a controller reference to a pod is turned away like any", []*fkv1.FencedLease{holder, queued("w1", 1), queued("w2", 2), handMade}, 2, []string{"hand-w"}},
		{"claims that record no identity (never granted) take no place", []*fkv1.FencedLease{holder, unbound(queued("u1", 1)), unbound(queued("u2", 2)), unbound(queued("u3", 3)), queued("w1", 4), fresh("w2", 5)}, 2, nil},
		{"no limit", []*fkv1.FencedLease{holder, queued("w1", 1), fresh("w2", 2), fresh("w3", 3)}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := queueFull(tc.claims, held(41, "w0"), tc.max)
			want := map[types.UID]bool{}
			for _, n := range tc.want {
				want[types.UID("uid-"+n)] = true
			}
			if len(got) != len(want) {
				t.Fatalf("turned away %v, want %v", got, want)
			}
			for uid := range want {
				if !got[uid] {
					t.Fatalf("turned away %v, want %v", got, want)
				}
			}
		})
	}
}

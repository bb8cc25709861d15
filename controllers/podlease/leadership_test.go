package podlease

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
)

type leadership bool

func (l leadership) Current() bool { return bool(l) }

// A leader whose term is not certain (resumed from a pause past its lease)
// reads and writes nothing about pods: the next leader may already have
// told a pod it lost, and this one's caches may say it holds. The
// reconciler here has no client, so any read or write would panic.
func TestNoPodWriteOutsideTheTerm(t *testing.T) {
	g := NewWithT(t)
	r := NewReconciler(nil, nil, nil, leadership(false))
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "p"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.RequeueAfter).To(BeNumerically(">", 0), "the pod is looked at again once the term is certain")
}

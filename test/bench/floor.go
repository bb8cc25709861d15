// The floor, the unit every latency is divided by: n sequential Updates of
// one plain Lease, each carrying the resourceVersion of the previous
// response (one resourceVersion-guarded Lease update round trip against the
// same apiserver, in the same run).
package main

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// floor: one resourceVersion-guarded Lease update round trip.
func measureFloor(ctx context.Context, c client.Client, n int) (latency, error) {
	ns, err := newNS(ctx, c, "floor")
	if err != nil {
		return latency{}, err
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "floor"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("bench")}}
	if err := c.Create(ctx, l); err != nil {
		return latency{}, err
	}
	var d []time.Duration
	for i := 0; i < n; i++ {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		start := time.Now()
		if err := c.Update(ctx, l); err != nil { // carries l.ResourceVersion
			return latency{}, err
		}
		d = append(d, time.Since(start))
	}
	return summarize(d), nil
}

// The floor, the unit every latency is divided by: one resourceVersion-
// guarded Lease update round trip against the same apiserver, in the same
// run. It is sampled throughout each phase a latency goal judges (one
// round trip between consecutive samples, on a Lease of the phase's own in
// a namespace of its own), and each such phase's ratios are taken against
// its own floor (report key floor_by_phase_ms). floor_ms pools every floor
// round trip of the run: the floor step's and every phase's.
package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var (
	// floorWrites counts the floor's own Lease writes (creates and
	// updates), which cluster.writes leaves out of the manager's.
	floorWrites atomic.Int64
	// floorPool is every floor round trip of the run (floor_ms).
	floorPool struct {
		sync.Mutex
		d []time.Duration
	}
)

// floorSampler takes floor round trips on a plain Lease of its own (no
// fencekeeper label: the manager ignores it), each carrying the
// resourceVersion of the previous response.
type floorSampler struct {
	c client.Client
	l *coordinationv1.Lease
	d []time.Duration
}

func newFloorSampler(ctx context.Context, c client.Client) (*floorSampler, error) {
	ns, err := newNS(ctx, c, "floor")
	if err != nil {
		return nil, err
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "floor"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("bench")}}
	floorWrites.Add(1)
	if err := c.Create(ctx, l); err != nil {
		return nil, err
	}
	return &floorSampler{c: c, l: l}, nil
}

// sample takes one floor round trip.
func (f *floorSampler) sample(ctx context.Context) error {
	now := metav1.NewMicroTime(time.Now())
	f.l.Spec.RenewTime = &now
	floorWrites.Add(1)
	start := time.Now()
	if err := f.c.Update(ctx, f.l); err != nil { // carries f.l.ResourceVersion
		return err
	}
	d := time.Since(start)
	f.d = append(f.d, d)
	floorPool.Lock()
	floorPool.d = append(floorPool.d, d)
	floorPool.Unlock()
	return nil
}

func (f *floorSampler) latency() latency { return summarize(f.d) }

// floorOverall is floor_ms: every floor round trip of the run.
func floorOverall() latency {
	floorPool.Lock()
	defer floorPool.Unlock()
	return summarize(floorPool.d)
}

// resetFloorPool forgets the round trips so far (the warm-up's).
func resetFloorPool() {
	floorPool.Lock()
	defer floorPool.Unlock()
	floorPool.d = nil
}

// measureFloor: the floor step, n round trips in a row.
func measureFloor(ctx context.Context, c client.Client, n int) (latency, error) {
	f, err := newFloorSampler(ctx, c)
	if err != nil {
		return latency{}, err
	}
	for i := 0; i < n; i++ {
		if err := f.sample(ctx); err != nil {
			return latency{}, err
		}
	}
	return f.latency(), nil
}

// spacing is the pause between a timed phase's samples: uniform in
// [20, 80) ms, so no figure locks onto a server timer (the watch cache's
// 100 ms progress requests).
func spacing() { time.Sleep(time.Duration(20+rand.IntN(60)) * time.Millisecond) }

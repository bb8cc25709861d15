package lock

import (
	"fmt"
	"math/rand/v2"
	"testing"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// BenchmarkHandoffWork is the pure part of the reconcile that grants the
// next waiter of a lock whose holder just released it, with n waiters
// queued: what the authority computes per handoff besides its requests.
func BenchmarkHandoffWork(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("waiters_%d", n), func(b *testing.B) {
			claims := make([]*fkv1.FencedLease, n)
			for i := range claims {
				claims[i] = claim(fmt.Sprintf("c%05d", i), i%7, fkv1.PhasePending, 0)
				desired, _ := desiredStatus(claims[i], statusInputs{ledger: free(5)})
				claims[i].Status = desired
			}
			// The cache lists them in no particular order; the lock's
			// memory knows the order from its last reconcile.
			rand.New(rand.NewPCG(1, 2)).Shuffle(len(claims), func(i, j int) { claims[i], claims[j] = claims[j], claims[i] })
			_, queue := fifo(nil).order(claims)
			b.ResetTimer()
			for b.Loop() {
				ordered, _ := queue.order(claims)
				s := snapshot{ledger: free(5), hasLease: true, claims: ordered, now: t0, floor: 5, storageRevision: 100, termFloor: 1}
				_ = queueFull(ordered, s.ledger, DefaultMaxWaiters)
				_ = waitingInOrder(ordered, s.ledger) // waiterPods
				a := decide(s)
				in := statusInputs{ledger: s.ledger, maxWaiters: DefaultMaxWaiters}
				for _, c := range ordered {
					if queuedAsBefore(c, in) {
						continue
					}
					want, _ := desiredStatus(c, in)
					_ = statusEqual(want, c.Status)
				}
				_ = a
			}
		})
	}
}

package chaos

import (
	"context"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"sync/atomic"
	"time"
)

// Breaker is an operator who force-releases the lock now and then with
// `kubectl fence break` (the plugin binary, as a user would run it): the
// holder's hold ends at once and the next waiter is granted, while the
// broken holder may still believe it holds and go on writing. The fence
// must refuse those writes. Which holds a break actually ended is read from
// the recorded history (claims that end with reason ForcedRelease), not
// from what the breaker asked.
type Breaker struct {
	NS, Lock   string
	Plugin     string
	Kubeconfig string
	Rng        *rand.Rand
	// Asked counts break requests the plugin accepted.
	Asked *atomic.Int64
	// Permits, for a semaphore lock, lists its live permits' epochs: a
	// break there must name one (--epoch), picked at random; none live, no
	// break.
	Permits func(context.Context) []int64
}

// Run breaks the lock every 1.5-4.5 s until ctx ends.
func (b *Breaker) Run(ctx context.Context) {
	for {
		sleep(ctx, time.Duration(1500+b.Rng.IntN(3000))*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		args := []string{"--kubeconfig", b.Kubeconfig, "-n", b.NS, "break", b.Lock, "--reason", "chaos: forced unlock", "--wait", "0"}
		if b.Permits != nil {
			live := b.Permits(ctx)
			if len(live) == 0 {
				continue
			}
			args = append(args, "--epoch", strconv.FormatInt(live[b.Rng.IntN(len(live))], 10))
		}
		err := exec.CommandContext(ctx, b.Plugin, args...).Run()
		if err == nil {
			b.Asked.Add(1) // else: free, or the hold ended meanwhile
		}
	}
}

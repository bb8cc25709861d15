package chaos

import (
	"context"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Breaker is an operator who force-releases the lock now and then with
// `kubectl fence break` (the plugin binary, as a user would run it): the
// holder's hold ends at once and the next waiter is granted, while the
// broken holder may still believe it holds and go on writing. The fence
// must refuse those writes; the checker exempts only the broken epochs from
// the two-believers rule (the library cannot know of a break before the
// authority acts on it).
type Breaker struct {
	NS, Lock   string
	Plugin     string
	Kubeconfig string
	Rng        *rand.Rand
	Breaks     *atomic.Int64

	mu     sync.Mutex
	broken map[int64]bool
}

// brokeEpoch reads the broken claim's epoch from the plugin's report
// ("... claim C (holder H, epoch N) asked to end").
var brokeEpoch = regexp.MustCompile(`epoch (\d+)\) asked to end`)

// Run breaks the lock every 1.5-4.5 s until ctx ends.
func (b *Breaker) Run(ctx context.Context) {
	for {
		sleep(ctx, time.Duration(1500+b.Rng.IntN(3000))*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
		out, err := exec.CommandContext(ctx, b.Plugin, "--kubeconfig", b.Kubeconfig, "-n", b.NS,
			"break", b.Lock, "--reason", "chaos: forced unlock", "--wait", "0").CombinedOutput()
		if err != nil {
			continue // free, or the hold ended meanwhile: nothing broken
		}
		m := brokeEpoch.FindSubmatch(out)
		if m == nil {
			continue
		}
		e, err := strconv.ParseInt(string(m[1]), 10, 64)
		if err != nil {
			continue
		}
		b.mu.Lock()
		if b.broken == nil {
			b.broken = map[int64]bool{}
		}
		b.broken[e] = true
		b.mu.Unlock()
		b.Breaks.Add(1)
	}
}

// Broken is the set of epochs whose hold was broken.
func (b *Breaker) Broken() map[int64]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[int64]bool, len(b.broken))
	for e := range b.broken {
		out[e] = true
	}
	return out
}

package chaos

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// ErrReplyLost is what a client sees when the fault transport drops a reply:
// the request reached the apiserver and took effect, the answer did not come
// back.
var ErrReplyLost = errors.New("chaos: reply lost")

// Faults is an http.RoundTripper wrapper that plays a paused process (every
// request waits while paused: renewals stop reaching the apiserver, the way
// a GC pause stops them), lost replies and delayed requests.
type Faults struct {
	next http.RoundTripper

	mu     sync.Mutex
	rng    *rand.Rand
	gate   chan struct{} // closed while running; open channel while paused
	pLost  float64
	pDelay float64
	delay  time.Duration

	Lost, Delayed atomic.Int64
}

// NewFaults wraps next; seed makes its choices replayable (up to timing).
func NewFaults(next http.RoundTripper, seed uint64, pLost, pDelay float64, delay time.Duration) *Faults {
	g := make(chan struct{})
	close(g)
	return &Faults{next: next, rng: rand.New(rand.NewPCG(seed, 0x5eed)), gate: g, pLost: pLost, pDelay: pDelay, delay: delay}
}

// Pause holds every request until Resume.
func (f *Faults) Pause() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.gate:
		f.gate = make(chan struct{})
	default:
	}
}

// Resume lets held and new requests through.
func (f *Faults) Resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.gate:
	default:
		close(f.gate)
	}
}

// RoundTrip implements http.RoundTripper.
func (f *Faults) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	gate := f.gate
	lose := req.Method != http.MethodGet && f.rng.Float64() < f.pLost
	var wait time.Duration
	if f.rng.Float64() < f.pDelay {
		wait = time.Duration(f.rng.Int64N(int64(f.delay) + 1))
	}
	f.mu.Unlock()
	select {
	case <-gate:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	if wait > 0 {
		f.Delayed.Add(1)
		select {
		case <-time.After(wait):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	resp, err := f.next.RoundTrip(req)
	if err == nil && lose && !isWatch(req) {
		f.Lost.Add(1)
		_ = resp.Body.Close()
		return nil, ErrReplyLost
	}
	return resp, err
}

func isWatch(req *http.Request) bool { return req.URL.Query().Get("watch") == "true" }

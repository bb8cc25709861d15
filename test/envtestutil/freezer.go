package envtestutil

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// WatchFreezer stalls the watch streams of the client it wraps while
// frozen (its informers see nothing new), while every other request, and
// calls to its webhook, still work: a replica whose watches stalled, or
// whose route to the apiserver half failed. Match picks the watches it
// stalls (nil: all).
type WatchFreezer struct {
	Match func(*http.Request) bool
	mu    sync.Mutex
	open  chan struct{} // closed while not frozen
}

// NewWatchFreezer returns a freezer that is not frozen.
func NewWatchFreezer(match func(*http.Request) bool) *WatchFreezer {
	f := &WatchFreezer{Match: match, open: make(chan struct{})}
	close(f.open)
	return f
}

// Wrap is a WrapTransport: every transport the manager makes is frozen
// together.
func (f *WatchFreezer) Wrap(rt http.RoundTripper) http.RoundTripper {
	return freezing{next: rt, f: f}
}

// Freeze stalls the matching watches: an event already being read still
// gets through.
func (f *WatchFreezer) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.open:
		f.open = make(chan struct{})
	default:
	}
}

// Thaw lets them go on.
func (f *WatchFreezer) Thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.open:
	default:
		close(f.open)
	}
}

func (f *WatchFreezer) gate() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open
}

type freezing struct {
	next http.RoundTripper
	f    *WatchFreezer
}

func (t freezing) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || req.URL.Query().Get("watch") != "true" || (t.f.Match != nil && !t.f.Match(req)) {
		return resp, err
	}
	resp.Body = &frozenBody{ReadCloser: resp.Body, f: t.f, ctx: req.Context()}
	return resp, nil
}

type frozenBody struct {
	io.ReadCloser
	f   *WatchFreezer
	ctx context.Context
}

func (b *frozenBody) Read(p []byte) (int, error) {
	select {
	case <-b.f.gate():
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
	return b.ReadCloser.Read(p)
}

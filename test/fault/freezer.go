// Package fault injects faults into a test control plane and the clients
// of it: stalled watch streams (WatchFreezer), network partitions between
// one client and the apiserver (Proxy), a Lease write whose reply is lost
// after it committed (LoseLeaseReply), and a paused or restarted etcd or
// kube-apiserver (ControlPlaneProcess).
package fault

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// WatchFreezer stalls the watch streams of the client it wraps while
// frozen (its informers see nothing new), while every other request, and
// calls to its webhook, still work: a replica whose watches stalled, or
// whose route to the apiserver half failed. Match picks the watches it
// stalls (nil: all). Step lets a frozen stream deliver a given number of
// events, in order: a cache that trails by some events, not all. Expire
// drops what the frozen watches hold and makes their informers relist: a
// cache that jumps to the present without the events in between.
type WatchFreezer struct {
	Match func(*http.Request) bool
	mu    sync.Mutex
	open  chan struct{} // closed while not frozen
	// steps is how many more events may pass while frozen; stepped is
	// closed (and replaced) whenever Step adds some.
	steps   int
	stepped chan struct{}
	// expired is closed (and replaced) by Expire: the streams opened
	// before it end. expiries counts the Expire calls; refused maps a
	// watched path to the expiry whose resumption it was refused for.
	expired  chan struct{}
	expiries int
	refused  map[string]int
	relists  int // lists and watch-lists (sendInitialEvents) since the first Expire
}

// NewWatchFreezer returns a freezer that is not frozen.
func NewWatchFreezer(match func(*http.Request) bool) *WatchFreezer {
	f := &WatchFreezer{Match: match, open: make(chan struct{}), stepped: make(chan struct{}),
		expired: make(chan struct{}), refused: map[string]int{}}
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
	f.steps = 0
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

// Step lets n more events through the frozen watches (bookmarks pass
// without counting): with one matching watch, exactly its next n events.
func (f *WatchFreezer) Step(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps += n
	close(f.stepped)
	f.stepped = make(chan struct{})
}

// Expire drops the events the matching watches hold back and ends those
// watches; each watched resource's next resumption (a watch from the
// resourceVersion its informer had reached) is answered 410 Gone, as after
// etcd compacted past it, so the informer lists again and sees the present
// at once, none of the changes in between. It also thaws. This is a
// replica whose watch fell out of the apiserver's window during a long
// stall or partition.
func (f *WatchFreezer) Expire() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.expired)
	f.expired = make(chan struct{})
	f.expiries++
	select {
	case <-f.open:
	default:
		close(f.open)
	}
}

// refuseResume reports whether req resumes a watch on a path that has not
// been refused since the last Expire (and records that it now is).
func (f *WatchFreezer) refuseResume(req *http.Request) bool {
	q := req.URL.Query()
	if rv := q.Get("resourceVersion"); rv == "" || rv == "0" || q.Get("sendInitialEvents") == "true" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.expiries == 0 || f.refused[req.URL.Path] == f.expiries {
		return false
	}
	f.refused[req.URL.Path] = f.expiries
	return true
}

// countRelist counts req if it lists (a LIST, or a watch that sends the
// current objects first) after an Expire.
func (f *WatchFreezer) countRelist(req *http.Request) {
	q := req.URL.Query()
	if q.Get("watch") == "true" && q.Get("sendInitialEvents") != "true" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.expiries > 0 {
		f.relists++
	}
}

// Relists counts the lists of the matching resources since the first
// Expire (a LIST, or a watch sending the current objects first): how a
// test tells that an informer jumped to the present.
func (f *WatchFreezer) Relists() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.relists
}

// gone is the apiserver's answer to a watch from a compacted resourceVersion.
func gone(req *http.Request) *http.Response {
	body := `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",` +
		`"message":"too old resource version (watch freezer: expired)","reason":"Expired","code":410}`
	return &http.Response{StatusCode: http.StatusGone, Status: "410 Gone", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": []string{"application/json"}}, Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: req}
}

// admit waits until one event may pass; io.EOF ends a stream opened before
// an Expire.
func (f *WatchFreezer) admit(ctx context.Context, bookmark bool, expired <-chan struct{}) error {
	for {
		select {
		case <-expired:
			return io.EOF
		default:
		}
		f.mu.Lock()
		open, stepped := f.open, f.stepped
		select {
		case <-open:
			f.mu.Unlock()
			return nil
		default:
		}
		if bookmark || f.steps > 0 {
			if !bookmark {
				f.steps--
			}
			f.mu.Unlock()
			return nil
		}
		f.mu.Unlock()
		select {
		case <-open:
		case <-stepped:
		case <-expired:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type freezing struct {
	next http.RoundTripper
	f    *WatchFreezer
}

func (t freezing) RoundTrip(req *http.Request) (*http.Response, error) {
	matched := t.f.Match == nil || t.f.Match(req)
	watched := matched && req.URL.Query().Get("watch") == "true"
	if watched && t.f.refuseResume(req) {
		return gone(req), nil
	}
	if matched && req.Method == http.MethodGet {
		t.f.countRelist(req)
	}
	t.f.mu.Lock()
	expired := t.f.expired
	t.f.mu.Unlock()
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK || !watched {
		return resp, err
	}
	body := resp.Body
	events := &frozenEvents{ReadCloser: body, f: t.f, ctx: req.Context(), expired: expired}
	switch ct := resp.Header.Get("Content-Type"); {
	case strings.HasPrefix(ct, "application/json"):
		dec := json.NewDecoder(body)
		events.next = func() ([]byte, string, error) { return nextJSONEvent(dec) }
	case strings.HasPrefix(ct, "application/vnd.kubernetes.protobuf"):
		events.next = func() ([]byte, string, error) { return nextProtobufEvent(body) }
	default:
		_ = body.Close()
		return nil, fmt.Errorf("watch freezer: cannot split a %q watch stream into events", ct)
	}
	resp.Body = events
	return resp, nil
}

// frozenEvents gates a watch stream an event at a time: each event is read
// whole, then held until the freezer lets it pass.
type frozenEvents struct {
	io.ReadCloser
	next    func() (frame []byte, eventType string, err error)
	f       *WatchFreezer
	ctx     context.Context
	expired <-chan struct{}
	pending []byte
}

func (b *frozenEvents) Read(p []byte) (int, error) {
	if len(b.pending) == 0 {
		frame, eventType, err := b.next()
		if err != nil {
			return 0, err
		}
		if err := b.f.admit(b.ctx, eventType == "BOOKMARK", b.expired); err != nil {
			return 0, err
		}
		b.pending = frame
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

// nextJSONEvent reads one event of a JSON watch stream.
func nextJSONEvent(dec *json.Decoder) ([]byte, string, error) {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, "", err
	}
	var event struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &event)
	return append(raw, '\n'), event.Type, nil
}

// nextProtobufEvent reads one frame of a protobuf watch stream: a 4-byte
// big-endian length, then a metav1.WatchEvent whose field 1 is its type.
func nextProtobufEvent(r io.Reader) ([]byte, string, error) {
	frame := make([]byte, 4)
	if _, err := io.ReadFull(r, frame); err != nil {
		return nil, "", err
	}
	frame = append(frame, make([]byte, binary.BigEndian.Uint32(frame))...)
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		return nil, "", err
	}
	eventType := ""
	if body := frame[4:]; len(body) > 2 && body[0] == 0x0a && int(body[1]) < 0x80 && 2+int(body[1]) <= len(body) {
		eventType = string(body[2 : 2+int(body[1])])
	}
	return frame, eventType, nil
}

package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// A lock is answered only by a read that started after it asked: a lock
// that asks while a read is in flight waits for the next one, even though
// the one in flight finishes first. (Its revision could otherwise predate
// a write the reconcile already relied on.)
func TestRevisionReaderAnswersOnlyWithReadsStartedAfterTheAsk(t *testing.T) {
	rr, calls := startManualReader(t)
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}

	if _, ok, _ := rr.get(a); ok {
		t.Fatal("a was answered before any read")
	}
	first := <-calls // read 1 is in flight
	if _, ok, _ := rr.get(b); ok {
		t.Fatal("b was answered while read 1 was in flight")
	}
	first <- 100
	woken := waitReady(t, rr)
	if woken != a && woken != b {
		t.Fatalf("woke %v", woken)
	}
	if rev, ok, err := rr.get(a); !ok || err != nil || rev != 100 {
		t.Fatalf("a got %d, %v, %v; want 100 from read 1", rev, ok, err)
	}
	if rev, ok, _ := rr.get(b); ok {
		t.Fatalf("b got %d from read 1, which started before b asked", rev)
	}
	second := <-calls
	second <- 200
	for deadline := time.Now().Add(5 * time.Second); ; {
		if rev, ok, _ := rr.get(b); ok {
			if rev != 200 {
				t.Fatalf("b got %d, want 200 from read 2", rev)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b was never answered")
		}
		time.Sleep(time.Millisecond)
	}
	// Answered locks ask afresh: a's next ask needs read 3.
	if _, ok, _ := rr.get(a); ok {
		t.Fatal("a was answered again without a new read")
	}
}

func TestRevisionReaderReturnsAFailedReadOnce(t *testing.T) {
	fail := true
	rr := newRevisionReader(func(ctx context.Context) (int64, error) {
		if fail {
			fail = false
			return 0, errors.New("apiserver unavailable")
		}
		return 7, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = rr.Start(ctx) }()
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	_, _, _ = rr.get(a)
	waitReady(t, rr)
	if _, ok, err := rr.get(a); ok || err == nil {
		t.Fatalf("want the read's error, got ok=%v err=%v", ok, err)
	}
	_, _, _ = rr.get(a) // asks again
	waitReady(t, rr)
	if rev, ok, err := rr.get(a); !ok || err != nil || rev != 7 {
		t.Fatalf("got %d, %v, %v; want 7", rev, ok, err)
	}
}

func waitReady(t *testing.T, rr *revisionReader) types.NamespacedName {
	t.Helper()
	select {
	case ev := <-rr.ready:
		return types.NamespacedName{Namespace: ev.Object.GetNamespace(), Name: ev.Object.GetName()}
	case <-time.After(5 * time.Second):
		t.Fatal("no lock was queued again")
	}
	return types.NamespacedName{}
}

// A lock whose need went away (a look saw a valid ledger) is forgotten; when
// it needs a new ledger again, reads finished before that do not answer it.
func TestRevisionReaderForgottenAskNeedsANewRead(t *testing.T) {
	rr, calls := startManualReader(t)
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	_, _, _ = rr.get(a)
	(<-calls) <- 100
	waitReady(t, rr)
	rr.forget(a) // a later look saw a valid ledger
	if rev, ok, _ := rr.get(a); ok {
		t.Fatalf("a was answered with %d from a read finished before it asked again", rev)
	}
	(<-calls) <- 300
	waitReady(t, rr)
	if rev, ok, _ := rr.get(a); !ok || rev != 300 {
		t.Fatalf("got %d, %v; want 300", rev, ok)
	}
}

// startManualReader runs a revisionReader whose reads each wait for the
// test to send the revision on the channel the read hands out.
func startManualReader(t *testing.T) (*revisionReader, chan chan int64) {
	calls := make(chan chan int64)
	rr := newRevisionReader(func(ctx context.Context) (int64, error) {
		answer := make(chan int64)
		select {
		case calls <- answer:
			return <-answer, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = rr.Start(ctx) }()
	return rr, calls
}

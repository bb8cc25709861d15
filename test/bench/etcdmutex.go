// The etcd peer: the same handoff on etcd's own concurrency.Mutex, against
// the bench's etcd (the one under the apiserver). The holder unlocks while
// one waiter blocks in Lock; the figure is unlock call -> the waiter's Lock
// returning. Its ratio to fencekeeper's one-waiter handoff is what going
// through the apiserver (claims, the authority, watches) costs.
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	uberzap "go.uber.org/zap"
)

func measureEtcdMutexHandoff(ctx context.Context, endpoint string, rounds int) (latency, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: uberzap.NewNop()})
	if err != nil {
		return latency{}, err
	}
	defer cli.Close()
	session := func() (*concurrency.Session, error) { return concurrency.NewSession(cli, concurrency.WithTTL(15)) }
	var d []time.Duration
	for r := 0; r < rounds; r++ {
		key := "/bench-mutex/" + strconv.Itoa(r)
		sa, err := session()
		if err != nil {
			return latency{}, err
		}
		sb, err := session()
		if err != nil {
			return latency{}, err
		}
		a, b := concurrency.NewMutex(sa, key), concurrency.NewMutex(sb, key)
		if err := a.Lock(ctx); err != nil {
			return latency{}, err
		}
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			if err := b.Lock(ctx); err != nil {
				errc <- err
				return
			}
			got <- time.Now()
		}()
		time.Sleep(100 * time.Millisecond) // b is waiting on a's key
		unlocked := time.Now()
		if err := a.Unlock(ctx); err != nil {
			return latency{}, err
		}
		select {
		case t := <-got:
			d = append(d, t.Sub(unlocked))
		case err := <-errc:
			return latency{}, err
		case <-time.After(30 * time.Second):
			return latency{}, fmt.Errorf("etcd mutex: the waiter did not get the lock within 30s")
		}
		_ = b.Unlock(ctx)
		_ = sa.Close()
		_ = sb.Close()
	}
	return summarize(d), nil
}

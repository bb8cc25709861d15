package election

import (
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// RetryPeriod is how often client-go polls the Lock. Get and Update make no
// API calls (the holder library renews on its own schedule), so polling
// often costs only CPU and lets a granted candidate lead within
// milliseconds instead of client-go's default 2s.
const RetryPeriod = 10 * time.Millisecond

// ManagerOptions returns opts with fenced leader election switched on:
// this Lock as the resource lock, release on cancel (the next candidate is
// granted at once on a clean shutdown), client-go's timings fitted to the
// Lock, and the manager's client wrapped in the write gate, so every
// controller's writes to fenced objects carry the leader's epoch.
func (l *Lock) ManagerOptions(opts manager.Options) manager.Options {
	opts.LeaderElection = true
	opts.LeaderElectionResourceLockInterface = l
	opts.LeaderElectionID = l.cfg.Name
	opts.LeaderElectionNamespace = l.cfg.Namespace
	opts.LeaderElectionReleaseOnCancel = true
	// client-go requires LeaseDuration > RenewDeadline > 1.2 RetryPeriod.
	// RenewDeadline is how long after its term ends the elector notices and
	// the manager stops ("leader election lost"); the writes are refused
	// from SUSPECT on, before that.
	leaseDuration, renewDeadline, retry := l.cfg.TTL, min(l.cfg.TTL/2, time.Second), RetryPeriod
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &leaseDuration, &renewDeadline, &retry
	newClient := opts.NewClient
	if newClient == nil {
		newClient = client.New
	}
	opts.NewClient = func(cfg *rest.Config, o client.Options) (client.Client, error) {
		c, err := newClient(cfg, o)
		if err != nil {
			return nil, err
		}
		// The gate's lookups read live: through the cache, a read of a kind
		// the manager does not watch would start an informer for it.
		live, err := client.New(cfg, client.Options{HTTPClient: o.HTTPClient, Scheme: o.Scheme, Mapper: o.Mapper})
		if err != nil {
			return nil, err
		}
		return l.gateWith(c, live), nil
	}
	return opts
}

// Package webhook serves fencekeeper's validating admission webhook for
// fenced objects (any ConfigMap or listed custom resource with the
// fencekeeper.io/lock label) and builds its configuration.
//
// The hot path reads the lock's Lease from the manager's informer cache; it
// reads the Lease live only when the cache is behind the epoch presented (a
// grant the cache has not seen yet), so a fresh holder's first write is never
// refused as forged because of cache lag.
package webhook

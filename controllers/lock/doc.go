// Package lock is the lease authority. Its Reconciler reconciles one lock (a
// namespace and a spec.lockName) at a time, keeps the lock's backing
// coordination.k8s.io Lease as the ledger of the last issued epoch (format:
// api/v1alpha1 Ledger), and grants claims FIFO, each grant one
// resourceVersion-guarded Lease update that raises the epoch by exactly one.
//
// A reconcile reads gather -> decide -> act:
//   - gather.go reads the cache (and live only on rare paths) into a snapshot;
//   - decide.go is the pure rule book: grant, expiry, pod liveness, repair,
//     a foreign Lease; it returns one action;
//   - act.go makes that action's single Lease write and derives the claim
//     statuses (status.go) from the result, so a crash between the Lease
//     update and the status patch heals on the next reconcile.
//
// Expiry is decided on the controller's own monotonic clock, from when it
// last observed the holder's renewal signal change (clock.go), never from
// wall-clock timestamps written by another machine. See docs/design.md §2.
package lock

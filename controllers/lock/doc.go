// Package lock is the lease authority. Its Reconciler reconciles one lock (a
// namespace and a spec.lockName) at a time, keeps the lock's backing
// coordination.k8s.io Lease as the ledger of the last issued epoch (format:
// api/v1alpha1 Ledger), and grants claims FIFO, each grant one
// resourceVersion-guarded Lease update that raises the epoch.
//
// A reconcile reads gather -> decide -> act, on one copy of the lock's
// memory (memory.go), written back once when it ends:
//   - gather.go reads the cache (and live only on rare paths) into a
//     snapshot, and what it learns into that copy;
//   - decide.go is the pure rule book, a chain of named rules (settled,
//     epochsOf, holderOutcome, nextGrant, freeLock, repairLedger); it returns
//     one action;
//   - act.go makes that action's single Lease write and derives the claim
//     statuses (status.go) from the result, so a crash between the Lease
//     update and the status patch heals on the next reconcile.
//
// term.go is this process's term as the only authority (CatchUp, EndTerm)
// and what it vouches for to the webhook (FreshView). Expiry is decided on
// the controller's own monotonic clock, from when it last observed the
// holder's renewal signal change (clock.go), never from wall-clock
// timestamps written by another machine. See docs/design.md §2.
package lock

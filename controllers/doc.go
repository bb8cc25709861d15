// Package controllers holds fencekeeper's reconcilers.
//
// LockReconciler is the lease authority: it reconciles one lock (a namespace
// and a spec.lockName) at a time, keeps the lock's backing
// coordination.k8s.io Lease as the ledger of the last issued epoch, and grants
// claims FIFO, each grant one resourceVersion-guarded Lease update that raises
// the epoch by exactly one. Claim status is derived from the Lease, so a crash
// between the Lease update and the status patch heals on the next reconcile.
//
// Expiry is decided on the controller's own monotonic clock, from when it last
// observed the Lease's renewTime change (see renewalTracker), never from
// wall-clock timestamps written by another machine.
package controllers

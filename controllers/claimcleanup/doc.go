// Package claimcleanup deletes FencedLease claims a while after they ended
// (phase Expired), so a lock's history does not pile up in `kubectl get fl`.
// It only ever deletes Expired claims: an ended claim is history, its epoch
// is below the lock's and the lock's Lease keeps the counter, so removing
// it changes no decision of the authority and no fencing verdict (a write
// presenting an epoch whose claim is gone is refused). Claims a Pod owns are
// left to the garbage collector: the pod bridge would otherwise make the
// pod queue again.
package claimcleanup

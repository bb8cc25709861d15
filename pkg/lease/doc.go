// Package lease is the holder's side of fencekeeper: acquire a lock, keep it
// renewed, learn as early as possible when it is lost, and stamp the epoch on
// every write so the protected object can refuse a stale holder.
//
// It follows the client state machine of docs/design.md §5:
//
//	IDLE -> ACQUIRING -> HELD -> SUSPECT -> LOST
//	                      |                ^
//	                      +--> RELEASING --+--> RELEASED
//
// Acquire is idempotent by request ID: the claim's name is derived from it, so
// a retry after a lost reply finds the same claim instead of queueing twice.
// Renewals update only the exact lease identity (the claim UID on the backing
// Lease), resourceVersion-guarded. The safe time left is measured from when a
// renewal that was acknowledged was *sent*; below a margin the lease is
// SUSPECT (stop admitting work), at zero it is LOST, and so it is the moment
// the Lease names someone else or the claim turns Expired. Loss cancels the
// lease's context and closes Done().
//
// Checking the state before a write is never enough (a pause can fall between
// the check and the write); the epoch stamped on the write is what makes the
// object refuse it. Update maps that refusal to ErrStaleEpoch.
package lease

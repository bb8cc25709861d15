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
// It learns of its grant from the lock's Lease: the authority grants by one
// guarded update of it naming the claim's UID with the new epoch, before it
// writes the claim's status, and that record is what admission checks. The
// grant is whichever is seen first, that Lease or the claim's status
// turning Held; the two must show the same epoch. Every waiter watches its
// own claim (a field selector on its name); only a claim that entered the
// queue at its head (shown Next), and a new claim until its status shows it
// Queued behind others, also watches the Lease by name, so a lock's Lease
// has O(1) watchers however many wait.
// A holder watches both, and is LOST the moment either stops showing its
// grant (the pair of claim UID and epoch), not only at its next renewal.
// It goes on with the watches it waited with (its claim's, and the Lease's
// when that showed the grant), so taking a grant costs one renewal and no
// read or new watch of the claim.
// Waits can be bounded on the server: Options.AcquireTimeout sets the
// claim's acquireTimeoutSeconds, so the authority ends a claim still waiting
// then even if its process crashed (ErrAcquireTimeout; the library deletes
// the ended claim), and TryAcquire asks once (AcquireTimeout 0). The
// authority decides a grant or a timeout, never both, and the library
// reports its decision: a grant that won the race against the deadline is a
// grant. A retry by request ID takes the claim it finds as it is; one with
// another acquireTimeoutSeconds (immutable) is an error.
// Renewals update only the exact lease identity (the claim UID on the backing
// Lease), resourceVersion-guarded. The safe time left is measured from when a
// renewal that was acknowledged was *sent*; below a margin the lease is
// SUSPECT (stop admitting work), at zero it is LOST, and so it is the moment
// the Lease names someone else or the claim turns Expired. Loss cancels the
// lease's context and closes Done().
//
// A semaphore lock (Options.MaxHolders N > 1, the claim's spec.maxHolders)
// admits up to N holders at once, each with a permit of its own epoch. The
// grant is then the lock's Lease's permit entry naming the claim's UID (the
// epoch is the entry's); the holder renews the permit's own Lease
// (Lease.RenewalLease, LOCK-permit-EPOCH), resourceVersion-guarded, only
// while the lock's Lease still shows the entry, and is LOST when the entry
// is gone, names its claim with another epoch, or the permit's Lease is
// deleted (a Lease not created yet right after the grant is waited for, up
// to RenewInterval), as well as on the claim's Expired.
//
// Several locks are taken together with AcquireAll, always in one order
// every caller shares (AcquisitionOrder: sorted by name), so two callers
// whose sets overlap cannot deadlock; the Set it returns ends, its context
// cancelled, as soon as any of its leases is lost, and Release releases them
// all in reverse order. A lock it cannot take releases the ones it took.
//
// Checking the state before a write is never enough (a pause can fall between
// the check and the write); the epoch stamped on the write is what makes the
// object refuse it. Update maps that refusal to ErrStaleEpoch.
package lease

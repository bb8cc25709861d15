package lease

// State is where a lease is in the holder's state machine.
type State string

// States.
const (
	Idle      State = "IDLE"
	Acquiring State = "ACQUIRING"
	Held      State = "HELD"
	// Suspect: the safe time left is below the margin; stop admitting work
	// while the renewal is resolved.
	Suspect State = "SUSPECT"
	// Lost is final: the lease expired, the Lease names another holder, or the
	// claim was expired or deleted by someone else.
	Lost      State = "LOST"
	Releasing State = "RELEASING"
	Released  State = "RELEASED"
)

// Transition is one change of state, with why.
type Transition struct {
	// Lock is the lock whose lease changed state: one OnTransition serves
	// every lock of an AcquireAll.
	Lock     string
	From, To State
	Reason   string
}

// Package election is fenced leader election for the controllers people
// already run: a client-go resourcelock.Interface backed by a FencedLease,
// so each term of leadership is one grant with its own epoch, and a write
// gate that stamps the leader's epoch on every write to the objects the lock
// fences and refuses those writes once the term is SUSPECT or LOST.
//
// client-go's leader election decides leadership on the candidate's own
// clock and never fences: a leader that pauses past its lease keeps acting
// when it wakes. Here the authority (the fencekeeper manager) grants terms
// on its clock, the holder library declares LOST on the leader's clock by
// its safe time, and the fencing admission refuses a stale epoch at the
// object itself, whatever the old leader believes. A controller-runtime
// operator adopts it in a few lines:
//
//	lock, err := election.New(cfg, election.Config{Namespace: ns, Name: "my-operator"})
//	mgr, err := ctrl.NewManager(cfg, lock.ManagerOptions(ctrl.Options{Scheme: scheme}))
//
// Only writes to objects labelled fencekeeper.io/lock=<Name> in the lock's
// namespace are fenced; everything else passes through untouched, and side
// effects outside the apiserver need their own fence.
package election

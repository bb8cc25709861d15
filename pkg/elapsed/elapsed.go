// Package elapsed measures time since a moment the way a lease holder must:
// by the longer of the monotonic and the wall clock.
//
// Go's monotonic clock (CLOCK_MONOTONIC on Linux) does not advance while
// the machine is suspended (systemd suspend, a laptop lid, a VM saved and
// restored), so a holder that judged its safe time by it alone would wake
// up still believing it holds a lease the authority gave away meanwhile.
// The wall clock does advance across a suspend. A wall clock stepped
// forward makes the time look longer, which only ends a lease early (the
// safe direction); one stepped back is outvoted by the monotonic clock. A
// pause that stops both clocks (some hypervisors pause a VM that way)
// cannot be seen from inside.
package elapsed

import "time"

// Since is the time elapsed since t by the longer of the monotonic and the
// wall clock. t should come from time.Now in this process (it then carries
// a monotonic reading); without one, both are the wall clock.
func Since(t time.Time) time.Duration {
	return max(time.Since(t), time.Now().Round(0).Sub(t.Round(0)))
}

// Poll bounds how long a timer that waits for a safe time to run out may
// sleep at once: Go's timers run on the monotonic clock, so after a
// suspend they fire late by its length, and a loop that wakes at least
// this often sees the time Since reports within a second of the resume.
const Poll = time.Second

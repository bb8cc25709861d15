package proc

import (
	"os"
	"syscall"
	"time"
)

// Terminate sends p SIGTERM and waits for exited (cmd.Wait's result), killing
// p if it has not exited within grace. The Wait error is dropped: after
// SIGTERM or SIGKILL, "signal: terminated" or "signal: killed" is expected.
func Terminate(p *os.Process, exited <-chan error, grace time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(grace):
		_ = p.Kill()
		waitErr = <-exited
	}
	_ = waitErr
}

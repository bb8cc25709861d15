//go:build !linux

package fencecli

import "syscall"

// process is one process; other systems have no /proc to walk (nor a
// start time to tell a process from a later one given its ID).
type process struct{ pid int }

func processOf(pid int) (process, bool) { return process{pid: pid}, true }

// below returns the roots only.
func below(roots []process) []process { return roots }

func signalTree(tree []process, sig syscall.Signal) {
	for _, p := range tree {
		_ = syscall.Kill(p.pid, sig)
	}
}

// anyRunning: without /proc nothing is known to run.
func anyRunning([]process) bool { return false }

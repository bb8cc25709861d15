package fencecli

import "syscall"

// childProcAttr makes the kernel send sig to COMMAND if run itself dies
// (killed with SIGKILL, say): nothing renews its lease any more, and the
// command must stop rather than work on until its epoch is refused.
func childProcAttr(sig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: sig}
}

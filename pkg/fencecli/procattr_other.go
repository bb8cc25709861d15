//go:build !linux

package fencecli

import "syscall"

// childProcAttr: only Linux can signal a child when its parent dies.
func childProcAttr(syscall.Signal) *syscall.SysProcAttr { return nil }

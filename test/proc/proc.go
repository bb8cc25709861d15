// Package proc reads the Linux process table (/proc/PID/stat): a process
// and its state, and the children of a process. The test helpers use it to
// find the control plane processes envtest started and to tell when a
// process has exited.
package proc

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Proc is what /proc/PID/stat says of a process.
type Proc struct {
	Pid   int
	Comm  string // the executable's name, cut to 15 bytes by the kernel
	State string // "R", "S", "Z", ...
	Ppid  int
	// Fields are stat's fields from the state on (Fields[0] is State;
	// proc(5) numbers them from 3).
	Fields []string
}

// Pgrp is the process group (proc(5) field 5).
func (p Proc) Pgrp() int {
	if len(p.Fields) < 3 {
		return 0
	}
	g, _ := strconv.Atoi(p.Fields[2])
	return g
}

// StartTime is when the process started, in clock ticks after boot (field
// 22): with the pid, it names one process, even after the pid is reused.
func (p Proc) StartTime() string {
	if len(p.Fields) < 20 {
		return ""
	}
	return p.Fields[19]
}

// Zombie: the process has exited and waits for its parent to reap it.
func (p Proc) Zombie() bool { return p.State == "Z" }

// ReadProc reads /proc/PID/stat; ok is false when there is no such process.
func ReadProc(pid int) (p Proc, ok bool) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Proc{}, false
	}
	// "PID (COMM) STATE PPID ...": COMM may itself hold spaces and ")".
	open, closing := bytes.IndexByte(raw, '('), bytes.LastIndexByte(raw, ')')
	if open < 0 || closing < open {
		return Proc{}, false
	}
	f := strings.Fields(string(raw[closing+1:]))
	if len(f) < 2 {
		return Proc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return Proc{}, false
	}
	return Proc{Pid: pid, Comm: string(raw[open+1 : closing]), State: f[0], Ppid: ppid, Fields: f}, true
}

// Running: pid is still the process p (same executable name and start
// time) and has not exited. A pid reused since is not p.
func (p Proc) Running() bool {
	now, ok := ReadProc(p.Pid)
	return ok && now.Comm == p.Comm && now.StartTime() == p.StartTime() && !now.Zombie()
}

// Children lists the processes whose parent is ppid, zombies left out.
func Children(ppid int) ([]Proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := ReadProc(pid); ok && p.Ppid == ppid && !p.Zombie() {
			out = append(out, p)
		}
	}
	return out, nil
}

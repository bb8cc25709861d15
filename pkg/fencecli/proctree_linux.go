package fencecli

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// process is one process, known by its ID and its start time (clock ticks
// after boot), so that a signal meant for it never reaches a later process
// that was given the same ID.
type process struct {
	pid   int
	start string
}

// processTree returns root and every process below it, read from /proc:
// what a command started (a shell script's programs) holds the epoch too,
// and must stop with it.
func processTree(root int) []process {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []process{{pid: root, start: startTime(root)}}
	}
	children := map[int][]process{}
	var self *process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, start, _, ok := readStat(pid)
		if !ok {
			continue
		}
		p := process{pid: pid, start: start}
		if pid == root {
			self = &p
		}
		children[ppid] = append(children[ppid], p)
	}
	if self == nil {
		return nil // root is gone
	}
	tree := []process{*self}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i].pid]...)
	}
	return tree
}

// signalTree sends sig to each process still running as the one recorded.
func signalTree(tree []process, sig syscall.Signal) {
	for _, p := range tree {
		if p.running() {
			_ = syscall.Kill(p.pid, sig)
		}
	}
}

// anyRunning reports whether a process of tree still runs (not a zombie).
func anyRunning(tree []process) bool {
	for _, p := range tree {
		if p.running() {
			return true
		}
	}
	return false
}

func (p process) running() bool {
	_, start, state, ok := readStat(p.pid)
	return ok && start == p.start && state != "Z"
}

func startTime(pid int) string {
	_, start, _, _ := readStat(pid)
	return start
}

// readStat reads a process's parent ID, start time and state from
// /proc/<pid>/stat (fields 4, 22 and 3; the command name, field 2, may hold
// spaces and parentheses, so fields are counted from after its closing one).
func readStat(pid int) (ppid int, start, state string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", "", false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, "", "", false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0, "", "", false
	}
	if ppid, err = strconv.Atoi(fields[1]); err != nil {
		return 0, "", "", false
	}
	return ppid, fields[19], fields[0], true
}

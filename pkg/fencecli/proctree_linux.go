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

// processOf returns the process that has pid now.
func processOf(pid int) (process, bool) {
	_, start, _, ok := readStat(fmt.Sprintf("/proc/%d/stat", pid))
	return process{pid: pid, start: start}, ok
}

// is reports whether p's ID still belongs to p.
func (p process) is() bool {
	now, ok := processOf(p.pid)
	return ok && now == p
}

// below returns the processes of roots that still run as recorded and
// every process below them, read from /proc: what a command started (a
// shell script's programs) holds the epoch too, and must stop with it.
func below(roots []process) []process {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return roots
	}
	children := map[int][]process{}
	current := map[process]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, start, _, ok := readStat("/proc/" + e.Name() + "/stat")
		if !ok {
			continue
		}
		p := process{pid: pid, start: start}
		current[p] = true
		children[ppid] = append(children[ppid], p)
	}
	var tree []process
	seen := map[process]bool{}
	for _, r := range roots {
		if current[r] && !seen[r] {
			seen[r] = true
			tree = append(tree, r)
		}
	}
	for i := 0; i < len(tree); i++ {
		for _, c := range children[tree[i].pid] {
			if !seen[c] {
				seen[c] = true
				tree = append(tree, c)
			}
		}
	}
	return tree
}

// signalTree sends sig to each process of tree whose ID is still its own.
func signalTree(tree []process, sig syscall.Signal) {
	for _, p := range tree {
		if p.is() {
			_ = syscall.Kill(p.pid, sig)
		}
	}
}

// anyRunning reports whether a process of tree still runs: a thread of it
// that has not exited (a process whose main thread has ended shows as a
// zombie while its other threads run on).
func anyRunning(tree []process) bool {
	for _, p := range tree {
		if !p.is() {
			continue
		}
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.pid))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			if _, _, state, ok := readStat(fmt.Sprintf("/proc/%d/task/%s/stat", p.pid, t.Name())); ok && state != "Z" && state != "X" {
				return true
			}
		}
	}
	return false
}

// readStat reads a parent ID, start time and state from a /proc stat file
// (fields 4, 22 and 3; the command name, field 2, may hold spaces and
// parentheses, so fields are counted from after its closing one).
func readStat(path string) (ppid int, start, state string, ok bool) {
	b, err := os.ReadFile(path)
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

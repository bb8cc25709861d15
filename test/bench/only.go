// BENCH_ONLY: run some steps alone (a comma-separated list of stepNames),
// for repeated runs of one figure. The control plane, the warm-up and the
// floor always run, since every ratio needs the floor.
package main

import (
	"fmt"
	"slices"
	"strings"
)

// stepNames are the steps BENCH_ONLY can name, in the order they run.
var stepNames = []string{"grant", "handoff", "etcd-mutex", "resync", "steady", "takeover", "graceful", "throughput", "admission", "semaphore", "cel", "staleness", "scale"}

// steps is the set BENCH_ONLY chose; nil runs every step.
type steps map[string]bool

func parseOnly(v string) (steps, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	s := steps{}
	for _, n := range strings.Split(v, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(stepNames, n) {
			return nil, fmt.Errorf("BENCH_ONLY=%q: unknown step %q (steps: %s)", v, n, strings.Join(stepNames, ", "))
		}
		s[n] = true
	}
	return s, nil
}

func (s steps) want(name string) bool { return s == nil || s[name] }

// names is the chosen steps in run order; nil for a full run.
func (s steps) names() []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, n := range stepNames {
		if s[n] {
			out = append(out, n)
		}
	}
	return out
}

// What the requests themselves cost: the mean time kube-apiserver spent
// serving each kind of request during a phase (its own
// apiserver_request_duration_seconds), and the requests a grant and a
// handoff cannot do without, summed, as a ratio to the floor's own request
// (PUT leases) served in the floor step. Diagnostic, no goal: it shows how
// much of a latency goal the requests alone take up before any watch
// delivers anything (report key request_cost_ms).
package main

import (
	"fmt"
	"slices"
	"strings"
)

// The requests without which there is no grant on a new lock (the claim's
// create, the free Lease's create, the guarded Lease update that grants,
// the claim's status), none on a lock whose Lease exists (the same without
// the create) and no handoff (the holder's delete, the guarded Lease
// update, the next claim's status); floorRequest is the floor's one
// request. A phase's PUT leases include its floor samples' (one per
// sample, the same request on a plain Lease).
var (
	grantNewChain      = []string{"POST fencedleases", "POST leases", "PUT leases", "PATCH fencedleases/status"}
	grantExistingChain = []string{"POST fencedleases", "PUT leases", "PATCH fencedleases/status"}
	handoffChain       = []string{"DELETE fencedleases", "PUT leases", "PATCH fencedleases/status"}
)

const (
	floorRequest = "PUT leases"
	// statusPatch is the status write a holder learns of its grant from
	// today; a holder that learned it from the Lease would not wait for it
	// (DESIGN question 12).
	statusPatch = "PATCH fencedleases/status"
)

// requestTimes is kube-apiserver's running totals per request kind ("VERB
// resource" or "VERB resource/subresource"; watches left out): seconds
// spent serving, requests served.
type requestTimes map[string]struct{ sum, count float64 }

func (c *cluster) requestTimes() requestTimes {
	out := requestTimes{}
	add := func(count bool) func(map[string]string, float64) {
		return func(l map[string]string, v float64) {
			if l["dry_run"] != "" || l["verb"] == "WATCH" {
				return
			}
			k := l["verb"] + " " + l["resource"]
			if s := l["subresource"]; s != "" {
				k += "/" + s
			}
			e := out[k]
			if count {
				e.count += v
			} else {
				e.sum += v
			}
			out[k] = e
		}
	}
	c.eachApiserverSample(map[string]func(map[string]string, float64){
		"apiserver_request_duration_seconds_sum":   add(false),
		"apiserver_request_duration_seconds_count": add(true),
	})
	return out
}

// requestCostMS is the mean server time, in ms, of each request kind served
// between a and b.
func requestCostMS(a, b requestTimes) map[string]float64 {
	out := map[string]float64{}
	for k, e := range b {
		if n := e.count - a[k].count; n > 0 {
			out[k] = round2((e.sum - a[k].sum) / n * 1000)
		}
	}
	return out
}

// costAround runs f and returns the request costs while it ran.
func costAround(cl *cluster, f func() error) (map[string]float64, error) {
	before := cl.requestTimes()
	if err := f(); err != nil {
		return nil, err
	}
	return requestCostMS(before, cl.requestTimes()), nil
}

// chainMS sums the phase's mean server time of each request in chain,
// leaving out the skipped ones; 0 when one was not served in the phase.
func chainMS(r report, phase string, chain []string, skip ...string) float64 {
	sum := 0.0
	for _, k := range chain {
		if slices.Contains(skip, k) {
			continue
		}
		ms, ok := r.RequestCostMS[phase][k]
		if !ok {
			return 0
		}
		sum += ms
	}
	return sum
}

// floorServerMS is the floor's request as the apiserver timed it in the
// floor phase; 0 when it was not measured.
func floorServerMS(r report) float64 { return r.RequestCostMS["floor"][floorRequest] }

// chainText prints a chain's terms and sum, and the floor's request.
func chainText(phase string, chain []string, skip ...string) func(report) string {
	return func(r report) string {
		var terms []string
		for _, k := range chain {
			if !slices.Contains(skip, k) {
				terms = append(terms, fmt.Sprintf("%s %.2f", k, r.RequestCostMS[phase][k]))
			}
		}
		return fmt.Sprintf("%s = %.2f ms vs the floor's %s %.2f ms", strings.Join(terms, " + "),
			chainMS(r, phase, chain, skip...), floorRequest, floorServerMS(r))
	}
}

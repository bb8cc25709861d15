// Where a phase's time goes: the CPU each process used during it (on these
// 2 cores, a sum near 2 means the phase is CPU-bound, well below it means
// it waits), and the lock controller's reconciles, queue waits and API
// calls from the manager's own metrics. Reported for the throughput phase,
// to say what bounds grants/s.
package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencekeeper/fencekeeper/test/fault"
	"github.com/fencekeeper/fencekeeper/test/proc"
)

// breakdown is one phase's figures (report key throughput_breakdown).
type breakdown struct {
	WallS float64 `json:"wall_s"`
	// CoresUsed: CPU seconds over wall seconds, per process.
	CoresUsed map[string]float64 `json:"cores_used"`
	// LockReconciles and their mean time; LockWorkersBusy the share of the
	// phase the controller's workers spent reconciling (near 1: they are
	// what bounds it); the mean wait of a lock in the controller's queue;
	// the manager's API requests.
	LockReconciles         float64 `json:"lock_reconciles"`
	LockReconcileMeanMS    float64 `json:"lock_reconcile_mean_ms"`
	LockWorkersBusy        float64 `json:"lock_workers_busy"`
	LockQueueWaitMeanMS    float64 `json:"lock_queue_wait_mean_ms"`
	ManagerAPICalls        float64 `json:"manager_api_calls"`
	ApiserverRequestsPerS  float64 `json:"apiserver_requests_per_s"`
	ApiserverMutationsPerS float64 `json:"apiserver_mutations_per_s"`
	// Requests: what kube-apiserver served during the phase, per kind
	// ("VERB resource[/subresource]", watches left out), and the mean
	// server time of each (ms): which requests a cycle makes, and which
	// cost the time.
	Requests      map[string]float64 `json:"requests"`
	RequestMeanMS map[string]float64 `json:"request_mean_ms"`
}

// snapshot is the counters a breakdown is the difference of.
type snapshot struct {
	at  time.Time
	cpu map[string]float64
	m   map[string]float64
	req requestTimes
}

// metricSum is a manager metric to sum under key: every sample of name
// whose labels contain label ("" for any sample).
type metricSum struct{ key, name, label string }

// metricSums are the manager metrics a breakdown reads.
var metricSums = []metricSum{
	{"reconcile_sum", "controller_runtime_reconcile_time_seconds_sum", `controller="lock"`},
	{"reconcile_count", "controller_runtime_reconcile_time_seconds_count", `controller="lock"`},
	{"queue_sum", "workqueue_queue_duration_seconds_sum", `name="lock"`},
	{"queue_count", "workqueue_queue_duration_seconds_count", `name="lock"`},
	{"api_count", "rest_client_requests_total", ""},
}

func (c *cluster) snapshot() snapshot {
	s := snapshot{at: time.Now(), cpu: map[string]float64{}, m: map[string]float64{}}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if p, err := fault.FindControlPlaneProcess(name, io.Discard); err == nil {
			s.cpu[name] = procCPUSeconds(p.Pid())
		}
	}
	s.cpu["manager"] = procCPUSeconds(c.manager.Process.Pid)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.cpu["bench client"] = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	for k, v := range c.managerSums(metricSums) {
		s.m[k] = v
	}
	all, mut := c.apiserverRequests()
	s.m["apiserver_requests"], s.m["apiserver_mutations"] = all, mut
	s.req = c.requestTimes()
	return s
}

// managerSums scrapes the manager's /metrics once and sums the samples of
// each of sums under its key (nil when the metrics cannot be read).
func (c *cluster) managerSums(sums []metricSum) map[string]float64 {
	resp, err := http.Get("http://" + c.metrics + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		for _, ms := range sums {
			if strings.HasPrefix(line, ms.name+"{") && strings.Contains(line, ms.label) {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				out[ms.key] += v
			}
		}
	}
	return out
}

// drainLockQueue waits until the lock controller's queue is empty
// (workqueue_depth) on two readings 100 ms apart, at most max; it returns
// how long that took.
func (c *cluster) drainLockQueue(max time.Duration) (time.Duration, error) {
	start := time.Now()
	empty := 0
	for time.Since(start) < max {
		m := c.managerSums([]metricSum{{"depth", "workqueue_depth", `name="lock"`}})
		if d, ok := m["depth"]; ok && d == 0 {
			if empty++; empty == 2 {
				return time.Since(start), nil
			}
		} else {
			empty = 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("the lock controller's queue was not empty within %v", max)
}

// apiserverRequests sums apiserver_request_total: every request, and the
// mutating ones.
func (c *cluster) apiserverRequests() (all, mutating float64) {
	c.eachRequestTotal(func(l map[string]string, v float64) {
		all += v
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
			mutating += v
		}
	})
	return all, mutating
}

// procCPUSeconds is a process's user + system CPU time (clock ticks of
// 1/100 s, as Linux reports them to user space).
func procCPUSeconds(pid int) float64 {
	p, ok := proc.ReadProc(pid)
	if !ok || len(p.Fields) < 13 {
		return 0
	}
	// utime and stime: proc(5) fields 14 and 15.
	ut, _ := strconv.ParseFloat(p.Fields[11], 64)
	st, _ := strconv.ParseFloat(p.Fields[12], 64)
	return (ut + st) / 100
}

// since is the breakdown of the phase between a and b.
func since(a, b snapshot, workers int) breakdown {
	wall := b.at.Sub(a.at).Seconds()
	d := func(k string) float64 { return b.m[k] - a.m[k] }
	mean := func(sum, count string) float64 {
		if d(count) == 0 {
			return 0
		}
		return round2(d(sum) / d(count) * 1000)
	}
	out := breakdown{WallS: round2(wall), CoresUsed: map[string]float64{},
		LockReconciles: d("reconcile_count"), LockReconcileMeanMS: mean("reconcile_sum", "reconcile_count"),
		LockQueueWaitMeanMS: mean("queue_sum", "queue_count"),
		LockWorkersBusy:     round2(d("reconcile_sum") / wall / float64(workers)), ManagerAPICalls: d("api_count"),
		ApiserverRequestsPerS: round2(d("apiserver_requests") / wall), ApiserverMutationsPerS: round2(d("apiserver_mutations") / wall)}
	for k, v := range b.cpu {
		out.CoresUsed[k] = round2((v - a.cpu[k]) / wall)
	}
	out.Requests = map[string]float64{}
	for k, e := range b.req {
		if n := e.count - a.req[k].count; n > 0 {
			out.Requests[k] = n
		}
	}
	out.RequestMeanMS = requestCostMS(a.req, b.req)
	return out
}

// Scale: `claims` claims over `locks` locks created with `conc` workers,
// until every lock has one Held claim and the rest are Pending; then the
// manager's RSS (VmRSS) and whether every grant was correct (one Held per
// lock, at its first epoch).
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// scale: claims over locks (claims/locks per lock), all granted or queued;
// returns the manager's RSS and whether every grant was correct.
func scale(ctx context.Context, c client.WithWatch, cl *cluster, claims, locks, conc int) (float64, bool, string, error) {
	ns, err := newNS(ctx, c, "scale")
	if err != nil {
		return 0, false, "", err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := 0; i < claims; i++ {
		g.Go(func() error {
			return c.Create(gctx, claim(ns, "c"+strconv.Itoa(i), "lock-"+strconv.Itoa(i%locks), 3600))
		})
	}
	if err := g.Wait(); err != nil {
		return 0, false, "", err
	}
	// Grants go at tens per second on a new lock (its ledger's first read):
	// allow for that at the curve's largest steps.
	deadline := time.Now().Add(max(10*time.Minute, time.Duration(locks)*50*time.Millisecond))
	for {
		var list fkv1.FencedLeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0, false, "", err
		}
		held, pending := 0, 0
		heldPerLock := map[string]int{}
		badEpoch := 0
		for _, it := range list.Items {
			switch it.Status.Phase {
			case fkv1.PhaseHeld:
				held++
				heldPerLock[it.Spec.LockName]++
				// A lock's first grant is at the storage revision: a
				// positive epoch, one per lock (checked below).
				if it.Status.Epoch < 1 {
					badEpoch++
				}
			case fkv1.PhasePending:
				pending++
			}
		}
		if held+pending == claims && held == locks {
			correct := badEpoch == 0
			for _, n := range heldPerLock {
				if n != 1 {
					correct = false
				}
			}
			time.Sleep(2 * time.Second)
			return cl.rssMiB(), correct, fmt.Sprintf("%d held (one per lock, first epochs: %v), %d queued", held, correct, pending), nil
		}
		if time.Now().After(deadline) {
			return 0, false, "", fmt.Errorf("after %v: %d held, %d pending of %d", time.Since(deadline.Add(-max(10*time.Minute, time.Duration(locks)*50*time.Millisecond))).Round(time.Second), held, pending, claims)
		}
		time.Sleep(time.Second)
	}
}

// scalePoint is one step of the scale curve.
type scalePoint struct {
	// Claims and Locks in the whole cluster at this point (earlier steps'
	// and earlier measurements' included), counted.
	Claims     int     `json:"claims"`
	Locks      int     `json:"locks"`
	RSSMiB     float64 `json:"rss_mib"`
	GrantsPerS float64 `json:"grants_per_s"`
	// HandoffP99MS: the tail of 10 one-waiter handoffs, so their max (as
	// a p99 of 10 always was).
	HandoffP99MS float64 `json:"handoff_p99_ms"`
	// QueueDrainS: from the step's last grant seen to the lock
	// controller's queue first empty (its reconciles of the step's
	// waiting claims' statuses).
	QueueDrainS float64 `json:"queue_drain_s"`
	// HandoffBehindBacklogMaxMS: the max of 10 one-waiter handoffs timed
	// right after the step, before the queue drained (-1: one failed).
	HandoffBehindBacklogMaxMS float64 `json:"handoff_behind_backlog_max_ms"`
	Correct                   bool    `json:"all_grants_correct"`
	// Error: why the point's handoffs could not be timed (the curve
	// stopped there).
	Error string `json:"error,omitempty"`
}

// scaleCurve adds claims in steps (two per lock) until the cluster holds
// each target, and after each step reports the manager's RSS, the step's
// grants/s (its locks over the time from the first create to the last
// grant) and the max of 10 one-waiter handoffs at that size, timed once
// the lock controller's queue has drained.
func scaleCurve(ctx context.Context, c client.WithWatch, cl *cluster, targets []int) ([]scalePoint, error) {
	var points []scalePoint
	for _, target := range targets {
		var all fkv1.FencedLeaseList
		if err := c.List(ctx, &all); err != nil {
			return points, err
		}
		add := target - len(all.Items)
		if add < 2 {
			continue
		}
		start := time.Now()
		var rss float64
		correct, locksAdded := true, 0
		// The manager deletes earlier steps' Expired claims after their
		// retention, some of them while the step runs: it tops up (a few
		// rounds at most) until the cluster holds the target when the RSS
		// is read.
		for round := 0; add > 0 && round < 3; round++ {
			n := max(add+add%2, 2) // two per lock
			r, ok, _, err := scale(ctx, c, cl, n, n/2, 32)
			if err != nil {
				return points, fmt.Errorf("scale curve at %d claims: %w", target, err)
			}
			rss, correct, locksAdded = r, correct && ok, locksAdded+n/2
			// The size the RSS was read at: before the handoffs below,
			// whose holders' claims are deleted.
			if err := c.List(ctx, &all); err != nil {
				return points, err
			}
			add = target - len(all.Items)
		}
		elapsed := time.Since(start)
		locks := map[string]bool{}
		for _, it := range all.Items {
			locks[it.Namespace+"/"+it.Spec.LockName] = true
		}
		// Handoffs right after the step, while the lock controller still
		// works through the step's backlog (reported), then at that size:
		// once its queue has drained (how long that took is reported).
		backlogMax := -1.0
		if hb, err := measureHandoff(ctx, c, cl, 1, 10, ""); err == nil {
			backlogMax = hb.held.Max
		} else {
			fmt.Fprintf(os.Stderr, "    %d claims: a handoff behind the step's backlog failed: %v\n", target, err)
		}
		drained, err := cl.drainLockQueue(5 * time.Minute)
		if err != nil {
			fmt.Fprintf(os.Stderr, "    %d claims: %v\n", target, err)
			return append(points, scalePoint{Claims: target, RSSMiB: round2(rss), GrantsPerS: round2(float64(locksAdded) / elapsed.Seconds()),
				HandoffBehindBacklogMaxMS: round2(backlogMax), Correct: correct, Error: err.Error()}), nil
		}
		h, err := measureHandoff(ctx, c, cl, 1, 10, "")
		if err != nil {
			// Reported as the point's error: the curve stops there, the
			// rest of the report is kept.
			p := scalePoint{Claims: target, RSSMiB: round2(rss), GrantsPerS: round2(float64(locksAdded) / elapsed.Seconds()),
				QueueDrainS: round2(drained.Seconds()), Correct: correct, Error: "handoff: " + err.Error()}
			fmt.Fprintf(os.Stderr, "    %d claims: RSS %.1f MiB, %.0f grants/s, queue drained in %.1f s, handoff failed: %v\n",
				target, p.RSSMiB, p.GrantsPerS, p.QueueDrainS, err)
			return append(points, p), nil
		}
		p := scalePoint{Claims: len(all.Items), Locks: len(locks), RSSMiB: round2(rss),
			GrantsPerS: round2(float64(locksAdded) / elapsed.Seconds()), QueueDrainS: round2(drained.Seconds()), HandoffBehindBacklogMaxMS: round2(backlogMax), HandoffP99MS: h.held.tail(), Correct: correct}
		fmt.Fprintf(os.Stderr, "    %d claims / %d locks: RSS %.1f MiB, %.0f grants/s, handoff behind the step's backlog max %.1f ms, queue drained in %.1f s, handoff max %.1f ms, correct=%v\n",
			p.Claims, p.Locks, p.RSSMiB, p.GrantsPerS, p.HandoffBehindBacklogMaxMS, p.QueueDrainS, p.HandoffP99MS, p.Correct)
		points = append(points, p)
	}
	return points, nil
}

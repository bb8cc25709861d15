package main

import (
	"math"
	"sort"
	"time"
)

// latency is a p50/p99 pair in milliseconds.
type latency struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	N   int     `json:"n"`
}

func summarize(d []time.Duration) latency {
	if len(d) == 0 {
		return latency{P50: math.NaN(), P99: math.NaN()}
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		if i < 0 {
			i = 0
		}
		return float64(s[i].Microseconds()) / 1000
	}
	return latency{P50: q(0.50), P99: q(0.99), N: len(s)}
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

package main

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// minP99N is the fewest samples a p99 is taken from (DESIGN §7 rev. 3);
// with fewer, the figure's tail is its maximum, reported as such.
const minP99N = 200

// latency is a figure's distribution in milliseconds: p50, p99 (only from
// minP99N samples or more; absent below), min and max.
type latency struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99,omitempty"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
	N   int     `json:"n"`
}

func summarize(d []time.Duration) latency {
	if len(d) == 0 {
		return latency{P50: math.NaN(), P99: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		if i < 0 {
			i = 0
		}
		return ms(s[i])
	}
	l := latency{P50: q(0.50), Min: ms(s[0]), Max: ms(s[len(s)-1]), N: len(s)}
	if l.N >= minP99N {
		l.P99 = q(0.99)
	}
	return l
}

// onMax is true when the figure's tail is its maximum (too few samples
// for a p99).
func (l latency) onMax() bool { return l.N < minP99N }

// tail is the p99, or the maximum below minP99N samples.
func (l latency) tail() float64 {
	if l.onMax() {
		return l.Max
	}
	return l.P99
}

func latText(l latency) string {
	if l.onMax() {
		return fmt.Sprintf("p50 %.2f / max %.2f (n=%d)", l.P50, l.Max, l.N)
	}
	return fmt.Sprintf("p50 %.2f / p99 %.2f (n=%d)", l.P50, l.P99, l.N)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func round2(f float64) float64 { return math.Round(f*100) / 100 }

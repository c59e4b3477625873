package bench

import (
	"slices"
	"time"
)

// Dist summarises a set of latencies, in milliseconds.
type Dist struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Mean float64 `json:"mean_ms"`
	Max  float64 `json:"max_ms"`
}

// distOf computes the nearest-rank percentiles of lat.
func distOf(lat []time.Duration) Dist {
	if len(lat) == 0 {
		return Dist{}
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	q := func(p float64) float64 {
		i := int(p*float64(len(s))+0.999999) - 1 // nearest rank
		return ms(s[min(max(i, 0), len(s)-1)])
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Dist{N: len(s), P50: q(0.50), P90: q(0.90), P99: q(0.99), Mean: ms(sum / time.Duration(len(s))), Max: ms(s[len(s)-1])}
}

// median of a few samples.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

package bench

import (
	"testing"
	"time"
)

func TestDistOf(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	d := distOf(lat)
	if d.N != 100 || d.P50 != 50 || d.P90 != 90 || d.P99 != 99 || d.Max != 100 || d.Mean != 50.5 {
		t.Errorf("distOf(1..100 ms) = %+v", d)
	}
	if d := distOf([]time.Duration{3 * time.Millisecond}); d.P50 != 3 || d.P99 != 3 {
		t.Errorf("one sample: %+v", d)
	}
	if d := distOf(nil); d.N != 0 {
		t.Errorf("no sample: %+v", d)
	}
	if m := median([]float64{3, 1, 2, 10}); m != 2.5 {
		t.Errorf("median = %v", m)
	}
}

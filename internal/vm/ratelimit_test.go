package vm

import (
	"testing"
	"time"
)

// TestBucket: a flood gets the burst, then one answer per period; a quiet
// period refills up to the burst and no further; a clock step backwards
// gives nothing away.
func TestBucket(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newBucket(limit{burst: 4, every: time.Second})
	count := func(from time.Time, n int, step time.Duration) int {
		got := 0
		for i := range n {
			if b.allow(from.Add(time.Duration(i) * step)) {
				got++
			}
		}
		return got
	}
	if got := count(t0, 10000, 0); got != 4 {
		t.Errorf("10000 requests at one instant: %d answered, want the burst (4)", got)
	}
	// 10 s of a flood at 1000/s: 10 more tokens.
	if got := count(t0.Add(time.Millisecond), 10000, time.Millisecond); got != 10 {
		t.Errorf("a 10 s flood at 1000/s: %d answered, want 10 (one a second)", got)
	}
	// An hour of silence refills the burst only.
	if got := count(t0.Add(time.Hour), 100, 0); got != 4 {
		t.Errorf("after an hour of silence, a burst of 100: %d answered, want 4", got)
	}
	if got := count(t0, 100, 0); got != 0 {
		t.Errorf("with the clock stepped back an hour: %d answered, want 0", got)
	}
	if got := count(t0.Add(time.Hour+time.Second), 1, 0); got != 1 {
		t.Errorf("a second after the last answer: %d answered, want 1", got)
	}
}

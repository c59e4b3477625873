package sandbox

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestBackgroundStartsDuringWait: Close waits for ended calls' background
// work while calls still running end and start more; a sync.WaitGroup
// panics then ("reused before previous Wait has returned"). Every
// function started before a Wait returns has finished by then.
func TestBackgroundStartsDuringWait(t *testing.T) {
	// The window is narrow: a sync.WaitGroup here panicked in about one
	// round of 30 to 100.
	for range 300 {
		backgroundRound(t)
	}
}

func backgroundRound(t *testing.T) {
	var b background
	var started, finished atomic.Int64
	var starters sync.WaitGroup
	for range 8 {
		starters.Go(func() {
			for range 500 {
				started.Add(1)
				b.Go(func() { finished.Add(1) })
			}
		})
	}
	done := make(chan struct{})
	go func() { starters.Wait(); close(done) }()
	waits := 0
	for running := true; running; waits++ {
		select {
		case <-done:
			running = false
		default:
		}
		b.Wait()
	}
	if s, f := started.Load(), finished.Load(); s != 8*500 || s != f {
		t.Fatalf("started %d, finished %d when the last Wait returned (%d Waits)", s, f, waits)
	}
}

package controller

import (
	"testing"
	"time"
)

func TestReservations(t *testing.T) {
	var s reservations
	now := time.Unix(1000, 0)
	pick := func(cached, taken []uint32, want uint32, wantOK bool) {
		t.Helper()
		got, ok := s.pick("p", 8, cached, taken, now)
		if got != want || ok != wantOK {
			t.Fatalf("pick(cached %v, taken %v) = %d, %v; want %d, %v", cached, taken, got, ok, want, wantOK)
		}
	}
	pick([]uint32{1, 0}, nil, 2, true)         // lowest not cached
	pick([]uint32{1, 0}, nil, 3, true)         // 2 is reserved by the first pick
	pick([]uint32{0, 1}, []uint32{4}, 5, true) // 4 taken
	if got, _ := s.pick("q", 8, nil, nil, now); got != 0 {
		t.Fatalf("another pool: picked %d, want 0", got)
	}

	s.release("p", 3, now) // no block made: 3 is free again
	pick([]uint32{0, 1}, nil, 3, true)

	s.settle("p", 2, now) // block 2 made, not in the cache yet: still held
	pick([]uint32{0, 1}, nil, 4, true)
	// The cache shows block 2 and it is deleted at once: the reservation
	// went when the cache showed it, so 2 is free when the cache drops it.
	pick([]uint32{0, 1, 2}, nil, 6, true)
	pick([]uint32{0, 1}, nil, 2, true)

	// A settled index whose block the cache never shows is held until
	// settleHold has passed.
	s.settle("p", 7, now)
	s.release("p", 2, now)
	s.release("p", 3, now)
	s.release("p", 4, now)
	s.release("p", 5, now)
	s.release("p", 6, now)
	pick([]uint32{0, 1, 2, 3, 4, 5, 6}, nil, 0, false) // 7 held: exhausted
	now = now.Add(settleHold)
	pick([]uint32{0, 1, 2, 3, 4, 5, 6}, nil, 7, true)

	// A recorded index two reconciles hold stays held until both let go.
	s.hold("q", 3)
	s.hold("q", 3)
	s.release("q", 3, now)
	if got, _ := s.pick("q", 8, []uint32{0, 1, 2}, nil, now); got != 4 {
		t.Fatalf("index held once more: picked %d, want 4", got)
	}
	s.release("q", 3, now)
	if got, _ := s.pick("q", 8, []uint32{0, 1, 2}, nil, now); got != 3 {
		t.Fatalf("index let go: picked %d, want 3", got)
	}
}

package controller

import (
	"slices"
	"sync"
	"time"
)

// settleHold is how long an index stays reserved after its block was
// made, waiting for the block to show in the cache. The cache is usually
// a few milliseconds behind; past this, the API server's name uniqueness
// still guards the index.
const settleHold = 30 * time.Second

// reservations are the block indices this process's workers are carving
// or have just carved, per pool. They keep two workers from choosing one
// index while the cache has not seen either block: without them, the
// loser would spend a status write and a refused create to learn it.
// Only an optimisation across processes: the block's name is the guard.
// The zero value is ready to use.
type reservations struct {
	mu    sync.Mutex
	pools map[string]map[uint32]*reservation
}

type reservation struct {
	busy  int       // reconciles working on the index now
	until time.Time // after the last one made the block: held until then
}

// held reports whether r still keeps its index from others at now.
func (r *reservation) held(now time.Time) bool {
	return r.busy > 0 || now.Before(r.until)
}

// pick returns the lowest index below n that is neither in cached (the
// indices of the pool's blocks the cache holds, in any order) nor in
// taken nor reserved, and reserves it. Reservations of blocks the cache
// now holds, or whose hold ran out, are dropped. ok is false when every
// index is used.
func (s *reservations) pick(pool string, n uint32, cached, taken []uint32, now time.Time) (idx uint32, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.poolLocked(pool)
	used := slices.Grow(slices.Clone(cached), len(taken)+len(res))
	for _, i := range cached {
		if r := res[i]; r != nil && r.busy == 0 {
			delete(res, i) // the cache has it now
		}
	}
	for i, r := range res {
		if !r.held(now) {
			delete(res, i)
			continue
		}
		used = append(used, i)
	}
	used = append(used, taken...)
	slices.Sort(used)
	var next uint64
	for _, u := range used {
		if uint64(u) > next {
			break
		}
		if uint64(u) == next {
			next++
		}
	}
	if next >= uint64(n) {
		return 0, false
	}
	idx = uint32(next)
	res[idx] = &reservation{busy: 1}
	return idx, true
}

// hold reserves idx of pool for a reconcile that found it recorded in its
// request; it is released or settled like one pick returned.
func (s *reservations) hold(pool string, idx uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.poolLocked(pool)
	r := res[idx]
	if r == nil {
		r = &reservation{}
		res[idx] = r
	}
	r.busy++
}

// release ends a reconcile's hold on idx without a block made: the index
// is free again unless someone else holds it.
func (s *reservations) release(pool string, idx uint32, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.poolLocked(pool)
	if r := res[idx]; r != nil {
		r.busy = max(r.busy-1, 0)
		if !r.held(now) {
			delete(res, idx)
		}
	}
}

// settle ends a reconcile's hold on idx whose block exists: the index
// stays reserved until the cache shows the block or settleHold passes.
func (s *reservations) settle(pool string, idx uint32, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.poolLocked(pool)
	r := res[idx]
	if r == nil {
		r = &reservation{}
		res[idx] = r
	}
	r.busy = max(r.busy-1, 0)
	r.until = now.Add(settleHold)
}

func (s *reservations) poolLocked(pool string) map[uint32]*reservation {
	if s.pools == nil {
		s.pools = map[string]map[uint32]*reservation{}
	}
	res := s.pools[pool]
	if res == nil {
		res = map[uint32]*reservation{}
		s.pools[pool] = res
	}
	return res
}

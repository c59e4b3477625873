package sandbox

import (
	"context"
	"fmt"
	"sync"
)

// DefaultMaxParallel is the Runner's cap on calls running at once when the
// caller sets none.
const DefaultMaxParallel = 8

// Caller runs one Spec to completion; *Sandbox is the real one.
type Caller interface {
	Run(ctx context.Context, spec Spec) (*Result, error)
}

// Runner orders calls: calls with different keys (pods: the container UUID)
// run in parallel, calls with the same key run one at a time in the order
// Run was called, and at most maxParallel run at all. A call waiting for its
// turn holds no slot of the cap. The zero value is not usable; use
// NewRunner.
type Runner struct {
	c   Caller
	sem chan struct{}

	mu sync.Mutex
	// tails holds, per key, the channel the last queued call closes when
	// it is done; the next call for the key waits on it. An entry lives
	// only while a call for its key is queued or running.
	tails map[string]chan struct{}

	// queued, when set (tests), is called once a call has its place in
	// its key's queue.
	queued func(key string)
}

// NewRunner returns a Runner over c allowing maxParallel calls at once
// (DefaultMaxParallel when maxParallel <= 0).
func NewRunner(c Caller, maxParallel int) *Runner {
	if maxParallel <= 0 {
		maxParallel = DefaultMaxParallel
	}
	return &Runner{c: c, sem: make(chan struct{}, maxParallel), tails: map[string]chan struct{}{}}
}

// Run waits for key's earlier calls and for a free slot, then runs spec.
// If ctx ends while it waits, it returns ctx's error without running, and
// the calls queued behind it still wait for the ones before it.
func (r *Runner) Run(ctx context.Context, key string, spec Spec) (*Result, error) {
	// Step 1: take a place in the key's queue.
	done := make(chan struct{})
	r.mu.Lock()
	prev := r.tails[key]
	r.tails[key] = done
	r.mu.Unlock()
	if r.queued != nil {
		r.queued(key)
	}
	release := func() {
		close(done)
		r.mu.Lock()
		if r.tails[key] == done {
			delete(r.tails, key)
		}
		r.mu.Unlock()
	}

	// Step 2: wait for the call before it. Giving up must not let the
	// next call overtake that one: hand our place over once it is done.
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			go func() {
				<-prev
				release()
			}()
			return nil, fmt.Errorf("wait for earlier calls of %q: %w", key, ctx.Err())
		}
	}
	defer release()

	// Step 3: a slot under the global cap.
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a free slot: %w", ctx.Err())
	}
	defer func() { <-r.sem }()
	return r.c.Run(ctx, spec)
}

// pending is the number of keys with a call queued or running.
func (r *Runner) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tails)
}

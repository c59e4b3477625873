package sandbox

import (
	"context"
	"fmt"

	"github.com/skeinnet/skein/internal/keylock"
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
	// keys orders the calls of one key (first come, first served).
	keys keylock.Locks

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
	return &Runner{c: c, sem: make(chan struct{}, maxParallel)}
}

// Run waits for key's earlier calls and for a free slot, then runs spec.
// If ctx ends while it waits, it returns ctx's error without running, and
// the calls queued behind it still wait for the ones before it.
func (r *Runner) Run(ctx context.Context, key string, spec Spec) (*Result, error) {
	place := r.keys.Queue(key)
	if r.queued != nil {
		r.queued(key)
	}
	if err := place.Wait(ctx); err != nil {
		return nil, err
	}
	defer place.Unlock()
	// A slot under the global cap: a call waiting for its turn holds none.
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a free slot: %w", ctx.Err())
	}
	defer func() { <-r.sem }()
	return r.c.Run(ctx, spec)
}

// pending is the number of keys with a call queued or running.
func (r *Runner) pending() int { return r.keys.Len() }

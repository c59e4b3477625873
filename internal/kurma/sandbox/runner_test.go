package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeCaller records which calls run at once and in what order each key's
// calls start; a call blocks until its release channel (if any) closes.
type fakeCaller struct {
	mu      sync.Mutex
	running int
	max     int
	order   map[string][]string
	overlap []string
	active  map[string]bool
	hold    time.Duration
}

func (f *fakeCaller) Run(ctx context.Context, s Spec) (*Result, error) {
	key, name := s.Args[0], s.Args[1]
	f.mu.Lock()
	f.running++
	f.max = max(f.max, f.running)
	if f.active[key] {
		f.overlap = append(f.overlap, name)
	}
	f.active[key] = true
	f.order[key] = append(f.order[key], name)
	f.mu.Unlock()
	time.Sleep(f.hold)
	f.mu.Lock()
	f.running--
	f.active[key] = false
	f.mu.Unlock()
	return &Result{}, nil
}

// submit starts n calls one after another, each once the previous one has
// its place in its queue, so "the order Run was called" is known, and
// returns their errors.
func submit(t testing.TB, r *Runner, n int, call func(i int) (context.Context, string, Spec)) []error {
	t.Helper()
	placed := make(chan struct{})
	r.queued = func(string) { placed <- struct{}{} }
	defer func() { r.queued = nil }()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ctx, key, spec := call(i)
		wg.Go(func() { _, errs[i] = r.Run(ctx, key, spec) })
		<-placed
	}
	wg.Wait()
	return errs
}

// TestRunnerOrderAndCap: 20 calls over 5 keys with a cap of 4 never run
// more than 4 at once, run each key's calls one at a time in submission
// order, and still run different keys in parallel.
func TestRunnerOrderAndCap(t *testing.T) {
	f := &fakeCaller{order: map[string][]string{}, active: map[string]bool{}, hold: 20 * time.Millisecond}
	r := NewRunner(f, 4)
	errs := submit(t, r, 20, func(i int) (context.Context, string, Spec) {
		key := fmt.Sprintf("pod-%d", i%5)
		return context.Background(), key, Spec{Args: []string{key, fmt.Sprintf("call-%02d", i)}}
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if f.max > 4 || f.max < 2 {
		t.Errorf("at most %d calls ran at once; want 2..4 (cap 4, parallel across keys)", f.max)
	}
	if len(f.overlap) > 0 {
		t.Errorf("calls overlapping another of their key: %v", f.overlap)
	}
	for k := range 5 {
		key := fmt.Sprintf("pod-%d", k)
		var want []string
		for i := k; i < 20; i += 5 {
			want = append(want, fmt.Sprintf("call-%02d", i))
		}
		if !slices.Equal(f.order[key], want) {
			t.Errorf("%s ran %v, want %v", key, f.order[key], want)
		}
	}
	if n := r.pending(); n != 0 {
		t.Errorf("%d keys still tracked after every call returned", n)
	}
}

// TestRunnerCancelWhileQueued: a call whose context ends while it waits
// returns the context's error without running, and the call queued behind
// it does not overtake the one before it.
func TestRunnerCancelWhileQueued(t *testing.T) {
	f := &fakeCaller{order: map[string][]string{}, active: map[string]bool{}, hold: 150 * time.Millisecond}
	r := NewRunner(f, 1)
	short, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	bg := context.Background()
	ctxs := []context.Context{bg, short, bg}
	names := []string{"first", "gives-up", "third"}
	errs := submit(t, r, 3, func(i int) (context.Context, string, Spec) {
		return ctxs[i], "p", Spec{Args: []string{"p", names[i]}}
	})
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], context.DeadlineExceeded) {
		t.Fatalf("errors %v; want nil, deadline exceeded, nil", errs)
	}
	if !slices.Equal(f.order["p"], []string{"first", "third"}) || len(f.overlap) > 0 {
		t.Errorf("ran %v (overlaps %v), want [first third] one at a time", f.order["p"], f.overlap)
	}
	if n := r.pending(); n != 0 {
		t.Errorf("%d keys still tracked", n)
	}
}

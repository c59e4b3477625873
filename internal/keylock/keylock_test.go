package keylock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestNoEntryOutlivesItsHolders: after many distinct keys have been locked
// and released, sequentially and concurrently, no entry remains.
func TestNoEntryOutlivesItsHolders(t *testing.T) {
	var k Locks
	for i := range 10000 {
		k.Lock(fmt.Sprintf("net/ctr-%d/eth0", i))()
	}
	if n := k.Len(); n != 0 {
		t.Fatalf("after 10000 keys locked and released one by one, %d entries remain; want 0", n)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 500 {
				k.Lock(fmt.Sprintf("net/ctr-%d/eth0", (g*500+i)%700))()
			}
		})
	}
	wg.Wait()
	if n := k.Len(); n != 0 {
		t.Fatalf("after 16 goroutines locked and released 8000 keys, %d entries remain; want 0", n)
	}
}

// TestMutualExclusion: goroutines contending for a few keys never hold one
// key together (the plain counters below would also trip -race), and
// holders of different keys are not serialised.
func TestMutualExclusion(t *testing.T) {
	var k Locks
	const keys, goroutines, rounds = 4, 32, 200
	var inside, total [keys]int
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				key := (g + i) % keys
				unlock := k.Lock(fmt.Sprint("key-", key))
				inside[key]++
				if inside[key] != 1 {
					t.Errorf("key %d held by %d goroutines at once", key, inside[key])
				}
				total[key]++
				inside[key]--
				unlock()
			}
		})
	}
	wg.Wait()
	sum := 0
	for _, n := range total {
		sum += n
	}
	if sum != goroutines*rounds {
		t.Errorf("%d critical sections ran, want %d", sum, goroutines*rounds)
	}
	if n := k.Len(); n != 0 {
		t.Errorf("%d entries remain after every holder released; want 0", n)
	}

	// Another key is free while one is held.
	unlockA := k.Lock("a")
	done := make(chan struct{})
	go func() {
		k.Lock("b")()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("locking key b waited for the holder of key a")
	}
	// The same key waits; its entry stays while the waiter waits.
	got := make(chan struct{})
	go func() {
		unlock := k.Lock("a")
		close(got)
		unlock()
	}()
	select {
	case <-got:
		t.Fatal("a second holder got key a while the first held it")
	case <-time.After(50 * time.Millisecond):
	}
	if n := k.Len(); n != 1 {
		t.Errorf("with key a held and awaited, %d entries; want 1", n)
	}
	unlockA()
	<-got
	if n := k.Len(); n != 0 {
		t.Errorf("%d entries remain; want 0", n)
	}
}

// Holders take a key in the order they queued for it, and one that gives
// up (its context ends) lets nobody overtake: the place behind it waits
// for the one before it.
func TestFIFOAndGivingUp(t *testing.T) {
	var k Locks
	first := k.Queue("a")
	if err := first.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	quitter := k.Queue("a")
	third := k.Queue("a")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := quitter.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with an ended context: %v, want context.Canceled", err)
	}
	got := make(chan struct{})
	go func() {
		_ = third.Wait(context.Background())
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("the third place got the key while the first still held it")
	case <-time.After(50 * time.Millisecond):
	}
	first.Unlock()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the third place never got the key after the first let go")
	}
	third.Unlock()
	third.Unlock() // a second Unlock does nothing
	if n := k.Len(); n != 0 {
		t.Fatalf("%d keys tracked after every place is done", n)
	}
}

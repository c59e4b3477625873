// Package keylock serialises work per key (an attachment, a container, a
// pod's plugin calls) without one lock shared by every key. Holders of a
// key take it in the order they asked (first come, first served), a
// waiter can give up when its context ends without letting the ones
// behind it overtake the ones before it, and an entry lives only while
// someone holds or waits for its key, so a daemon that sees millions of
// distinct keys over its life keeps no more entries than it has
// operations in flight.
package keylock

import (
	"context"
	"fmt"
	"sync"
)

// Locks is a set of FIFO locks, one per key, made on first use and dropped
// when the last holder unlocks with nobody waiting. The zero value is
// ready to use; a Locks must not be copied after first use.
type Locks struct {
	mu sync.Mutex
	// tails holds, per key, the channel the last place in line closes
	// when it is done; the next place waits on it.
	tails map[string]chan struct{}
}

// Place is one place in a key's line (Queue); Wait for it, then Unlock.
type Place struct {
	k    *Locks
	key  string
	prev chan struct{} // closed when the place before this one is done
	done chan struct{} // closed when this one is done
	once sync.Once
}

// Lock blocks until the caller holds key and returns the function that
// releases it. Call that function exactly once.
func (k *Locks) Lock(key string) (unlock func()) {
	p := k.Queue(key)
	_ = p.Wait(context.Background()) // never ends early
	return p.Unlock
}

// Queue takes the next place in key's line, at once: whoever calls Queue
// later for key holds it after this place is done.
func (k *Locks) Queue(key string) *Place {
	p := &Place{k: k, key: key, done: make(chan struct{})}
	k.mu.Lock()
	if k.tails == nil {
		k.tails = map[string]chan struct{}{}
	}
	p.prev = k.tails[key]
	k.tails[key] = p.done
	k.mu.Unlock()
	return p
}

// Wait blocks until the places before p are done: the caller then holds
// the key until Unlock. If ctx ends first, Wait returns its error and the
// place is given up (Unlock is not needed then); the places behind it
// still wait for the ones before it.
func (p *Place) Wait(ctx context.Context) error {
	if p.prev == nil {
		return nil
	}
	select {
	case <-p.prev:
		return nil
	case <-ctx.Done():
		go func() {
			<-p.prev
			p.Unlock()
		}()
		return fmt.Errorf("wait for earlier holders of %q: %w", p.key, ctx.Err())
	}
}

// Unlock ends p: the next place in line holds the key. Calls after the
// first do nothing.
func (p *Place) Unlock() {
	p.once.Do(func() {
		close(p.done)
		p.k.mu.Lock()
		if p.k.tails[p.key] == p.done {
			delete(p.k.tails, p.key)
		}
		p.k.mu.Unlock()
	})
}

// Len is the number of keys someone holds or waits for.
func (k *Locks) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.tails)
}

// Package keylock serialises work per key (an attachment, a container)
// without one lock shared by every key. An entry lives only while someone
// holds or waits for its key, so a daemon that sees millions of distinct
// keys over its life keeps no more entries than it has operations in
// flight.
package keylock

import "sync"

// Locks is a set of mutexes, one per key, made on first use and dropped
// when the last holder unlocks with nobody waiting. The zero value is
// ready to use; a Locks must not be copied after first use.
type Locks struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	mu sync.Mutex
	// refs counts the holder and the waiters; guarded by Locks.mu.
	refs int
}

// Lock blocks until the caller holds key and returns the function that
// releases it. Call that function exactly once.
func (k *Locks) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e := k.m[key]
	if e == nil {
		e = &entry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// Len is the number of keys someone holds or waits for.
func (k *Locks) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

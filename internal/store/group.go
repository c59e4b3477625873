package store

import (
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// groupCommit runs write transactions the way a database's group commit
// does. A writer that finds no commit under way commits its own change at
// once, in a transaction of its own. Writers that arrive while a commit is
// under way queue; when it is done, the first of them is handed the whole
// queue and commits it in one transaction (one pair of fsyncs for all),
// then hands on whatever queued meanwhile. A lone writer never waits for
// company, unlike with bbolt's Batch, which holds every call up to
// MaxBatchDelay; under concurrency the fsyncs, and the time each writer
// spends behind the others, no longer add up per write; and no writer
// commits more than its own group, so none is kept committing for others.
//
// The changes must be safe to run again (functions of the transaction
// only): if one of a group fails, the group is rolled back and each of its
// changes is committed alone, so each writer gets its own result and no
// failure takes the others down with it.
type groupCommit struct {
	db      *bolt.DB
	commits *atomic.Uint64 // counts the transactions committed
	mu      sync.Mutex
	busy    bool          // a group is being committed
	pending []*groupWrite // changes queued for the next group
}

type groupWrite struct {
	fn   func(*bolt.Tx) error
	done chan groupResult
}

// groupResult is what a queued writer is told: its change's result, or
// (lead non-nil) that it is to commit lead, whose first change is its own.
type groupResult struct {
	err  error
	lead []*groupWrite
}

// update commits fn and returns its result, as db.Update would.
func (g *groupCommit) update(fn func(*bolt.Tx) error) error {
	w := &groupWrite{fn: fn}
	g.mu.Lock()
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		return g.lead([]*groupWrite{w})
	}
	w.done = make(chan groupResult, 1)
	g.pending = append(g.pending, w)
	g.mu.Unlock()
	r := <-w.done
	if r.lead != nil {
		return g.lead(r.lead)
	}
	return r.err
}

// lead commits group, whose first change is the caller's, tells the others
// their results, hands what queued meanwhile to the first of it, and
// returns the caller's result.
func (g *groupCommit) lead(group []*groupWrite) error {
	errs := g.commit(group)
	for i, w := range group[1:] {
		w.done <- groupResult{err: errs[i+1]}
	}
	g.mu.Lock()
	next := g.pending
	g.pending = nil
	g.busy = len(next) > 0
	g.mu.Unlock()
	if len(next) > 0 {
		next[0].done <- groupResult{lead: next}
	}
	return errs[0]
}

// commit runs the changes of group in one transaction, or each alone if
// any of them fails, and returns each one's result.
func (g *groupCommit) commit(group []*groupWrite) []error {
	errs := make([]error, len(group))
	if len(group) == 1 {
		errs[0] = update(g.db, g.commits, group[0].fn)
		return errs
	}
	err := update(g.db, g.commits, func(tx *bolt.Tx) error {
		for _, w := range group {
			if err := w.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		for i, w := range group {
			errs[i] = update(g.db, g.commits, w.fn)
		}
	}
	return errs
}

// update is db.Update counting each committed transaction in n.
func update(db *bolt.DB, n *atomic.Uint64, fn func(*bolt.Tx) error) error {
	return db.Update(func(tx *bolt.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		tx.OnCommit(func() { n.Add(1) })
		return nil
	})
}

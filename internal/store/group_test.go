package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func openGroup(t *testing.T) *groupCommit {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "g.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	return &groupCommit{db: db, commits: new(atomic.Uint64)}
}

// put is a change that records key and the transaction it ran in.
func put(key string, txs *sync.Map) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		txs.Store(key, tx.ID())
		return tx.Bucket([]byte("b")).Put([]byte(key), []byte("v"))
	}
}

// holdFirst makes the next commit wait until release is closed, once it
// has started, so that the writers after it queue.
func holdFirst(g *groupCommit, started chan<- struct{}, release <-chan struct{}) chan error {
	res := make(chan error, 1)
	go func() {
		res <- g.update(func(tx *bolt.Tx) error {
			close(started)
			<-release
			return tx.Bucket([]byte("b")).Put([]byte("first"), []byte("v"))
		})
	}()
	return res
}

// waitQueued waits until n writers are queued behind the running commit.
func waitQueued(t *testing.T, g *groupCommit, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		g.mu.Lock()
		q := len(g.pending)
		g.mu.Unlock()
		if q == n {
			return
		}
	}
	t.Fatalf("%d writers never queued", n)
}

// TestGroupCommitGathers: writers that arrive during a commit are committed
// together, in one transaction, when it ends; each gets its result and
// everything is stored.
func TestGroupCommitGathers(t *testing.T) {
	g := openGroup(t)
	started, release := make(chan struct{}), make(chan struct{})
	first := holdFirst(g, started, release)
	<-started
	var txs sync.Map
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.update(put(fmt.Sprint("k", i), &txs)) }()
	}
	waitQueued(t, g, len(errs))
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("first writer: %v", err)
	}
	ids := map[any]bool{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("writer %d: %v", i, err)
		}
		id, _ := txs.Load(fmt.Sprint("k", i))
		ids[id] = true
	}
	if len(ids) != 1 {
		t.Errorf("the 5 queued writes ran in %d transactions, want 1", len(ids))
	}
	_ = g.db.View(func(tx *bolt.Tx) error {
		for i := range errs {
			if tx.Bucket([]byte("b")).Get([]byte(fmt.Sprint("k", i))) == nil {
				t.Errorf("k%d not stored", i)
			}
		}
		return nil
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy || len(g.pending) != 0 {
		t.Errorf("after the last commit: busy %v, %d pending", g.busy, len(g.pending))
	}
}

// TestGroupCommitFailureIsolated: a change that fails in a group gets its
// error and leaves nothing behind; the others of its group still commit.
func TestGroupCommitFailureIsolated(t *testing.T) {
	g := openGroup(t)
	started, release := make(chan struct{}), make(chan struct{})
	first := holdFirst(g, started, release)
	<-started
	var txs sync.Map
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		fn := put(fmt.Sprint("k", i), &txs)
		if i == 1 {
			fn = func(tx *bolt.Tx) error {
				_ = tx.Bucket([]byte("b")).Put([]byte("half"), []byte("v")) // then fails
				return boom
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.update(fn) }()
		waitQueued(t, g, i+1)
	}
	close(release)
	wg.Wait()
	<-first
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], boom) {
		t.Fatalf("results %v, want nil, boom, nil", errs)
	}
	_ = g.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("b"))
		if b.Get([]byte("k0")) == nil || b.Get([]byte("k2")) == nil {
			t.Error("the good changes of the failed group were not committed")
		}
		if b.Get([]byte("half")) != nil {
			t.Error("the failed change left a write behind")
		}
		return nil
	})
}

// TestGroupCommitConcurrent: many writers at once, all through, none lost.
func TestGroupCommitConcurrent(t *testing.T) {
	g := openGroup(t)
	var txs sync.Map
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.update(put(fmt.Sprint("c", i), &txs)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	n := 0
	_ = g.db.View(func(tx *bolt.Tx) error { n = tx.Bucket([]byte("b")).Stats().KeyN; return nil })
	if n != 200 {
		t.Errorf("%d keys stored, want 200", n)
	}
}

// TestPutMetaGrouped: meta writes that arrive while a commit runs share
// the next one (pod networks' records are meta entries, one durable write
// before each attach's plugins run), and each is stored.
func TestPutMetaGrouped(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- s.group.update(func(tx *bolt.Tx) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	before := s.Commits()
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() { errs[i] = s.PutMeta(ctx, "pod", fmt.Sprint("p", i), []byte("rec")) })
	}
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(release) }) }
	defer func() { releaseAll(); wg.Wait() }() // writers that never queued end too
	waitQueued(t, &s.group, len(errs))
	releaseAll()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("writer %d: %v", i, err)
		}
		if v, err := s.GetMeta(ctx, "pod", fmt.Sprint("p", i)); err != nil || string(v) != "rec" {
			t.Errorf("p%d: %q, %v", i, v, err)
		}
	}
	// The held commit, then one for the six.
	if n := s.Commits() - before; n != 2 {
		t.Errorf("%d commits for the held one and six queued meta writes, want 2", n)
	}
}

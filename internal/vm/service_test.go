package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/internal/vm/handover"
)

// TestServiceLocksDoNotGrow: the per-attachment locks of the VM front door
// are dropped once released; they used to stay, one per key ever seen.
func TestServiceLocksDoNotGrow(t *testing.T) {
	s := &Service{}
	for i := range 1000 {
		unlock := s.lock(fmt.Sprintf("net/ctr-%d/eth0", i))
		unlock()
	}
	if n := s.locks.Len(); n != 0 {
		t.Errorf("after 1000 distinct keys locked and unlocked, %d lock entries remain; want 0", n)
	}
}

// pausingStore stops the first listing of VM records once it has read
// them, until the test lets it go: the window in which a DEL has decided
// that no other attachment of the container is left.
type pausingStore struct {
	store.Store
	once    sync.Once
	listed  chan struct{}
	release chan struct{}
}

func (p *pausingStore) ListMeta(ctx context.Context, kind string) (map[string][]byte, error) {
	m, err := p.Store.ListMeta(ctx, kind)
	if kind == metaKind {
		p.once.Do(func() {
			close(p.listed)
			<-p.release
		})
	}
	return m, err
}

// serviceOn is a Service over a real store in a temporary directory, with
// no daemon: enough for records and tokens (attachments without ports
// need no kernel).
func serviceOn(t *testing.T, st store.Store) *Service {
	t.Helper()
	return &Service{
		st: st, log: slog.New(slog.DiscardHandler), servers: map[string][]*Server{},
		tokens: tokens{secret: make([]byte, 32), dir: filepath.Join(t.TempDir(), "tokens")},
	}
}

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestTokenSurvivesConcurrentDelOnOtherNetwork: DEL of container C on
// network A races ADD of C on network B. Whatever the interleaving, C's
// token must exist afterwards, because B's attachment needs it. The test
// stops the DEL right after it has listed the records (B's not among
// them yet) and runs the ADD's record-then-token steps in that window;
// the DEL used to go on and remove the token B had just written.
func TestTokenSurvivesConcurrentDelOnOtherNetwork(t *testing.T) {
	ctx := context.Background()
	ps := &pausingStore{Store: openStore(t), listed: make(chan struct{}), release: make(chan struct{})}
	s := serviceOn(t, ps)
	const ctr = "ctr-c"
	onA := store.AttachmentKey{Network: "net-a", ContainerID: ctr, IfName: "eth0"}
	onB := store.AttachmentKey{Network: "net-b", ContainerID: ctr, IfName: "eth1"}

	// C is attached on A: record and token.
	if err := s.putRecord(ctx, record{Key: onA, NetNS: "/nonexistent"}); err != nil {
		t.Fatal(err)
	}
	if err := s.claimToken(ctr); err != nil {
		t.Fatal(err)
	}

	// DEL on A, stopped after it listed the records.
	delDone := make(chan error, 1)
	go func() { delDone <- s.detach(ctx, onA) }()
	select {
	case <-ps.listed:
	case err := <-delDone:
		t.Fatalf("DEL on A finished without listing the records (err %v): the test proves nothing", err)
	case <-time.After(10 * time.Second):
		t.Fatal("DEL on A never listed the records")
	}

	// ADD on B in that window: its record, then its token (as add does).
	addDone := make(chan error, 1)
	go func() {
		unlock := s.lock(onB.String())
		defer unlock()
		if err := s.putRecord(ctx, record{Key: onB, NetNS: "/nonexistent"}); err != nil {
			addDone <- err
			return
		}
		addDone <- s.claimToken(ctr)
	}()
	// The ADD either finishes (unsafe interleaving: the DEL removes the
	// token afterwards) or waits for the DEL; give it time to get there.
	var addErr error
	addFinished := false
	select {
	case addErr = <-addDone:
		addFinished = true
	case <-time.After(200 * time.Millisecond):
	}
	close(ps.release)
	if err := <-delDone; err != nil {
		t.Fatalf("DEL on A: %v", err)
	}
	if !addFinished {
		addErr = <-addDone
	}
	if addErr != nil {
		t.Fatalf("ADD on B: %v", addErr)
	}

	if _, found, _ := s.getRecord(ctx, onB); !found {
		t.Fatal("B's record is gone")
	}
	if _, err := os.Stat(handover.TokenPath(s.tokens.dir, ctr)); err != nil {
		t.Errorf("C still has a VM attachment on B, but its token is gone: %v", err)
	}

	// The last DEL removes it.
	if err := s.detach(ctx, onB); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(handover.TokenPath(s.tokens.dir, ctr)); !os.IsNotExist(err) {
		t.Errorf("after the last attachment of C is deleted its token should be gone; stat: %v", err)
	}
	if n := s.locks.Len() + s.containers.Len(); n != 0 {
		t.Errorf("%d lock entries remain", n)
	}
}

// TestGCLeavesAddsItCouldNotList: GC removes what the runtime's list left
// out, except what the list could not have held (as the main plugin's GC,
// Daemon.Collect): an attachment whose ADD is under way when GC comes (it
// waits for the ADD's lock, and used to tear down the ADD that had just
// succeeded), and one recorded again after GC came (an ADD after a DEL).
// A record from before, with no ADD under way, goes.
func TestGCLeavesAddsItCouldNotList(t *testing.T) {
	ctx := context.Background()
	s := serviceOn(t, openStore(t))
	s.d = quietHost{}
	key := func(id string) store.AttachmentKey {
		return store.AttachmentKey{Network: "net", ContainerID: id, IfName: "eth0"}
	}
	old := time.Now().Add(-time.Minute).UTC()
	for _, id := range []string{"adding", "again", "stale"} {
		if err := s.putRecord(ctx, record{Key: key(id), Created: old}); err != nil {
			t.Fatal(err)
		}
	}
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "net", "type": "skein-vm", "cni.dev/valid-attachments": []any{}})

	// An ADD of "adding" under way, and "again" locked by an ADD that
	// records it anew before GC gets the lock.
	s.mu.Lock()
	s.adding = map[string]int{key("adding").String(): 1}
	s.mu.Unlock()
	unlockAdding := s.lock(key("adding").String())
	unlockAgain := s.lock(key("again").String())
	done := make(chan error, 1)
	go func() {
		_, err := s.GC(ctx, &rpc.CNIRequest{Netconf: conf})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // GC has listed the records and waits
	if err := s.putRecord(ctx, record{Key: key("again"), Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	unlockAgain()
	s.mu.Lock()
	delete(s.adding, key("adding").String())
	s.mu.Unlock()
	unlockAdding()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"adding": true, "again": true, "stale": false} {
		if _, found, _ := s.getRecord(ctx, key(id)); found != want {
			t.Errorf("%s: record there after GC: %v, want %v", id, found, want)
		}
	}
}

// quietHost is a Host that only takes metrics.
type quietHost struct{ Host }

func (quietHost) Observe(string, string, uint, time.Duration) {}

package routing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
)

// fakeSource is a Source whose snapshot the test sets.
type fakeSource struct {
	mu      sync.Mutex
	snap    Snapshot
	changed chan struct{}
}

func newFakeSource(snap Snapshot) *fakeSource {
	return &fakeSource{snap: snap, changed: make(chan struct{}, 1)}
}

func (s *fakeSource) Snapshot(context.Context) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap, nil
}

func (s *fakeSource) Changed() <-chan struct{} { return s.changed }

func (s *fakeSource) set(snap Snapshot) {
	s.mu.Lock()
	s.snap = snap
	s.mu.Unlock()
	s.kick()
}

func (s *fakeSource) kick() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// fakeSyncer installs every remote whose node has an address, except the
// nodes in down; it fails while failures > 0.
type fakeSyncer struct {
	mu       sync.Mutex
	calls    []time.Time
	last     []Remote
	down     map[string]bool
	failures int
	synced   chan struct{}
}

func newFakeSyncer() *fakeSyncer {
	return &fakeSyncer{down: map[string]bool{}, synced: make(chan struct{}, 100)}
}

func (f *fakeSyncer) Sync(_ context.Context, remotes []Remote) ([]Status, error) {
	f.mu.Lock()
	defer func() {
		f.mu.Unlock()
		// Never block the loop: with a fast Resync nobody may be
		// counting (a blocked Sync would hang Run past its cancel).
		select {
		case f.synced <- struct{}{}:
		default:
		}
	}()
	f.calls = append(f.calls, time.Now())
	f.last = remotes
	if f.failures > 0 {
		f.failures--
		return nil, errors.New("netlink: no buffer space")
	}
	var out []Status
	for _, r := range remotes {
		s := Status{Remote: r}
		switch {
		case len(r.NodeAddrs) == 0:
			s.Reason = "node has no address"
		case f.down[r.Node]:
			s.Reason = fmt.Sprintf("node address %s is not on a directly connected network", r.NodeAddrs[0])
		default:
			s.Installed, s.Via = true, r.NodeAddrs[0]
		}
		out = append(out, s)
	}
	return out, nil
}

func (f *fakeSyncer) ncalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeSyncer) setDown(node string, down bool) {
	f.mu.Lock()
	f.down[node] = down
	f.mu.Unlock()
}

// waitSyncs waits for n more syncs.
func (f *fakeSyncer) waitSyncs(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-f.synced:
		case <-time.After(5 * time.Second):
			t.Fatalf("no sync within 5s (waited for %d, got %d)", n, i)
		}
	}
}

// freshSyncs waits for n syncs that end after the call; with n ≥ 3, at
// least one sync has started after the call and been reported on.
func (f *fakeSyncer) freshSyncs(t *testing.T, n int) {
	t.Helper()
	for {
		select {
		case <-f.synced:
			continue
		default:
		}
		break
	}
	f.waitSyncs(t, n)
}

// fakeEvents records the events.
type fakeEvents struct {
	mu  sync.Mutex
	got []string
}

func (e *fakeEvents) NodeWarning(n NodeInfo, reason, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, n.Name+" "+reason+": "+msg)
}

func (e *fakeEvents) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

func remote(block, node string, addrs ...string) Remote {
	r := Remote{Block: netip.MustParsePrefix(block), Name: "p-" + block, Node: node}
	for _, a := range addrs {
		r.NodeAddrs = append(r.NodeAddrs, netip.MustParseAddr(a))
	}
	return r
}

func snapOf(rs ...Remote) Snapshot {
	s := Snapshot{Remotes: rs, Nodes: map[string]NodeInfo{}}
	for _, r := range rs {
		s.Nodes[r.Node] = NodeInfo{Name: r.Node, UID: types.UID("uid-" + r.Node), Addrs: r.NodeAddrs}
	}
	return s
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func runLoop(t *testing.T, o LoopOptions) *Loop {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quietLogger()
	}
	l, err := NewLoop(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	})
	return l
}

func TestNewLoopNeedsSourceAndSyncer(t *testing.T) {
	if _, err := NewLoop(LoopOptions{Syncer: newFakeSyncer()}); err == nil {
		t.Error("NewLoop without a Source: no error")
	}
	if _, err := NewLoop(LoopOptions{Source: newFakeSource(Snapshot{})}); err == nil {
		t.Error("NewLoop without a Syncer: no error")
	}
}

// TestLoopSyncsAndKeepsStatuses: a sync at start, one per (coalesced)
// change, statuses sorted by block, metrics from the last sync.
func TestLoopSyncsAndKeepsStatuses(t *testing.T) {
	src := newFakeSource(snapOf(remote("10.1.0.32/27", "n2", "192.0.2.2"), remote("10.1.0.0/27", "n3")))
	sy := newFakeSyncer()
	l := runLoop(t, LoopOptions{Mode: ModeDirect, Source: src, Syncer: sy, Resync: time.Hour})
	sy.waitSyncs(t, 1)
	eventually(t, func() bool { _, synced := l.Statuses(); return synced })
	st, synced := l.Statuses()
	if !synced || len(st) != 2 || st[0].Block.String() != "10.1.0.0/27" || st[0].Installed || st[1].Node != "n2" || !st[1].Installed {
		t.Fatalf("statuses after the first sync: %+v (synced %v)", st, synced)
	}
	if l.Mode() != ModeDirect {
		t.Errorf("Mode = %s", l.Mode())
	}
	m := l.m
	eventually(t, func() bool { return testutil.ToFloat64(m.unreachable) == 1 })
	if v := testutil.ToFloat64(m.blocks.WithLabelValues("installed")); v != 1 {
		t.Errorf("installed blocks metric %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.blocks.WithLabelValues("missing")); v != 1 {
		t.Errorf("missing blocks metric %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.unreachable); v != 1 {
		t.Errorf("unreachable nodes metric %v, want 1", v)
	}

	// A burst of 200 changes makes a few syncs, not 200.
	before := sy.ncalls()
	for i := 0; i < 200; i++ {
		src.set(snapOf(remote(fmt.Sprintf("10.2.%d.0/24", i), "n2", "192.0.2.2")))
	}
	// The last sync has the last change's block.
	eventually(t, func() bool {
		sy.mu.Lock()
		defer sy.mu.Unlock()
		return len(sy.last) == 1 && sy.last[0].Block.String() == "10.2.199.0/24"
	})
	// A few syncs, not one per change (a stalled machine may split the
	// burst into a few more windows).
	if n := sy.ncalls() - before; n > 20 {
		t.Errorf("200 changes in a burst made %d syncs, want a few", n)
	}
	eventually(t, func() bool { return testutil.ToFloat64(m.unreachable) == 0 })
	if v := testutil.ToFloat64(m.syncs.WithLabelValues("ok")); int(v) != sy.ncalls() {
		t.Errorf("ok syncs metric %v, syncs %d", v, sy.ncalls())
	}
}

// TestLoopResync: without changes the loop syncs again every Resync.
func TestLoopResync(t *testing.T) {
	sy := newFakeSyncer()
	runLoop(t, LoopOptions{Source: newFakeSource(snapOf()), Syncer: sy, Resync: 30 * time.Millisecond})
	sy.waitSyncs(t, 4)
}

// TestLoopBackoff: failed syncs are retried with growing waits up to
// MaxBackoff, the statuses of the last good sync are kept meanwhile, and a
// success resets the backoff.
func TestLoopBackoff(t *testing.T) {
	src := newFakeSource(snapOf(remote("10.1.0.0/27", "n2", "192.0.2.2")))
	sy := newFakeSyncer()
	l := runLoop(t, LoopOptions{Source: src, Syncer: sy, Resync: time.Hour, MinBackoff: 40 * time.Millisecond, MaxBackoff: 400 * time.Millisecond})
	sy.waitSyncs(t, 1)
	fail := func(n int) []time.Time {
		sy.mu.Lock()
		sy.failures = n
		first := len(sy.calls)
		sy.mu.Unlock()
		src.kick()
		sy.waitSyncs(t, n+1) // n failures, then a success
		sy.mu.Lock()
		defer sy.mu.Unlock()
		return append([]time.Time(nil), sy.calls[first:]...)
	}
	calls := fail(5)
	// The waits after the failures: 40, 80, 160, 320, then 400 (the cap).
	for i, w := range []time.Duration{40, 80, 160, 320, 400} {
		got := calls[i+1].Sub(calls[i])
		if got < w*time.Millisecond*9/10 {
			t.Errorf("wait after failure %d: %v, want ≥ %v ms", i+1, got, w)
		}
	}
	// Uncapped, it would have been 640 ms.
	if got := calls[5].Sub(calls[4]); got > 600*time.Millisecond {
		t.Errorf("wait after failure 5: %v, want about the 400 ms cap", got)
	}
	eventually(t, func() bool { return testutil.ToFloat64(l.m.syncs.WithLabelValues("error")) == 5 })
	st, _ := l.Statuses()
	if len(st) != 1 || !st[0].Installed {
		t.Errorf("statuses after recovery: %+v", st)
	}
	// The success reset the backoff: the next failure waits MinBackoff
	// again, not the cap.
	eventually(t, func() bool { return testutil.ToFloat64(l.m.syncs.WithLabelValues("ok")) == 2 })
	calls = fail(1)
	if got := calls[1].Sub(calls[0]); got > 300*time.Millisecond {
		t.Errorf("a failure after recovery waited %v; the backoff was not reset (want about 40 ms, not the 400 ms cap)", got)
	}
}

// TestLoopReportsOncePerChange: a node whose blocks cannot be routed gets
// one Warning event and one log line per change of its state, not one per
// sync; export mode logs but sends no NodeUnreachable event; an invalid
// address annotation gets its own event, once.
func TestLoopReportsOncePerChange(t *testing.T) {
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	snap := snapOf(remote("10.1.0.0/27", "n2", "192.0.2.2"), remote("10.1.0.32/27", "n2", "192.0.2.2"), remote("10.1.0.64/27", "n3", "198.51.100.3"))
	n3 := snap.Nodes["n3"]
	n3.BadAnnotation = errors.New(`annotation skein.dev/node-address: node address "x": ParseAddr("x"): unable to parse IP`)
	snap.Nodes["n3"] = n3
	src := newFakeSource(snap)
	sy := newFakeSyncer()
	sy.setDown("n2", true)
	ev := &fakeEvents{}
	l := runLoop(t, LoopOptions{Mode: ModeDirect, Source: src, Syncer: sy, Events: ev, Logger: log, Resync: 10 * time.Millisecond,
		EventInterval: time.Nanosecond}) // TestLoopEventInterval checks the cap
	sy.waitSyncs(t, 5)
	eventually(t, func() bool { return len(ev.list()) >= 2 })
	time.Sleep(30 * time.Millisecond) // more syncs, which must not repeat the events
	got := ev.list()
	if len(got) != 2 {
		t.Fatalf("events after 5 syncs: %q, want one NodeUnreachable for n2 and one InvalidNodeAddress for n3", got)
	}
	for _, want := range []string{"n2 NodeUnreachable: 2 of 2 blocks of node n2 have no direct route", "n3 InvalidNodeAddress: annotation skein.dev/node-address"} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("events %q: none contains %q", got, want)
		}
	}
	if v := testutil.ToFloat64(l.m.unreachable); v != 1 {
		t.Errorf("unreachable nodes metric %v, want 1", v)
	}

	sy.setDown("n2", false)
	sy.freshSyncs(t, 3)
	sy.setDown("n2", true)
	sy.freshSyncs(t, 3)
	eventually(t, func() bool { return len(ev.list()) >= 3 })
	if got := ev.list(); len(got) != 3 || !strings.HasPrefix(got[2], "n2 NodeUnreachable") {
		t.Errorf("events after n2 recovered and failed again: %q, want a second NodeUnreachable", got)
	}
	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	if n := strings.Count(out, "remote node's blocks not routed"); n != 2 {
		t.Errorf("%d 'not routed' log lines, want 2 (one per change):\n%s", n, out)
	}
	if n := strings.Count(out, "routed again"); n != 1 {
		t.Errorf("%d 'routed again' log lines, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "node address annotation invalid"); n != 1 {
		t.Errorf("%d 'annotation invalid' log lines, want 1:\n%s", n, out)
	}
}

// TestLoopNoEventWithoutNode: blocks whose Node object is gone get no
// event (there is no object to put it on), only the log and metrics.
func TestLoopNoEventWithoutNode(t *testing.T) {
	snap := snapOf(remote("10.1.0.0/27", "gone"))
	delete(snap.Nodes, "gone")
	sy := newFakeSyncer()
	ev := &fakeEvents{}
	l := runLoop(t, LoopOptions{Mode: ModeVXLAN, Source: newFakeSource(snap), Syncer: sy, Events: ev, Resync: time.Hour})
	sy.waitSyncs(t, 1)
	eventually(t, func() bool { return testutil.ToFloat64(l.m.unreachable) == 1 })
	if got := ev.list(); len(got) != 0 {
		t.Errorf("events for a node without a Node object: %q", got)
	}
}

func TestLoopExportModeSendsNoUnreachableEvents(t *testing.T) {
	src := newFakeSource(snapOf(remote("10.1.0.0/27", "n2")))
	sy := newFakeSyncer()
	ev := &fakeEvents{}
	l := runLoop(t, LoopOptions{Mode: ModeExport, Source: src, Syncer: sy, Events: ev, Resync: time.Hour})
	sy.waitSyncs(t, 1)
	eventually(t, func() bool { return testutil.ToFloat64(l.m.blocks.WithLabelValues("missing")) == 1 })
	if got := ev.list(); len(got) != 0 {
		t.Errorf("export mode sent events %q", got)
	}
	if v := testutil.ToFloat64(l.m.blocks.WithLabelValues("missing")); v != 1 {
		t.Errorf("missing blocks metric %v, want 1", v)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// eventually waits up to 5 s for cond.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// BenchmarkLoopSync1000Nodes: one sync's own cost (statuses, per-node
// report, metrics) with 1,000 remote nodes of 3 dual-stack blocks each,
// through a fake kernel.
func BenchmarkLoopSync1000Nodes(b *testing.B) {
	var rs []Remote
	for n := 0; n < 1000; n++ {
		addr := netip.AddrFrom4([4]byte{10, 200, byte(n >> 8), byte(n)})
		for i := 0; i < 3; i++ {
			k := n*3 + i
			v4 := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(k >> 11), byte(k >> 3), byte(k << 5)}), 27)
			v6 := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 12: byte(k >> 11), 13: byte(k >> 3), 14: byte(k << 5)}), 123)
			node := fmt.Sprintf("node-%d", n)
			rs = append(rs, Remote{Block: v4, Name: fmt.Sprint(k), Node: node, NodeAddrs: []netip.Addr{addr}},
				Remote{Block: v6, Name: fmt.Sprint(k), Node: node, NodeAddrs: []netip.Addr{addr}})
		}
	}
	l, err := NewLoop(LoopOptions{Mode: ModeDirect, Source: newFakeSource(snapOf(rs...)), Syncer: newFakeSyncer(), Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	sy := l.o.Syncer.(*fakeSyncer)
	go func() {
		for range sy.synced {
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		if err := l.SyncNow(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// SyncNow (ListRoutes calls it in export mode) may run while Run syncs:
// the two must not report at the same time (the report state is one map
// per loop). Run with -race: it fails without the loop's sync lock.
func TestLoopSyncNowWhileRunning(t *testing.T) {
	src := newFakeSource(snapOf(remote("10.1.0.0/27", "n2", "192.0.2.2")))
	sy := newFakeSyncer()
	ev := &fakeEvents{}
	l := runLoop(t, LoopOptions{Mode: ModeExport, Source: src, Syncer: sy, Events: ev, Resync: time.Millisecond, Coalesce: time.Microsecond})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			if err := l.SyncNow(context.Background()); err != nil {
				t.Errorf("SyncNow: %v", err)
				return
			}
		}
	}()
	for i := 0; i < 200; i++ {
		node := fmt.Sprintf("n%d", 3+i%5)
		sy.setDown(node, i%2 == 0)
		src.set(snapOf(remote("10.1.0.0/27", "n2", "192.0.2.2"), remote(fmt.Sprintf("10.1.%d.0/27", 1+i%5), node, "192.0.2.9")))
	}
	<-done
	if _, synced := l.Statuses(); !synced {
		t.Error("no statuses after 200 syncs")
	}
}

// localSyncer is a fakeSyncer that is a LocalSetter; it refuses loopback
// addresses as the Kernel would.
type localSyncer struct {
	*fakeSyncer
	lmu  sync.Mutex
	sets [][]netip.Addr
}

func (s *localSyncer) SetLocalAddrs(addrs []netip.Addr) error {
	for _, a := range addrs {
		if a.IsLoopback() {
			return fmt.Errorf("loopback %s: %w", a, ErrInvalid)
		}
	}
	s.lmu.Lock()
	defer s.lmu.Unlock()
	s.sets = append(s.sets, addrs)
	return nil
}

func (s *localSyncer) lastSet() []netip.Addr {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if len(s.sets) == 0 {
		return nil
	}
	return s.sets[len(s.sets)-1]
}

// With SelfNode, a change of this node's address in the API reaches the
// Syncer before the next sync (it once stayed as read at start while peers
// moved to the new one); refused addresses keep the previous ones; without
// SelfNode (skeind --node-address) nothing is set.
func TestLoopFollowsSelfAddress(t *testing.T) {
	self := func(addr string) Snapshot {
		s := snapOf(remote("10.1.2.0/24", "n2", "192.0.2.2"))
		s.Nodes["n1"] = NodeInfo{Name: "n1", Addrs: []netip.Addr{netip.MustParseAddr(addr)}}
		return s
	}
	src := newFakeSource(self("192.0.2.1"))
	sy := &localSyncer{fakeSyncer: newFakeSyncer()}
	l, err := NewLoop(LoopOptions{Source: src, Syncer: sy, SelfNode: "n1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	step := func(addr, want string) {
		t.Helper()
		src.set(self(addr))
		if err := l.SyncNow(ctx); err != nil {
			t.Fatal(err)
		}
		if got := sy.lastSet(); len(got) != 1 || got[0].String() != want {
			t.Errorf("after this node's address became %s: Syncer's local %v, want %s", addr, got, want)
		}
	}
	step("192.0.2.1", "192.0.2.1")
	step("192.0.2.11", "192.0.2.11")
	step("127.0.0.1", "192.0.2.11")
	if n := len(sy.sets); n != 2 {
		t.Errorf("%d SetLocalAddrs calls, want 2 (unchanged addresses are not set again)", n)
	}

	fixed := &localSyncer{fakeSyncer: newFakeSyncer()}
	l, err = NewLoop(LoopOptions{Source: src, Syncer: fixed, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	src.set(self("192.0.2.12"))
	if err := l.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	if len(fixed.sets) != 0 {
		t.Errorf("without SelfNode the Syncer's local addresses were set: %v", fixed.sets)
	}
}

// TestLoopEventInterval: a node flapping between routed and not gets one
// NodeUnreachable event per EventInterval (default 1 h), not one per
// change — with many nodes split apart, every skeind would send one per
// remote node each time; logs still follow every change.
func TestLoopEventInterval(t *testing.T) {
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	src := newFakeSource(snapOf(remote("10.1.0.0/27", "n2", "192.0.2.2")))
	sy := newFakeSyncer()
	ev := &fakeEvents{}
	l, err := NewLoop(LoopOptions{Mode: ModeVXLAN, Source: src, Syncer: sy, Events: ev, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 3 {
		sy.setDown("n2", true)
		if err := l.SyncNow(ctx); err != nil {
			t.Fatal(err)
		}
		sy.setDown("n2", false)
		if err := l.SyncNow(ctx); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	if got := ev.list(); len(got) != 1 {
		t.Errorf("events for a node that went down 3 times within the hour: %q, want 1", got)
	}
	logMu.Lock()
	n := strings.Count(logs.String(), "remote node's blocks not routed")
	logMu.Unlock()
	if n != 3 {
		t.Errorf("%d 'not routed' log lines, want 3 (one per change)", n)
	}
}

// fakeUpdater is a fakeSyncer that is an Updater: Update installs what
// Sync would for the remotes given, and records the blocks it was asked
// for; it fails while updateFailures > 0 and wants a full sync while
// wantFull.
type fakeUpdater struct {
	*fakeSyncer
	umu            sync.Mutex
	updates        [][]netip.Prefix
	updateFailures int
	wantFull       bool
}

func (f *fakeUpdater) Update(ctx context.Context, blocks []netip.Prefix, remotes []Remote) ([]Status, error) {
	f.umu.Lock()
	defer f.umu.Unlock()
	if f.wantFull {
		return nil, ErrFullSync
	}
	f.updates = append(f.updates, slices.Clone(blocks))
	if f.updateFailures > 0 {
		f.updateFailures--
		return nil, errors.New("netlink: no buffer space")
	}
	f.fakeSyncer.mu.Lock()
	calls := f.calls
	f.fakeSyncer.mu.Unlock()
	st, err := f.fakeSyncer.Sync(ctx, remotes)
	f.fakeSyncer.mu.Lock()
	f.calls = calls // not a full sync
	f.fakeSyncer.mu.Unlock()
	return st, err
}

func (f *fakeUpdater) lastUpdate() []string {
	f.umu.Lock()
	defer f.umu.Unlock()
	if len(f.updates) == 0 {
		return nil
	}
	var out []string
	for _, p := range f.updates[len(f.updates)-1] {
		out = append(out, p.String())
	}
	return out
}

func (f *fakeUpdater) nupdates() int {
	f.umu.Lock()
	defer f.umu.Unlock()
	return len(f.updates)
}

// TestLoopIncremental: after the first (full) sync, a change hands the
// Updater only the blocks it touched — a block added, one deleted, every
// block of a node whose address changed, a block moving to another node
// — and no full sync runs; the statuses are those a full sync gives. A
// snapshot with no change for routes updates nothing. A failed update
// makes the next sync full, as does ErrFullSync; SyncNow is always full.
func TestLoopIncremental(t *testing.T) {
	base := []Remote{
		remote("10.1.0.0/27", "n2", "192.0.2.2"), remote("10.1.0.32/27", "n2", "192.0.2.2"),
		remote("10.1.0.64/27", "n3", "192.0.2.3"),
	}
	src := newFakeSource(snapOf(base...))
	sy := &fakeUpdater{fakeSyncer: newFakeSyncer()}
	l, err := NewLoop(LoopOptions{Mode: ModeDirect, Source: src, Syncer: sy, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.SyncChanges(ctx); err != nil { // nothing known yet: full
		t.Fatal(err)
	}
	if sy.ncalls() != 1 || sy.nupdates() != 0 {
		t.Fatalf("first sync: %d full syncs, %d updates; want 1, 0", sy.ncalls(), sy.nupdates())
	}
	step := func(name string, rs []Remote, want ...string) {
		t.Helper()
		full := sy.ncalls()
		src.set(snapOf(rs...))
		if err := l.SyncChanges(ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if sy.ncalls() != full {
			t.Errorf("%s: a full sync ran", name)
		}
		if got := sy.lastUpdate(); !slices.Equal(got, want) {
			t.Errorf("%s: updated %q, want %q", name, got, want)
		}
		// The statuses are a full sync's.
		ref := newFakeSyncer()
		wantSt, _ := ref.Sync(ctx, src.snap.Remotes)
		slices.SortFunc(wantSt, statusOrder)
		if got, _ := l.Statuses(); !slices.EqualFunc(got, wantSt, func(a, b Status) bool {
			return a.Block == b.Block && a.Name == b.Name && a.Node == b.Node && a.Installed == b.Installed && a.Via == b.Via
		}) {
			t.Errorf("%s: statuses %+v, want %+v", name, got, wantSt)
		}
	}
	added := append(slices.Clone(base), remote("10.1.0.96/27", "n3", "192.0.2.3"))
	step("block added", added, "10.1.0.96/27")
	step("block deleted", base, "10.1.0.96/27")
	moved := slices.Clone(base)
	moved[2] = remote("10.1.0.64/27", "n2", "192.0.2.2")
	moved[2].Name = base[2].Name
	step("block moved", moved, "10.1.0.64/27")
	readdr := slices.Clone(moved)
	for i := range readdr {
		readdr[i].NodeAddrs = []netip.Addr{netip.MustParseAddr("192.0.2.22")}
	}
	step("node address", readdr, "10.1.0.0/27", "10.1.0.32/27", "10.1.0.64/27")
	// Unsorted snapshots are sorted first: the same remotes in another
	// order are no change.
	n := sy.nupdates()
	src.set(snapOf(readdr[2], readdr[0], readdr[1]))
	if err := l.SyncChanges(ctx); err != nil || sy.nupdates() != n || sy.ncalls() != 1 {
		t.Errorf("no change: %v, %d updates (want %d), %d full syncs (want 1)", err, sy.nupdates(), n, sy.ncalls())
	}

	sy.umu.Lock()
	sy.updateFailures = 1
	sy.umu.Unlock()
	src.set(snapOf(base...))
	if err := l.SyncChanges(ctx); err == nil {
		t.Fatal("a failed update: no error")
	}
	if err := l.SyncChanges(ctx); err != nil || sy.ncalls() != 2 {
		t.Errorf("after a failed update: %v, %d full syncs; want the second", err, sy.ncalls())
	}
	sy.umu.Lock()
	sy.wantFull = true
	sy.umu.Unlock()
	src.set(snapOf(added...))
	if err := l.SyncChanges(ctx); err != nil || sy.ncalls() != 3 {
		t.Errorf("ErrFullSync: %v, %d full syncs; want 3", err, sy.ncalls())
	}
	if err := l.SyncNow(ctx); err != nil || sy.ncalls() != 4 {
		t.Errorf("SyncNow: %v, %d full syncs; want 4", err, sy.ncalls())
	}
}

// TestLoopRunIncremental: Run applies a change with Update, and still
// syncs fully every Resync.
func TestLoopRunIncremental(t *testing.T) {
	src := newFakeSource(snapOf(remote("10.1.0.0/27", "n2", "192.0.2.2")))
	sy := &fakeUpdater{fakeSyncer: newFakeSyncer()}
	runLoop(t, LoopOptions{Source: src, Syncer: sy, Resync: 300 * time.Millisecond, Coalesce: time.Millisecond})
	sy.waitSyncs(t, 1)
	src.set(snapOf(remote("10.1.0.0/27", "n2", "192.0.2.2"), remote("10.1.0.32/27", "n2", "192.0.2.2")))
	eventually(t, func() bool { return sy.nupdates() == 1 })
	if got := sy.lastUpdate(); !slices.Equal(got, []string{"10.1.0.32/27"}) || sy.ncalls() != 1 {
		t.Errorf("change: updated %q with %d full syncs; want 10.1.0.32/27 and 1", got, sy.ncalls())
	}
	eventually(t, func() bool { return sy.ncalls() >= 2 }) // the Resync
}

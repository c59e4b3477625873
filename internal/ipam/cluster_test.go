package ipam

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/store"
)

// clusterFake is a ClusterStore over the embedded store, for pure tests
// of the Manager's rules (internal/kubestore tests the real one against
// a real API server). Blocks of other nodes are claimed in the same file
// under their names; lost marks blocks the "API" took away; pools
// overrides a pool's definition (edited, re-created, deleted); claims
// records every index asked for; hold, when set, blocks ClaimBlock until
// it is closed, and holding (if set) is told when a claim starts waiting.
type clusterFake struct {
	*store.Bolt
	mu      sync.Mutex
	lost    map[uint32]bool
	pools   map[string]*store.Pool // nil value: deleted
	claims  []uint32
	hold    chan struct{}
	holding chan struct{}
	changed func(string)
}

func (c *clusterFake) Owns(pool string, index uint32, node string) bool {
	c.mu.Lock()
	lost := c.lost[index]
	c.mu.Unlock()
	if lost {
		return false
	}
	bs, _ := c.Bolt.ListBlocks(context.Background(), pool)
	return slices.ContainsFunc(bs, func(b store.Block) bool { return b.Index == index && b.Node == node })
}

func (c *clusterFake) Watch(f func(string)) { c.changed = f }

func (c *clusterFake) NodeBlocks(ctx context.Context, pool, node string) ([]store.Block, error) {
	all, err := c.Bolt.ListBlocks(ctx, pool)
	var out []store.Block
	for _, b := range all {
		if b.Node == node {
			out = append(out, b)
		}
	}
	return out, err
}

func (c *clusterFake) ClaimBlock(ctx context.Context, pool, node string, limit uint32, want *uint32, ok func(uint32) bool) (store.Block, error) {
	c.mu.Lock()
	hold, holding := c.hold, c.holding
	if want != nil {
		c.claims = append(c.claims, *want)
	}
	c.mu.Unlock()
	if hold != nil {
		if holding != nil {
			select {
			case holding <- struct{}{}:
			default:
			}
		}
		<-hold
	}
	if want == nil {
		return store.Block{}, errors.New("a cluster store claims by index only")
	}
	return c.Bolt.ClaimBlock(ctx, pool, node, limit, want, ok)
}

func (c *clusterFake) GetPool(ctx context.Context, name string) (store.Pool, error) {
	c.mu.Lock()
	p, over := c.pools[name]
	c.mu.Unlock()
	if over {
		if p == nil {
			return store.Pool{}, store.ErrNotFound
		}
		return *p, nil
	}
	return c.Bolt.GetPool(ctx, name)
}

func (c *clusterFake) setPool(p *store.Pool, name string) {
	c.mu.Lock()
	if c.pools == nil {
		c.pools = map[string]*store.Pool{}
	}
	c.pools[name] = p
	c.mu.Unlock()
}

var _ ClusterStore = (*clusterFake)(nil)

func clusterSetup(t *testing.T, subnets []string, bits int, reserved ...string) (*Manager, *clusterFake) {
	t.Helper()
	c := &clusterFake{Bolt: openStore(t), lost: map[uint32]bool{}}
	m, err := NewManager(Options{Store: c, Node: "n1", Cluster: ClusterOptions{MinBlockAge: time.Hour, DefaultPool: "p"}})
	if err != nil {
		t.Fatal(err)
	}
	createPool(t, m, "p", subnets, bits, reserved...)
	c.setPool(&store.Pool{Name: "p", Subnets: prefixes(subnets...), BlockSizeBits: bits, Reserved: reserved, UID: "uid-1"}, "p")
	return m, c
}

func blocksOf(t *testing.T, st store.Store, node string) []uint32 {
	t.Helper()
	bs, err := st.ListBlocks(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for _, b := range bs {
		if b.Node == node {
			out = append(out, b.Index)
		}
	}
	return out
}

// Claims follow the node's probing order; an index another node holds is
// skipped without being asked for (it is in ListBlocks), and one taken
// behind the cache's back is asked for once, then skipped.
func TestClusterClaimSpreadsAndSkipsTaken(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/24"}, 2) // 64 blocks of 4
	pr := newProber("n1", 64)
	first, _ := pr.next([]indexRange{{0, 64}}, nil)
	second, _ := pr.next([]indexRange{{0, 64}}, nil)
	if _, err := c.Bolt.ClaimBlock(context.Background(), "p", "n2", 64, &first, nil); err != nil {
		t.Fatal(err)
	}
	got := mustAllocate(t, m, Request{Pool: "p"})
	bi, _, _ := m.pools["p"].geo.Locate(got[0])
	if bi != second {
		t.Fatalf("first block %d, want %d (the walk's second: its first, %d, is n2's)", bi, second, first)
	}
	if slices.Contains(c.claims, first) {
		t.Fatalf("asked for block %d, which the store listed as n2's", first)
	}
}

// A node's walk meets every index of the pool exactly once, whatever the
// pool's size, and honours ranges and taken indices.
func TestProber(t *testing.T) {
	for _, n := range []uint32{1, 2, 3, 64, 96, 100, 16384} {
		for _, node := range []string{"n1", "node-0417", "x"} {
			pr := newProber(node, n)
			seen := map[uint32]bool{}
			for {
				i, ok := pr.next([]indexRange{{0, n}}, nil)
				if !ok {
					break
				}
				if i >= n || seen[i] {
					t.Fatalf("n=%d node %s: index %d out of range or met twice", n, node, i)
				}
				seen[i] = true
			}
			if len(seen) != int(n) {
				t.Fatalf("n=%d node %s: the walk met %d indices", n, node, len(seen))
			}
		}
	}
	ranges := []indexRange{{2, 5}, {8, 10}}
	taken := map[uint32]bool{3: true, 9: true}
	pr := newProber("n1", 12)
	var got []uint32
	for {
		i, ok := pr.next(ranges, func(i uint32) bool { return taken[i] })
		if !ok {
			break
		}
		got = append(got, i)
	}
	slices.Sort(got)
	if !slices.Equal(got, []uint32{2, 4, 8}) {
		t.Fatalf("walk in ranges %v without %v: %v, want [2 4 8]", ranges, taken, got)
	}
	// Two nodes' first claims differ (the start is the node's).
	a, _ := newProber("node-1", 16384).next([]indexRange{{0, 16384}}, nil)
	b, _ := newProber("node-2", 16384).next([]indexRange{{0, 16384}}, nil)
	if a == b {
		t.Fatalf("node-1 and node-2 start at the same index %d", a)
	}
}

// While a claim waits for the store, the pool's lock is free: an ADD that
// fits in a block the node has goes through, and a DEL too.
func TestClusterNoStoreCallUnderPoolLock(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/24"}, 2)
	first := mustAllocate(t, m, Request{Pool: "p"}) // claims a block of 4
	c.mu.Lock()
	c.hold = make(chan struct{})
	c.holding = make(chan struct{}, 1)
	c.mu.Unlock()
	// Fill the block, so that the next ADD needs a claim, which hangs in
	// the store.
	var last []netip.Addr
	for m.pools["p"].free() > 0 {
		last = mustAllocate(t, m, Request{Pool: "p"})
	}
	claiming := make(chan error, 1)
	go func() {
		_, err := m.Allocate(context.Background(), Request{Pool: "p"})
		claiming <- err
	}()
	select {
	case <-c.holding: // it reached the store
	case <-time.After(5 * time.Second):
		t.Fatal("the ADD that needs a claim never reached the store")
	}
	done := make(chan struct{})
	go func() {
		m.Release(context.Background(), "p", last)
		mustAllocate(t, m, Request{Pool: "p"}) // takes the freed address
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a DEL and an ADD that need no claim waited for another ADD's claim")
	}
	close(c.hold)
	if err := <-claiming; err != nil {
		t.Fatalf("the claiming ADD: %v", err)
	}
	_ = first
}

// A block the store no longer says is this node's is never allocated from
// again, leaves the export at once, keeps its held addresses until they
// are released, and is then forgotten (not released: it is not ours).
func TestClusterLostBlock(t *testing.T) {
	var lost []uint32
	c := &clusterFake{Bolt: openStore(t), lost: map[uint32]bool{}}
	m, err := NewManager(Options{Store: c, Node: "n1", Cluster: ClusterOptions{MinBlockAge: time.Hour, DefaultPool: "p",
		OnBlockLost: func(_ string, i uint32, _ int) { lost = append(lost, i) }}})
	if err != nil {
		t.Fatal(err)
	}
	createPool(t, m, "p", []string{"10.0.0.0/24"}, 2)
	a := mustAllocate(t, m, Request{Pool: "p"})
	bi, _, _ := m.pools["p"].geo.Locate(a[0])
	c.mu.Lock()
	c.lost[bi] = true
	c.mu.Unlock()
	b := mustAllocate(t, m, Request{Pool: "p"})
	if got, _, _ := m.pools["p"].geo.Locate(b[0]); got == bi {
		t.Fatalf("allocated %v from lost block %d", b[0], bi)
	}
	if !slices.Equal(lost, []uint32{bi}) {
		t.Fatalf("OnBlockLost saw %v, want [%d]", lost, bi)
	}
	p4, _ := m.pools["p"].geo.BlockPrefixes(bi)
	if slices.Contains(m.OwnedBlocks(), p4) {
		t.Fatalf("lost block %v still exported", p4)
	}
	if m.pools["p"].blocks[bi] == nil {
		t.Fatal("lost block forgotten while an address of it is held")
	}
	m.Release(context.Background(), "p", a)
	if m.pools["p"].blocks[bi] != nil {
		t.Fatal("lost block kept after its last address was released")
	}
	if !slices.Contains(blocksOf(t, c.Bolt, "n1"), bi) {
		t.Fatal("lost block released in the store: it is not this node's to release")
	}
}

// Reserved edits apply without restart: a newly reserved free address is
// never handed out, one no longer reserved is; an address held when it
// became reserved stays held, and becomes a reservation when released.
// (An IPv4 block's first and last addresses, the subnet's network and
// broadcast addresses, are reserved by the geometry.)
func TestClusterFollowsReserved(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/29"}, 3) // one block: .1-.6 usable
	ctx := context.Background()
	a := mustAllocate(t, m, Request{Pool: "p"}) // 10.0.0.1
	c.setPool(&store.Pool{Name: "p", Subnets: prefixes("10.0.0.0/29"), BlockSizeBits: 3, UID: "uid-1",
		Reserved: []string{"10.0.0.1-10.0.0.5"}}, "p")
	m.kick("p")
	if _, err := m.tend(ctx, false); err != nil {
		t.Fatal(err)
	}
	got := mustAllocate(t, m, Request{Pool: "p"})
	if got[0] != netip.MustParseAddr("10.0.0.6") {
		t.Fatalf("allocated %v, want 10.0.0.6 (.1 held, .2-.5 reserved)", got[0])
	}
	m.Release(ctx, "p", a)
	if _, err := m.Allocate(ctx, Request{Pool: "p"}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("allocate with every address reserved or held: %v, want ErrExhausted", err)
	}
	c.setPool(&store.Pool{Name: "p", Subnets: prefixes("10.0.0.0/29"), BlockSizeBits: 3, UID: "uid-1"}, "p")
	m.kick("p")
	if _, err := m.tend(ctx, false); err != nil {
		t.Fatal(err)
	}
	if u := usage(t, m, "p"); u.Used != 1 || u.Free != 5 {
		t.Fatalf("usage after the reservation was lifted: %+v, want 1 used (.6), 5 free (.1-.5)", u)
	}
}

// A pool deleted and re-created with other subnets is followed: no address
// of the old geometry is handed out again.
func TestClusterPoolRecreated(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/24"}, 2)
	ctx := context.Background()
	mustAllocate(t, m, Request{Pool: "p"})
	c.setPool(&store.Pool{Name: "p", Subnets: prefixes("10.9.0.0/24"), BlockSizeBits: 2, UID: "uid-2"}, "p")
	m.kick("p")
	if _, err := m.tend(ctx, false); err != nil {
		t.Fatal(err)
	}
	got, err := m.Allocate(ctx, Request{Pool: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if !netip.MustParsePrefix("10.9.0.0/24").Contains(got[0]) {
		t.Fatalf("allocated %v after the pool was re-created as 10.9.0.0/24", got[0])
	}
}

// A pool being deleted gets no block claimed, and its empty blocks go at
// once whatever their age.
func TestClusterPoolDeleting(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/24"}, 2)
	ctx := context.Background()
	a := mustAllocate(t, m, Request{Pool: "p"})
	m.Release(ctx, "p", a)
	c.setPool(&store.Pool{Name: "p", Subnets: prefixes("10.0.0.0/24"), BlockSizeBits: 2, UID: "uid-1", Deleting: true}, "p")
	m.kick("p")
	if _, err := m.tend(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := blocksOf(t, c.Bolt, "n1"); len(got) != 0 {
		t.Fatalf("blocks %v kept while the pool is being deleted", got)
	}
	if _, err := m.Allocate(ctx, Request{Pool: "p"}); !errors.Is(err, ErrPoolNotFound) {
		t.Fatalf("allocate from a deleting pool: %v, want ErrPoolNotFound", err)
	}
}

// The default pool has a spare block from the start; another is claimed
// in the background once free addresses fall below a quarter of a block;
// emptied blocks older than MinBlockAge go back, except the spare.
func TestClusterSpares(t *testing.T) {
	c := &clusterFake{Bolt: openStore(t), lost: map[uint32]bool{}}
	m, err := NewManager(Options{Store: c, Node: "n1", Cluster: ClusterOptions{MinBlockAge: time.Nanosecond, DefaultPool: "p"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	createPool(t, m, "p", []string{"10.0.0.0/24"}, 3) // blocks of 8, low water 2
	if _, err := m.FreeUnusedBlocks(ctx); err != nil {
		t.Fatal(err)
	}
	if got := blocksOf(t, c.Bolt, "n1"); len(got) != 1 {
		t.Fatalf("blocks at start: %v, want one spare", got)
	}
	var held []netip.Addr
	for range 7 {
		held = append(held, mustAllocate(t, m, Request{Pool: "p"})...)
	}
	if _, err := m.tend(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := blocksOf(t, c.Bolt, "n1"); len(got) != 2 {
		t.Fatalf("blocks with 1 address free: %v, want a second (spare) one", got)
	}
	c.mu.Lock()
	claims := len(c.claims)
	c.mu.Unlock()
	held = append(held, mustAllocate(t, m, Request{Pool: "p"})...)
	held = append(held, mustAllocate(t, m, Request{Pool: "p"})...)
	c.mu.Lock()
	if len(c.claims) != claims {
		t.Fatalf("ADDs made %d claims with a spare present", len(c.claims)-claims)
	}
	c.mu.Unlock()
	m.Release(ctx, "p", held)
	if _, err := m.tend(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := blocksOf(t, c.Bolt, "n1"); len(got) != 1 {
		t.Fatalf("blocks after every address went: %v, want the spare alone", got)
	}
}

// A block of this node the Manager did not know (a claim whose answer was
// lost) is adopted, then given back when unused.
func TestClusterAdoptsLostClaim(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/24"}, 2)
	ctx := context.Background()
	mustAllocate(t, m, Request{Pool: "p"})
	orphan := uint32(40)
	if _, err := c.Bolt.ClaimBlock(ctx, "p", "n1", 64, &orphan, nil); err != nil {
		t.Fatal(err)
	}
	m.copts.MinBlockAge = 0
	if _, err := m.tend(ctx, true); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(blocksOf(t, c.Bolt, "n1"), orphan) {
		t.Fatalf("orphaned block %d still claimed after tending: %v", orphan, blocksOf(t, c.Bolt, "n1"))
	}
}

// A node never holds more blocks of a pool than its maxBlocksPerNode,
// spares included.
func TestClusterMaxBlocksPerNode(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/24"}, 2)
	ctx := context.Background()
	c.setPool(&store.Pool{Name: "p", Subnets: prefixes("10.0.0.0/24"), BlockSizeBits: 2, UID: "uid-1", MaxBlocksPerNode: 2}, "p")
	var err error
	for n := 0; err == nil && n < 64; n++ {
		_, err = m.Allocate(ctx, Request{Pool: "p"})
	}
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("allocating past two blocks: %v, want ErrExhausted", err)
	}
	if _, err := m.tend(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got := blocksOf(t, c.Bolt, "n1"); len(got) != 2 {
		t.Fatalf("node holds blocks %v, want 2 (its maxBlocksPerNode)", got)
	}
}

// A lost block whose index this node claims again (it was deleted, not
// given away) is usable again, its held addresses still held.
func TestClusterLostBlockClaimedAgain(t *testing.T) {
	m, c := clusterSetup(t, []string{"10.0.0.0/24"}, 2)
	ctx := context.Background()
	a := mustAllocate(t, m, Request{Pool: "p"})
	bi, _, _ := m.pools["p"].geo.Locate(a[0])
	c.mu.Lock()
	c.lost[bi] = true
	c.mu.Unlock()
	m.kick("p")
	if _, err := m.tend(ctx, false); err != nil {
		t.Fatal(err)
	}
	if !m.pools["p"].blocks[bi].lost {
		t.Fatal("block not marked lost")
	}
	c.mu.Lock()
	c.lost[bi] = false // the store says it is this node's again
	c.mu.Unlock()
	if err := m.claimFor(ctx, m.pools["p"], &needBlock{want: &bi}); err != nil {
		t.Fatal(err)
	}
	if b := m.pools["p"].blocks[bi]; b.lost || b.held() != 1 {
		t.Fatalf("block claimed again: lost %v, held %d; want usable with its address held", b.lost, b.held())
	}
	got := mustAllocate(t, m, Request{Pool: "p", Static: []netip.Addr{a[0].Next()}})
	if got[0] != a[0].Next() {
		t.Fatalf("static %v in the block claimed again: got %v", a[0].Next(), got)
	}
}

package ipam

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/skeinnet/skein/internal/store"
)

// ClusterStore is implemented by stores whose blocks are shared by the
// nodes of a cluster (Kubernetes mode). With one, the Manager claims blocks
// itself and keeps the cluster's rules:
//
//   - ListBlocks(pool) returns every node's blocks of pool, as far as the
//     store has seen them: the indices a claim skips.
//   - ClaimBlock with a wanted index is one create-if-absent: the block,
//     or store.ErrConflict when any node (this one included, for a block
//     being deleted) has that index. ClaimBlock with no index is not used.
//   - ReleaseBlock deletes a block of this node's.
//
// No store call is made with a pool's lock held: an ADD never waits for
// the API server behind another ADD, and in steady state never waits for
// it at all, since a spare block is claimed in the background (Run).
type ClusterStore interface {
	store.Store
	// Owns reports whether block index of pool is node's now, as far as
	// the store can prove it: the block exists, names node as its owner
	// and is not being deleted. A block claimed through ClaimBlock is
	// owned from the moment the claim returns. It answers from memory.
	Owns(pool string, index uint32, node string) bool
	// Watch registers changed, called (on the store's goroutine, without
	// waiting) with a pool's name when the pool or one of this node's
	// blocks of it changes in the store. At most one is registered.
	Watch(changed func(pool string))
	// NodeBlocks lists node's blocks of pool (ListBlocks filtered, without
	// reading every node's).
	NodeBlocks(ctx context.Context, pool, node string) ([]store.Block, error)
}

// Fencer is a ClusterStore that can tell that this node must not act on
// its blocks for now, though they are still its own as far as it knows:
// the Kubernetes store once its node's liveness Lease may have expired
// (the API server out of reach, or refusing the node), after which
// skein-controller may give a deleted Node's blocks to other nodes. While
// Fenced is not nil, no address is handed out (ErrTryAgain) and no block
// is exported (ExportedBlocks); addresses already held stay, and so does
// everything once it is nil again.
type Fencer interface {
	Fenced() error
}

// fenced is the store's Fenced, nil without a Fencer.
func (m *Manager) fenced() error {
	if f, ok := m.cluster.(Fencer); ok {
		return f.Fenced()
	}
	return nil
}

// ClusterOptions tunes a Manager over a ClusterStore; the zero value is
// usable.
type ClusterOptions struct {
	// MinBlockAge is how long a block stays empty before it is given back
	// (a node whose pods come and go keeps its blocks, and a block just
	// claimed is not released while the cluster's caches catch up); zero
	// means 30 seconds. A pool being deleted gives its empty blocks back
	// at once.
	MinBlockAge time.Duration
	// Resync is how often Run looks at every pool when nothing asked it
	// to; zero means 5 seconds.
	Resync time.Duration
	// DefaultPool is kept with a spare block even when no attachment uses
	// it, so that the first pod of a node does not wait for a claim;
	// empty means "default". Other pools keep a spare while attachments
	// use them.
	DefaultPool string
	// OnBlockLost, if set, is told when a block this node allocated from
	// is no longer provably its own (deleted, or given to another node,
	// behind its back): no address is handed out from it again.
	OnBlockLost func(pool string, index uint32, held int)
}

// maxCollisions bounds the indices one claim tries before it gives up
// (each taken index costs one refused create).
const maxCollisions = 32

// errNeedBlock is how an allocation under a pool's lock asks for a block
// to be claimed without the lock.
type needBlock struct {
	v6     bool
	within []netip.Prefix
	want   *uint32 // a static address's block
	spare  bool    // Run's: the pool's free addresses are below low water
}

func (n *needBlock) Error() string { return "a block must be claimed" }

// lowWater is the number of free addresses (per family) below which a
// pool in use gets a spare block: a quarter of a block, at least one.
func (ps *poolState) lowWater() uint32 {
	return max(ps.geo.BlockSize()/4, 1)
}

// free returns the free addresses of the usable blocks, in the family
// with fewer (a dual-stack pool runs out of the scarcer one first).
func (ps *poolState) free() uint32 {
	v4, v6 := ps.geo.Families()
	var f4, f6 uint64
	for _, b := range ps.blocks {
		if b.lost || b.releasing {
			continue
		}
		if b.v4 != nil {
			f4 += uint64(b.v4.size - b.v4.used)
		}
		if b.v6 != nil {
			f6 += uint64(b.v6.size - b.v6.used)
		}
	}
	f := uint64(1 << 32)
	if v4 {
		f = min(f, f4)
	}
	if v6 {
		f = min(f, f6)
	}
	return uint32(min(f, 1<<32-1))
}

// live is the number of blocks of ps this node holds and allocates from
// or gives back (lost ones are not its own); the caller holds ps.mu.
func (ps *poolState) live() int {
	n := 0
	for _, b := range ps.blocks {
		if !b.lost {
			n++
		}
	}
	return n
}

// held is the number of addresses attachments hold in b.
func (b *blockState) held() int {
	n := 0
	if b.v4 != nil {
		n += int(b.v4.used - b.rsv4.used)
	}
	if b.v6 != nil {
		n += int(b.v6.used - b.rsv6.used)
	}
	return n
}

// usable reports whether addresses may be handed out from b: with a
// ClusterStore, only while the store proves the block this node's. A
// block found lost stays lost. The caller holds ps.mu.
func (m *Manager) usable(ps *poolState, b *blockState) bool {
	if b.lost || b.releasing {
		return false
	}
	if m.cluster == nil || m.cluster.Owns(ps.def.Name, b.index, m.node) {
		return true
	}
	m.markLost(ps, b)
	return false
}

// markLost stops allocation from b; the caller holds ps.mu. Its addresses
// stay held (their pods keep them; a DEL releases them), it leaves the
// export at once, and it is forgotten when its last address goes.
func (m *Manager) markLost(ps *poolState, b *blockState) {
	if b.lost {
		return
	}
	b.lost = true
	ps.claimed = true // the export must drop it
	held := b.held()
	m.log.Error("a block of this node is no longer its own in the store (deleted or given to another node): no address is handed out from it again; its pods keep theirs until they go",
		"pool", ps.def.Name, "block", b.index, "held", held)
	if m.copts.OnBlockLost != nil {
		m.copts.OnBlockLost(ps.def.Name, b.index, held)
	}
	if held == 0 {
		ps.dropBlock(b.index)
	}
	m.kick(ps.def.Name)
}

// allocateCluster is Allocate with a ClusterStore: the request is tried
// under the pool's lock; when it needs a block, that is claimed without
// the lock and the request is tried again.
func (m *Manager) allocateCluster(ctx context.Context, ps *poolState, r Request, want4, want6 bool) ([]netip.Addr, error) {
	if err := m.fenced(); err != nil {
		return nil, fmt.Errorf("%w: no address is handed out: %w", ErrTryAgain, err)
	}
	for range maxCollisions {
		addrs, err := m.allocateOnce(ctx, ps, r, want4, want6)
		var need *needBlock
		if !errors.As(err, &need) {
			return addrs, err
		}
		if err := m.claimFor(ctx, ps, need); err != nil {
			return nil, err
		}
		if cur := m.loaded(r.Pool); cur != nil && cur != ps {
			ps = cur // the pool was re-created while we claimed
		}
	}
	return nil, fmt.Errorf("%w: pool %q: blocks claimed for this request went elsewhere %d times", ErrTryAgain, r.Pool, maxCollisions)
}

func (m *Manager) loaded(pool string) *poolState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.pools[pool]
}

// claimFor claims a block for need, one claim per pool at a time; the
// caller holds no lock. It returns nil without a claim when a block with
// room appeared meanwhile (the spare worker's, or another request's).
func (m *Manager) claimFor(ctx context.Context, ps *poolState, need *needBlock) error {
	ps.claimMu.Lock()
	defer ps.claimMu.Unlock()
	ps.mu.Lock()
	if need.want != nil && ps.blocks[*need.want] != nil && m.usable(ps, ps.blocks[*need.want]) ||
		need.spare && ps.free() >= ps.lowWater() ||
		need.want == nil && !need.spare && m.hasRoom(ps, need.v6, need.within) {
		ps.mu.Unlock()
		return nil
	}
	if ps.deleting {
		ps.mu.Unlock()
		return fmt.Errorf("%w: pool %q is being deleted: no block of it is claimed", ErrPoolNotFound, ps.def.Name)
	}
	if limit := ps.def.MaxBlocksPerNode; limit > 0 && need.want == nil && ps.live() >= limit {
		ps.mu.Unlock()
		return fmt.Errorf("%w: node %q holds %d blocks of pool %q, its maxBlocksPerNode", ErrExhausted, m.node, limit, ps.def.Name)
	}
	name, geo := ps.def.Name, ps.geo
	ranges := geo.usableBlocks(need.within, need.v6)
	ps.mu.Unlock()

	blk, err := m.claimIndex(ctx, ps, name, geo, ranges, need.want)
	ps.mu.Lock()
	defer m.unlock(ps)
	// A claim whose answer was lost is adopt's again from here on.
	ps.claiming = nil
	if err != nil {
		return err
	}
	b := ps.addBlock(blk.Index)
	b.emptySince = time.Now()
	ps.claimed = true
	return nil
}

// hasRoom reports whether a usable block has an address for the family
// (in within, if given); the caller holds ps.mu.
func (m *Manager) hasRoom(ps *poolState, v6 bool, within []netip.Prefix) bool {
	within = familyOf(within, v6)
	for _, i := range ps.order {
		b := ps.blocks[i]
		bm := b.v4
		if v6 {
			bm = b.v6
		}
		if bm == nil || bm.full() || !m.usable(ps, b) || !blockIntersects(ps.geo, i, v6, within) {
			continue
		}
		return true
	}
	return false
}

// claimIndex claims one block of pool: want, or a free index in ranges
// in the node's own probing order (prober), so that nodes claiming at
// once spread over the pool instead of colliding on its lowest free
// block. Indices the cache lists and the node's own are skipped unasked.
// A refused create marks the index taken and moves on; the same
// index is never asked for twice.
func (m *Manager) claimIndex(ctx context.Context, ps *poolState, pool string, geo *Geometry, ranges []indexRange, want *uint32) (store.Block, error) {
	if err := m.fenced(); err != nil {
		// Not even a spare: the fence lifts only once what this node owns
		// was read again, which a claim meanwhile would race.
		return store.Block{}, fmt.Errorf("%w: no block is claimed: %w", ErrTryAgain, err)
	}
	if want != nil {
		ps.markClaiming(*want)
		blk, err := m.st.ClaimBlock(ctx, pool, m.node, geo.Blocks(), want, nil)
		if errors.Is(err, store.ErrConflict) {
			return blk, fmt.Errorf("%w: block %d of pool %q is taken (node %q): %v", ErrInUse, *want, pool, blk.Node, err)
		}
		if err != nil {
			return blk, fmt.Errorf("claim block %d of pool %q: %w", *want, pool, err)
		}
		return blk, nil
	}
	taken, err := m.takenIndices(ctx, ps, pool)
	if err != nil {
		return store.Block{}, err
	}
	pr := newProber(m.node, geo.Blocks())
	for range maxCollisions {
		i, ok := pr.next(ranges, taken.has)
		if taken.err != nil {
			return store.Block{}, fmt.Errorf("claim a block of pool %q: %w", pool, taken.err)
		}
		if !ok {
			return store.Block{}, fmt.Errorf("%w in pool %q: every block is claimed", ErrExhausted, pool)
		}
		ps.markClaiming(i)
		blk, err := m.st.ClaimBlock(ctx, pool, m.node, geo.Blocks(), &i, nil)
		if errors.Is(err, store.ErrConflict) {
			taken.mark(i)
			continue
		}
		if err != nil {
			return store.Block{}, fmt.Errorf("claim block %d of pool %q: %w", i, pool, err)
		}
		return blk, nil
	}
	return store.Block{}, fmt.Errorf("%w: pool %q: %d blocks in a row were taken by other nodes first", ErrTryAgain, pool, maxCollisions)
}

// BlockTaker is implemented by cluster stores that can tell whether one
// index of a pool is taken without listing the pool's blocks (kubestore:
// a lookup of "<pool>-<index>" in its cache). A claim then costs the node
// O(1) lookups instead of a copy of every block of the pool: at 1,000
// nodes, ListBlocks on each claim was most of the nodes' CPU.
type BlockTaker interface {
	BlockTaken(ctx context.Context, pool string, index uint32) (bool, error)
}

// taken is what a claim knows to be taken: indices it was refused and the
// node's own, and either the store's list or its lookup for the rest.
type taken struct {
	ctx    context.Context
	pool   string
	known  map[uint32]bool
	lookup BlockTaker
	err    error
}

func (t *taken) mark(i uint32) { t.known[i] = true }

func (t *taken) has(i uint32) bool {
	if t.known[i] || t.err != nil {
		return true // after a failed lookup nothing is free: the claim fails
	}
	if t.lookup == nil {
		return false
	}
	yes, err := t.lookup.BlockTaken(t.ctx, t.pool, i)
	if err != nil {
		t.err = err
		return true
	}
	return yes
}

// takenIndices starts a claim's view of what is taken in pool: the node's
// own blocks (the cache may not show yet the block claimed a moment ago,
// and asking for it again is a wasted write), and every listed block
// unless the store can look indices up one by one.
func (m *Manager) takenIndices(ctx context.Context, ps *poolState, pool string) (*taken, error) {
	t := &taken{ctx: ctx, pool: pool, known: map[uint32]bool{}}
	ps.mu.Lock()
	for _, i := range ps.order {
		t.known[i] = true
	}
	ps.mu.Unlock()
	if bt, ok := m.st.(BlockTaker); ok {
		t.lookup = bt
		return t, nil
	}
	blocks, err := m.st.ListBlocks(ctx, pool)
	if err != nil {
		return nil, err
	}
	for _, b := range blocks {
		t.known[b.Index] = true
	}
	return t, nil
}

// prober walks the n block indices of a pool in the node's own order:
// from a start and with a stride both seeded by the node's name (the
// stride coprime with n, so the walk meets every index once). Nodes
// claiming at once spread over the pool, and so do one node's successive
// claims: a linear walk from the seed made runs of blocks where nodes
// whose seeds lay close met each other's claims not yet in their caches
// (a 409 each), and the run grew with every claim.
type prober struct {
	n, start, stride uint32
	k                uint32 // indices walked so far
}

func newProber(node string, n uint32) *prober {
	if n == 0 {
		return &prober{}
	}
	h := fnv.New64a()
	h.Write([]byte(node))
	sum := h.Sum64()
	p := &prober{n: n, start: uint32(sum % uint64(n)), stride: 1}
	if n > 2 {
		p.stride = 1 + uint32((sum>>32)%uint64(n-1))
		for gcd(p.stride, n) != 1 {
			p.stride++
			if p.stride >= n {
				p.stride = 1
			}
		}
	}
	return p
}

// next returns the next index of the walk that lies in ranges (ascending)
// and is not taken; false when the walk is done.
func (p *prober) next(ranges []indexRange, taken func(uint32) bool) (uint32, bool) {
	for p.k < p.n {
		i := uint32((uint64(p.start) + uint64(p.k)*uint64(p.stride)) % uint64(p.n))
		p.k++
		if inRanges(ranges, i) && (taken == nil || !taken(i)) {
			return i, true
		}
	}
	return 0, false
}

// inRanges reports whether i lies in one of ranges (ascending, disjoint).
func inRanges(ranges []indexRange, i uint32) bool {
	j := sort.Search(len(ranges), func(j int) bool { return ranges[j].end > i })
	return j < len(ranges) && ranges[j].start <= i
}

func gcd(a, b uint32) uint32 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// holdStale marks a held by an attachment of an earlier state of the pool:
// held in its block if this node has it, else remembered until the block
// is added.
func (ps *poolState) holdStale(a netip.Addr) {
	bi, off, ok := ps.geo.Locate(a)
	if !ok {
		return
	}
	if b := ps.blocks[bi]; b != nil {
		b.hold(a, off)
		return
	}
	if ps.stale == nil {
		ps.stale = map[netip.Addr]bool{}
	}
	ps.stale[a] = true
}

// markClaiming notes that a claim of index i is under way (claimFor, which
// holds claimMu, adds the block when it succeeds): adopt leaves it to it.
func (ps *poolState) markClaiming(i uint32) {
	ps.mu.Lock()
	if ps.claiming == nil {
		ps.claiming = map[uint32]bool{}
	}
	ps.claiming[i] = true
	ps.mu.Unlock()
}

// dropBlock forgets block i; the caller holds ps.mu.
func (ps *poolState) dropBlock(i uint32) {
	delete(ps.blocks, i)
	if pos, found := slices.BinarySearch(ps.order, i); found {
		ps.order = slices.Delete(ps.order, pos, pos+1)
	}
	ps.cursor = 0
}

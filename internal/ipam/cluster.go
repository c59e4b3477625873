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
	if t.known[i] {
		return true
	}
	if t.lookup == nil || t.err != nil {
		return t.err != nil
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

// kick asks Run to look at pool soon.
func (m *Manager) kick(pool string) {
	if m.cluster == nil {
		return
	}
	m.dirtyMu.Lock()
	m.dirty[pool] = true
	m.dirtyMu.Unlock()
	select {
	case m.kickc <- struct{}{}:
	default:
	}
}

// Run keeps the node's blocks in shape with a ClusterStore until ctx
// ends: it follows pools (reserved edits, appended subnets, a pool
// re-created or deleted), drops blocks no longer provably this node's,
// adopts blocks of this node it did not know (a claim whose answer was
// lost), claims a spare block for each pool in use before its free
// addresses run out, and gives back blocks empty for MinBlockAge. It
// returns at once without a ClusterStore.
func (m *Manager) Run(ctx context.Context) {
	if m.cluster == nil {
		return
	}
	t := time.NewTicker(m.copts.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kickc:
		case <-t.C:
			m.dirtyMu.Lock()
			m.dirty[""] = true // everything
			m.dirtyMu.Unlock()
		}
		if _, err := m.tend(ctx, false); err != nil && ctx.Err() == nil {
			m.log.Warn("blocks: tending the pools failed (retried at the next change, or in a few seconds)", "err", err)
		}
	}
}

// tend looks at the pools marked dirty (all of them for ""); startup
// ignores MinBlockAge. It returns how many blocks it gave back.
func (m *Manager) tend(ctx context.Context, startup bool) (int, error) {
	m.dirtyMu.Lock()
	dirty := m.dirty
	m.dirty = map[string]bool{}
	m.dirtyMu.Unlock()
	names := map[string]bool{}
	m.mu.RLock()
	for name := range m.pools {
		if dirty[""] || dirty[name] || startup {
			names[name] = true
		}
	}
	m.mu.RUnlock()
	if def := m.copts.DefaultPool; dirty[""] || dirty[def] || startup {
		names[def] = true // kept with a spare even before its first pod
	}
	for name := range dirty {
		if name != "" {
			names[name] = true
		}
	}
	freed := 0
	var errs []error
	for name := range names {
		n, err := m.tendPool(ctx, name, startup)
		freed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return freed, errors.Join(errs...)
}

// tendPool is tend for one pool.
func (m *Manager) tendPool(ctx context.Context, name string, startup bool) (int, error) {
	ps := m.loaded(name)
	if ps == nil {
		if name != m.copts.DefaultPool {
			return 0, nil // not used on this node
		}
		var err error
		if ps, err = m.pool(ctx, name); errors.Is(err, ErrPoolNotFound) {
			return 0, nil
		} else if err != nil {
			return 0, err
		}
	}
	if err := m.follow(ctx, ps); err != nil {
		return 0, err
	}
	if cur := m.loaded(name); cur != nil && cur != ps {
		ps = cur // re-created
	}
	var errs []error
	if err := m.adopt(ctx, ps); err != nil {
		errs = append(errs, err)
	}
	if err := m.spare(ctx, ps); err != nil {
		errs = append(errs, err)
	}
	freed, err := m.giveBack(ctx, ps, startup)
	return freed, errors.Join(append(errs, err)...)
}

// inUse reports whether ps should keep a spare block; the caller holds
// ps.mu.
func (m *Manager) inUse(ps *poolState) bool {
	if ps.deleting {
		return false
	}
	if ps.def.Name == m.copts.DefaultPool {
		return true
	}
	for _, b := range ps.blocks {
		if b.held() > 0 {
			return true
		}
	}
	return time.Since(ps.lastUsed) < m.copts.MinBlockAge
}

// spare claims a block for ps when the pool is in use and its free
// addresses are below the low-water mark.
func (m *Manager) spare(ctx context.Context, ps *poolState) error {
	ps.mu.Lock()
	need := m.inUse(ps) && ps.free() < ps.lowWater()
	v4, _ := ps.geo.Families()
	ps.mu.Unlock()
	if !need {
		return nil
	}
	err := m.claimFor(ctx, ps, &needBlock{v6: !v4, spare: true})
	if errors.Is(err, ErrExhausted) {
		return nil // nothing to be had; ADDs will say so
	}
	if err != nil {
		return fmt.Errorf("claim a spare block of pool %q: %w", ps.def.Name, err)
	}
	return nil
}

// giveBack releases the blocks of ps that hold no address and have been
// empty for MinBlockAge (any age at startup, or while the pool is being
// deleted), keeping what the pool needs to stay above its low-water mark
// while in use.
func (m *Manager) giveBack(ctx context.Context, ps *poolState, startup bool) (int, error) {
	freed := 0
	for {
		ps.mu.Lock()
		var victim *blockState
		keep := m.inUse(ps)
		for _, i := range ps.order {
			b := ps.blocks[i]
			if b.held() > 0 || b.releasing || b.lost {
				continue
			}
			old := startup || ps.deleting || time.Since(b.emptySince) >= m.copts.MinBlockAge
			if !old {
				continue
			}
			if keep && ps.free()-min(ps.free(), b.free()) < ps.lowWater() {
				continue // the pool's spare
			}
			victim = b
			break
		}
		if victim == nil {
			ps.mu.Unlock()
			return freed, nil
		}
		victim.releasing = true
		name, index := ps.def.Name, victim.index
		ps.mu.Unlock()

		err := m.st.ReleaseBlock(ctx, name, index, m.node)
		ps.mu.Lock()
		if err != nil {
			victim.releasing = false
			m.unlock(ps)
			return freed, fmt.Errorf("free block %d of pool %q: %w", index, name, err)
		}
		ps.dropBlock(index)
		ps.claimed = true
		m.unlock(ps)
		freed++
	}
}

// free is the free addresses of b in its scarcer family.
func (b *blockState) free() uint32 {
	f := ^uint32(0)
	if b.v4 != nil {
		f = min(f, b.v4.size-b.v4.used)
	}
	if b.v6 != nil {
		f = min(f, b.v6.size-b.v6.used)
	}
	return f
}

// adopt takes into ps the blocks the store says are this node's but ps
// does not hold (a claim whose answer never came back: the API server
// made the block, the client timed out), so that they are used or given
// back instead of leaking; and marks lost those it holds that the store
// no longer says are its own.
func (m *Manager) adopt(ctx context.Context, ps *poolState) error {
	blocks, err := m.cluster.NodeBlocks(ctx, ps.def.Name, m.node)
	if err != nil {
		return err
	}
	ps.mu.Lock()
	defer m.unlock(ps)
	for _, blk := range blocks {
		if blk.Node != m.node || blk.Index >= ps.geo.Blocks() || ps.blocks[blk.Index] != nil {
			continue
		}
		if !m.cluster.Owns(ps.def.Name, blk.Index, m.node) || ps.claiming[blk.Index] {
			continue // being deleted; or being claimed right now (claimFor adds it)
		}
		b := ps.addBlock(blk.Index)
		b.emptySince = time.Now()
		ps.claimed = true
		m.log.Info("adopted a block of this node it did not know (a claim whose answer was lost)", "pool", ps.def.Name, "block", blk.Index)
	}
	for _, i := range slices.Clone(ps.order) {
		m.usable(ps, ps.blocks[i]) // marks the lost ones
	}
	return nil
}

// follow brings ps in step with the pool's definition in the store: a
// reserved list edited applies to every block at once; subnets appended
// extend the geometry; a pool deleted stops claims (and gives its empty
// blocks back at once); a pool re-created under the same name (another
// UID) replaces ps.
func (m *Manager) follow(ctx context.Context, ps *poolState) error {
	def, err := m.st.GetPool(ctx, ps.def.Name)
	ps.mu.Lock()
	defer m.unlock(ps)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if !ps.deleting {
			m.log.Info("pool deleted: no more blocks of it are claimed", "pool", ps.def.Name)
		}
		ps.deleting = true
		return nil
	case err != nil:
		return err
	}
	if def.UID != ps.def.UID && ps.def.UID != "" && def.UID != "" {
		return m.replace(ctx, ps, def)
	}
	ps.deleting = def.Deleting
	if slices.Equal(def.Subnets, ps.def.Subnets) && slices.Equal(def.Reserved, ps.def.Reserved) && def.BlockSizeBits == ps.def.BlockSizeBits {
		ps.def = def
		return nil
	}
	geo, err := NewGeometry(def.Subnets, def.BlockSizeBits, def.Reserved)
	if err != nil {
		return fmt.Errorf("pool %q changed to something invalid (kept as it was): %w", def.Name, err)
	}
	if !sameBlocks(ps.geo, geo, ps.order) {
		return m.replace(ctx, ps, def)
	}
	ps.def, ps.geo = def, geo
	for _, i := range ps.order {
		ps.blocks[i].applyReserved(geo)
	}
	m.log.Info("pool changed: followed", "pool", def.Name, "subnets", def.Subnets, "reserved", def.Reserved)
	return nil
}

// sameBlocks reports whether every block in order has the same addresses
// in both geometries.
func sameBlocks(a, b *Geometry, order []uint32) bool {
	if a.BlockSize() != b.BlockSize() {
		return false
	}
	for _, i := range order {
		if i >= b.Blocks() {
			return false
		}
		a4, a6 := a.BlockPrefixes(i)
		b4, b6 := b.BlockPrefixes(i)
		if a4 != b4 || a6 != b6 {
			return false
		}
	}
	return true
}

// replace swaps ps for a fresh state of the pool def (re-created under the
// same name, or changed so that blocks moved); the caller holds ps.mu. The
// old state's blocks are not this pool's any more: the new state starts
// from the store's blocks of this node, and the addresses attachments
// still hold under the pool's name stay held wherever they fall in it.
func (m *Manager) replace(ctx context.Context, ps *poolState, def store.Pool) error {
	fresh, err := m.newPoolState(ctx, def)
	if err != nil {
		return err
	}
	atts, err := m.st.ListAttachments(ctx)
	if err != nil {
		return err
	}
	for _, a := range atts {
		if a.Pool != def.Name {
			continue
		}
		for _, addr := range a.Addrs {
			fresh.holdStale(addr.Unmap())
		}
	}
	ps.deleting = true // the old state hands out nothing more
	ps.claimed = true
	m.mu.Lock()
	m.pools[def.Name] = fresh
	m.mu.Unlock()
	m.log.Warn("pool re-created or its blocks moved: its old geometry is dropped", "pool", def.Name,
		"subnets", def.Subnets, "stale", len(fresh.stale))
	m.kick(def.Name)
	return nil
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

package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/skeinnet/skein/internal/store"
)

// Errors callers branch on (the CNI layer maps them to error codes).
var (
	ErrPoolNotFound = errors.New("pool not found")
	ErrExhausted    = errors.New("no free address")
	ErrInUse        = errors.New("address in use")
	ErrOutOfPool    = errors.New("address not in pool")
	ErrReserved     = errors.New("address reserved")
	ErrInvalidPool  = errors.New("invalid pool")
)

// Options configures a Manager.
type Options struct {
	// Store is required.
	Store store.Store
	// Node is this node's name; blocks are claimed under it. Required.
	Node string
	// OnBlocksChanged, if set, is called after the blocks this node owns
	// change — it claims a block, or a pool it may own blocks of is
	// deleted — so the route export can follow. It is called with no lock
	// of the Manager held (it may call OwnedBlocks), on the goroutine that
	// made the change, which waits for it: it should return quickly.
	OnBlocksChanged func()
	// Cluster tunes the block handling of a ClusterStore (ignored with
	// another store).
	Cluster ClusterOptions
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// ErrTryAgain: no block could be had now (the store did not answer, or
// other nodes took every block tried first); the request may succeed
// later (CNI code 11).
var ErrTryAgain = errors.New("try again later")

// Manager hands out addresses from pools. Each pool has its own lock held
// for microseconds while a bitmap is searched; there is no lock shared by
// all ADDs. With the embedded store, claiming a new block (a local store
// write) happens under the pool's lock, once per 2^bits addresses. With a
// ClusterStore no store call is made under a pool's lock (see
// ClusterStore and Run).
type Manager struct {
	st      store.Store
	cluster ClusterStore // nil: the embedded store
	copts   ClusterOptions
	node    string
	changed func()
	log     *slog.Logger

	mu    sync.RWMutex
	pools map[string]*poolState

	// Run's work: pools to look at ("" = all), and its wake-up.
	dirtyMu sync.Mutex
	dirty   map[string]bool
	kickc   chan struct{}
}

type poolState struct {
	mu sync.Mutex
	// claimMu serializes a pool's block claims on this node (ClusterStore),
	// taken without mu.
	claimMu sync.Mutex
	// deleting: the pool is being deleted (or was replaced): no block is
	// claimed, empty ones are given back at once.
	deleting bool
	// lastUsed is when an address was last handed out or released.
	lastUsed time.Time
	// stale are addresses held under the pool's name by attachments of an
	// earlier state of it, in blocks this node does not hold (yet).
	stale map[netip.Addr]bool
	// claiming are indices a claim under claimMu asks for now (adopt
	// leaves them to it); reset when the claim ends.
	claiming map[uint32]bool
	def      store.Pool
	geo      *Geometry
	blocks   map[uint32]*blockState
	order    []uint32 // owned block indices, ascending
	cursor   int      // position in order where the search starts
	// claimed is set when a block is claimed under mu; unlock reports it
	// through OnBlocksChanged once mu is released.
	claimed bool
}

type blockState struct {
	index  uint32
	v4, v6 *bitmap // offsets used: held by attachments, or reserved
	// rsv4, rsv6 are the offsets used because they are reserved (and held
	// by no attachment): a subset of v4, v6.
	rsv4, rsv6 *bitmap
	// With a ClusterStore: lost is set once the block is no longer
	// provably this node's (nothing is handed out from it again);
	// releasing while it is being given back; emptySince is when its last
	// address went (or it was claimed).
	lost, releasing bool
	emptySince      time.Time
}

// NewManager returns a manager over o.Store.
func NewManager(o Options) (*Manager, error) {
	if o.Store == nil || o.Node == "" {
		return nil, errors.New("ipam: Store and Node are required")
	}
	changed := o.OnBlocksChanged
	if changed == nil {
		changed = func() {}
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{st: o.Store, node: o.Node, changed: changed, log: log, pools: map[string]*poolState{},
		copts: o.Cluster, dirty: map[string]bool{}, kickc: make(chan struct{}, 1)}
	if cs, ok := o.Store.(ClusterStore); ok {
		m.cluster = cs
		if m.copts.MinBlockAge <= 0 {
			m.copts.MinBlockAge = 30 * time.Second
		}
		if m.copts.Resync <= 0 {
			m.copts.Resync = 5 * time.Second
		}
		if m.copts.DefaultPool == "" {
			m.copts.DefaultPool = "default"
		}
		cs.Watch(m.kick)
	}
	return m, nil
}

// ValidatePool checks a pool definition and fills defaults.
func ValidatePool(p *store.Pool) error {
	if err := ValidateName(p.Name); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidPool, err)
	}
	if p.BlockSizeBits == 0 {
		p.BlockSizeBits = DefaultBlockSizeBits
	}
	if _, err := NewGeometry(p.Subnets, p.BlockSizeBits, p.Reserved); err != nil {
		return fmt.Errorf("%w %q: %v", ErrInvalidPool, p.Name, err)
	}
	return nil
}

// ValidateName accepts DNS-label-like names (what Kubernetes would accept
// for an object name): 1-63 of [a-z0-9-.], starting and ending alphanumeric.
func ValidateName(n string) error {
	if n == "" || len(n) > 63 {
		return fmt.Errorf("name %q must be 1-63 characters", n)
	}
	for i, c := range n {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && !(c == '-' || c == '.') || (i == 0 || i == len(n)-1) && !alnum {
			return fmt.Errorf("name %q: use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit", n)
		}
	}
	return nil
}

// CreatePool validates p and stores it; subnets overlapping another pool's
// are refused.
func (m *Manager) CreatePool(ctx context.Context, p store.Pool) (store.Pool, error) {
	if err := ValidatePool(&p); err != nil {
		return p, err
	}
	if p.Created.IsZero() {
		p.Created = time.Now().UTC()
	}
	err := m.st.CreatePool(ctx, p, func(existing []store.Pool) error {
		for _, e := range existing {
			if a, b, ok := Overlaps(p.Subnets, e.Subnets); ok {
				return fmt.Errorf("%w: subnet %v of pool %q overlaps %v of pool %q", ErrInvalidPool, a, p.Name, b, e.Name)
			}
		}
		return nil
	})
	return p, err
}

// DeletePool deletes a pool no attachment holds, with its blocks, and
// reports the change through OnBlocksChanged (the export must stop
// announcing them). The error names the holders otherwise.
func (m *Manager) DeletePool(ctx context.Context, name string) error {
	err := m.st.DeletePool(ctx, name, func(holders []store.Attachment) error {
		if len(holders) == 0 {
			return nil
		}
		store.SortAttachments(holders)
		var names []string
		for i, h := range holders {
			if i == 5 {
				names = append(names, fmt.Sprintf("and %d more", len(holders)-5))
				break
			}
			names = append(names, h.AttachmentKey.String())
		}
		return fmt.Errorf("pool %q is in use by %d attachment(s): %s: %w", name, len(holders), strings.Join(names, ", "), store.ErrConflict)
	})
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %q", ErrPoolNotFound, name)
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.pools, name)
	m.mu.Unlock()
	m.changed()
	return nil
}

// pool returns the in-memory state of a pool, loading it on first use.
func (m *Manager) pool(ctx context.Context, name string) (*poolState, error) {
	m.mu.RLock()
	ps := m.pools[name]
	m.mu.RUnlock()
	if ps != nil {
		return ps, nil
	}
	def, err := m.st.GetPool(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %q", ErrPoolNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	if ps, err = m.newPoolState(ctx, def); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if other := m.pools[name]; other != nil {
		return other, nil
	}
	m.pools[name] = ps
	return ps, nil
}

// newPoolState is the in-memory state of pool def with the blocks the
// store says this node owns.
func (m *Manager) newPoolState(ctx context.Context, def store.Pool) (*poolState, error) {
	geo, err := NewGeometry(def.Subnets, def.BlockSizeBits, def.Reserved)
	if err != nil {
		return nil, fmt.Errorf("stored pool %q: %w", def.Name, err)
	}
	var blocks []store.Block
	if m.cluster != nil {
		blocks, err = m.cluster.NodeBlocks(ctx, def.Name, m.node)
	} else {
		blocks, err = m.st.ListBlocks(ctx, def.Name)
	}
	if err != nil {
		return nil, err
	}
	ps := &poolState{def: def, geo: geo, blocks: map[uint32]*blockState{}, deleting: def.Deleting}
	for _, b := range blocks {
		if b.Node == m.node && b.Index < geo.Blocks() {
			ps.addBlock(b.Index).emptySince = time.Now()
		}
	}
	return ps, nil
}

func (ps *poolState) addBlock(i uint32) *blockState {
	if b := ps.blocks[i]; b != nil {
		// Claimed again by this node after it was lost (deleted behind
		// its back, then free): its pods' addresses are in a block of
		// its own once more.
		b.lost = false
		return b
	}
	v4, v6 := ps.geo.Families()
	b := &blockState{index: i}
	size := ps.geo.BlockSize()
	if v4 {
		b.v4, b.rsv4 = newBitmap(size), newBitmap(size)
	}
	if v6 {
		b.v6, b.rsv6 = newBitmap(size), newBitmap(size)
	}
	b.applyReserved(ps.geo)
	ps.blocks[i] = b
	pos, _ := slices.BinarySearch(ps.order, i)
	ps.order = slices.Insert(ps.order, pos, i)
	for a := range ps.stale {
		if bi, off, ok := ps.geo.Locate(a); ok && bi == i {
			b.hold(a, off)
			delete(ps.stale, a)
		}
	}
	return b
}

// applyReserved makes b's reservations those of geo: offsets newly
// reserved and free become used, offsets no longer reserved (and not held)
// become free. An address held by an attachment stays held whatever geo
// says; release turns it into a reservation if it is one by then.
func (b *blockState) applyReserved(geo *Geometry) {
	for _, f := range []struct {
		bm, rsv *bitmap
		v6      bool
	}{{b.v4, b.rsv4, false}, {b.v6, b.rsv6, true}} {
		if f.bm == nil {
			continue
		}
		for off := uint32(0); off < f.bm.size; off++ {
			r := geo.Reserved(geo.Addr(b.index, off, f.v6))
			switch {
			case r && !f.bm.test(off):
				f.bm.set(off)
				f.rsv.set(off)
			case !r && f.rsv.test(off):
				f.rsv.clear(off)
				f.bm.clear(off)
			}
		}
	}
}

// hold marks a (at offset off of b) held by an attachment: a reserved
// offset becomes held; it reports false when an attachment held it
// already.
func (b *blockState) hold(a netip.Addr, off uint32) bool {
	bm, rsv := b.v4, b.rsv4
	if a.Is6() {
		bm, rsv = b.v6, b.rsv6
	}
	if bm == nil {
		return false
	}
	if rsv.clear(off) {
		return true // reserved, and now held too
	}
	return bm.set(off)
}

// Request asks for addresses from one pool.
type Request struct {
	Pool string
	// IPv4, IPv6 select the families wanted; both false means every
	// family the pool has.
	IPv4, IPv6 bool
	// Static addresses are taken exactly or the request fails. A family
	// with a static address gets no dynamic one.
	Static []netip.Addr
	// Within, if set, limits dynamic addresses to these prefixes (Docker's
	// --ip-range). It limits only the families it has prefixes of: with
	// an IPv4 range alone, the IPv6 address is any free one.
	Within []netip.Prefix
}

// Allocate takes addresses for one attachment. On error nothing is held.
func (m *Manager) Allocate(ctx context.Context, r Request) (addrs []netip.Addr, err error) {
	ps, err := m.pool(ctx, r.Pool)
	if err != nil {
		return nil, err
	}
	has4, has6 := ps.geo.Families()
	want4, want6 := r.IPv4, r.IPv6
	if !want4 && !want6 {
		want4, want6 = has4, has6
	}
	if want4 && !has4 || want6 && !has6 {
		return nil, fmt.Errorf("%w: pool %q has no subnet of the family asked for", ErrExhausted, r.Pool)
	}

	if m.cluster != nil {
		return m.allocateCluster(ctx, ps, r, want4, want6)
	}
	return m.allocateOnce(ctx, ps, r, want4, want6)
}

// allocateOnce is one try of Allocate under the pool's lock. With a
// ClusterStore it fails with a *needBlock, holding nothing, when the
// request needs a block this node does not have.
func (m *Manager) allocateOnce(ctx context.Context, ps *poolState, r Request, want4, want6 bool) (addrs []netip.Addr, err error) {
	ps.mu.Lock()
	defer m.unlock(ps)
	ps.lastUsed = time.Now()
	// On any failure give back what this request took so far: nothing is
	// held after an error. (addrs and err are the named results.)
	defer func() {
		if err != nil {
			ps.release(addrs)
			addrs = nil
		}
	}()
	for _, a := range r.Static {
		if err := m.takeStatic(ctx, ps, a); err != nil {
			return addrs, err
		}
		addrs = append(addrs, a.Unmap())
		if a.Is4() || a.Is4In6() {
			want4 = false
		} else {
			want6 = false
		}
	}
	for _, v6 := range []bool{false, true} {
		if v6 && !want6 || !v6 && !want4 {
			continue
		}
		a, err := m.takeNext(ctx, ps, v6, r.Within)
		if err != nil {
			return addrs, err
		}
		addrs = append(addrs, a)
	}
	if m.cluster != nil && ps.free() < ps.lowWater() {
		m.kick(ps.def.Name) // Run claims a spare before the pool runs dry
	}
	return addrs, nil
}

// unlock releases ps.mu and then, if a block was claimed meanwhile, tells
// OnBlocksChanged: a callback that reads OwnedBlocks must not find the
// pool's lock held by its own goroutine.
func (m *Manager) unlock(ps *poolState) {
	claimed := ps.claimed
	ps.claimed = false
	ps.mu.Unlock()
	if claimed {
		m.changed()
	}
}

func (m *Manager) takeStatic(ctx context.Context, ps *poolState, a netip.Addr) error {
	a = a.Unmap()
	bi, off, ok := ps.geo.Locate(a)
	if !ok {
		return fmt.Errorf("%w: %v is not in pool %q", ErrOutOfPool, a, ps.def.Name)
	}
	if ps.geo.Reserved(a) {
		return fmt.Errorf("%w: %v is reserved in pool %q", ErrReserved, a, ps.def.Name)
	}
	b := ps.blocks[bi]
	if b != nil && m.cluster != nil && !m.usable(ps, b) {
		return fmt.Errorf("%w: %v is in block %d, which node %q no longer owns", ErrInUse, a, bi, m.node)
	}
	if b == nil && m.cluster != nil {
		return &needBlock{want: &bi}
	}
	if b == nil {
		blk, err := m.st.ClaimBlock(ctx, ps.def.Name, m.node, ps.geo.Blocks(), &bi, nil)
		if errors.Is(err, store.ErrConflict) && blk.Node == "" {
			// A store whose allocator chooses blocks (Kubernetes mode)
			// cannot give this node a block by number.
			return fmt.Errorf("%w: %v is in block %d, which node %q does not hold: %v", ErrInUse, a, bi, m.node, err)
		}
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: %v is in block %d owned by node %q", ErrInUse, a, bi, blk.Node)
		}
		if err != nil {
			return fmt.Errorf("claim block %d of pool %q: %w", bi, ps.def.Name, err)
		}
		b = ps.addBlock(bi)
		ps.claimed = true
	}
	if !b.hold(a, off) {
		return fmt.Errorf("%w: %v is already assigned", ErrInUse, a)
	}
	return nil
}

func (m *Manager) takeNext(ctx context.Context, ps *poolState, v6 bool, within []netip.Prefix) (netip.Addr, error) {
	within = familyOf(within, v6)
	for n := 0; n < len(ps.order); n++ {
		pos := (ps.cursor + n) % len(ps.order)
		b := ps.blocks[ps.order[pos]]
		if m.cluster != nil && !m.usable(ps, b) {
			continue
		}
		if a, ok := ps.takeIn(b, v6, within); ok {
			ps.cursor = pos
			return a, nil
		}
	}
	// Every owned block is full for this family: claim another one with
	// an address to hand out (not every one reserved; in within, if
	// given). A block with none is never claimed: it would fail this
	// request and, claimed, be skipped forever after.
	if m.cluster != nil {
		return netip.Addr{}, &needBlock{v6: v6, within: within}
	}
	blk, err := m.claimWithin(ctx, ps, ps.geo.usableBlocks(within, v6))
	if errors.Is(err, store.ErrExhausted) {
		return netip.Addr{}, fmt.Errorf("%w in pool %q", ErrExhausted, ps.def.Name)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("claim block of pool %q: %w", ps.def.Name, err)
	}
	b := ps.addBlock(blk.Index)
	ps.claimed = true
	ps.cursor, _ = slices.BinarySearch(ps.order, blk.Index)
	if a, ok := ps.takeIn(b, v6, within); ok {
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("%w in pool %q (new block %d has no usable address)", ErrExhausted, ps.def.Name, blk.Index)
}

// claimWithin claims the lowest free block in ranges. The store's ok
// filter would test every index from 0 (2^32 of them in an IPv6 /64 pool),
// so the free index is found here from the claimed blocks and asked for by
// number; losing it to another node's claim meanwhile means trying again.
// store.ErrExhausted when ranges hold no free block.
func (m *Manager) claimWithin(ctx context.Context, ps *poolState, ranges []indexRange) (store.Block, error) {
	const attempts = 5
	for range attempts {
		claimed, err := m.st.ListBlocks(ctx, ps.def.Name)
		if err != nil {
			return store.Block{}, err
		}
		taken := make([]uint32, 0, len(claimed))
		for _, b := range claimed {
			taken = append(taken, b.Index)
		}
		slices.Sort(taken)
		i, ok := lowestFree(ranges, taken)
		if !ok {
			return store.Block{}, store.ErrExhausted
		}
		blk, err := m.st.ClaimBlock(ctx, ps.def.Name, m.node, ps.geo.Blocks(), &i, nil)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		return blk, err
	}
	return store.Block{}, fmt.Errorf("lost the race for a free block %d times: %w", attempts, store.ErrConflict)
}

// lowestFree returns the lowest index in ranges not in taken (sorted).
func lowestFree(ranges []indexRange, taken []uint32) (uint32, bool) {
	best, found := uint32(0), false
	for _, r := range ranges {
		i := r.start
		k, _ := slices.BinarySearch(taken, i)
		for k < len(taken) && taken[k] == i && i < r.end {
			i++
			k++
		}
		if i < r.end && (!found || i < best) {
			best, found = i, true
		}
	}
	return best, found
}

// familyOf returns the prefixes of within in the family of v6. Within
// restricts only the families it names: a dual-stack request with an IPv4
// range (Docker's --ip-range) still gets any free IPv6 address.
func familyOf(within []netip.Prefix, v6 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, w := range within {
		if w.IsValid() && w.Addr().Is6() == v6 {
			out = append(out, w)
		}
	}
	return out
}

func blockIntersects(g *Geometry, i uint32, v6 bool, within []netip.Prefix) bool {
	if len(within) == 0 {
		return true
	}
	p4, p6 := g.BlockPrefixes(i)
	p := p4
	if v6 {
		p = p6
	}
	for _, w := range within {
		if w.Overlaps(p) {
			return true
		}
	}
	return false
}

func (ps *poolState) takeIn(b *blockState, v6 bool, within []netip.Prefix) (netip.Addr, bool) {
	bm := b.v4
	if v6 {
		bm = b.v6
	}
	if bm == nil || bm.full() {
		return netip.Addr{}, false
	}
	var ok func(uint32) bool
	if len(within) > 0 {
		if !blockIntersects(ps.geo, b.index, v6, within) {
			return netip.Addr{}, false
		}
		ok = func(off uint32) bool {
			a := ps.geo.Addr(b.index, off, v6)
			for _, w := range within {
				if w.Contains(a) {
					return true
				}
			}
			return false
		}
	}
	off, found := bm.next(ok)
	if !found {
		return netip.Addr{}, false
	}
	return ps.geo.Addr(b.index, off, v6), true
}

// release clears addrs in ps (an address reserved meanwhile stays used,
// as a reservation); the caller holds ps.mu. A block left empty is marked
// so (giveBack), and a lost one is forgotten.
func (ps *poolState) release(addrs []netip.Addr) {
	for _, a := range addrs {
		a = a.Unmap()
		delete(ps.stale, a)
		bi, off, ok := ps.geo.Locate(a)
		if !ok {
			continue
		}
		b := ps.blocks[bi]
		if b == nil {
			continue
		}
		bm, rsv := b.v4, b.rsv4
		if a.Is6() {
			bm, rsv = b.v6, b.rsv6
		}
		if bm == nil || !bm.test(off) || rsv.test(off) {
			continue // free, or a reservation: not an attachment's
		}
		if ps.geo.Reserved(a) {
			rsv.set(off) // reserved since it was handed out
		} else {
			bm.clear(off)
		}
		if b.held() == 0 {
			b.emptySince = time.Now()
			if b.lost {
				ps.dropBlock(bi)
			}
		}
	}
}

// Release frees addrs of pool. Unknown pools and addresses are ignored:
// release is idempotent.
func (m *Manager) Release(ctx context.Context, pool string, addrs []netip.Addr) {
	ps, err := m.pool(ctx, pool)
	if err != nil {
		return
	}
	ps.mu.Lock()
	ps.release(addrs)
	ps.lastUsed = time.Now()
	m.unlock(ps)
	m.kick(pool) // a block may be empty now (Run gives it back in time)
}

func (b *blockState) inUse() bool { return b.held() > 0 }

// FreeUnusedBlocks runs on start, after Restore, with a ClusterStore:
// blocks a crash left claimed but unused go back to the cluster (keeping
// a spare for each pool in use), and the default pool gets its spare
// before the node serves its first pod. It returns how many blocks it
// gave back. Without a ClusterStore it does nothing (the embedded store
// keeps a node's blocks).
func (m *Manager) FreeUnusedBlocks(ctx context.Context) (int, error) {
	if m.cluster == nil {
		return 0, nil
	}
	return m.tend(ctx, true)
}

// Restore marks addresses of an existing attachment used, on start. The
// block must be this node's (claimed for it if free). Addresses held
// already give a *DupError once the others are restored.
func (m *Manager) Restore(ctx context.Context, pool string, addrs []netip.Addr) error {
	ps, err := m.pool(ctx, pool)
	if err != nil {
		return err
	}
	ps.mu.Lock()
	defer m.unlock(ps)
	var dup []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		bi, off, ok := ps.geo.Locate(a)
		if !ok {
			return fmt.Errorf("%w: %v is not in pool %q", ErrOutOfPool, a, pool)
		}
		b := ps.blocks[bi]
		if b == nil {
			if _, err := m.st.ClaimBlock(ctx, pool, m.node, ps.geo.Blocks(), &bi, nil); err != nil {
				return fmt.Errorf("restore %v: %w", a, err)
			}
			b = ps.addBlock(bi)
			ps.claimed = true
		}
		bm := b.v4
		if a.Is6() {
			bm = b.v6
		}
		if !b.hold(a, off) {
			dup = append(dup, a)
		}
		// Start the search after the highest restored offset so freshly
		// freed addresses are not the first handed out after a restart.
		// The cursor is not wrapped here (next wraps it): wrapping would
		// let a lower offset restored later pull it back.
		if off+1 > bm.cursor {
			bm.cursor = off + 1
		}
	}
	if len(dup) > 0 {
		return &DupError{Addrs: dup}
	}
	return nil
}

// DupError is Restore's error for addresses that were held already; it
// wraps ErrInUse. The other addresses of the call were restored.
type DupError struct {
	Addrs []netip.Addr
}

func (e *DupError) Error() string {
	return fmt.Sprintf("%v: %v restored twice (two records hold it)", ErrInUse, e.Addrs)
}

func (e *DupError) Unwrap() error { return ErrInUse }

// Usage describes a pool's use on this node.
type Usage struct {
	Blocks      uint32 // blocks this node owns
	Used        uint64 // addresses held by attachments (both families)
	Free        uint64 // addresses free in owned blocks
	CapacityV4  uint64 // usable IPv4 addresses in the whole pool (approx.: minus reservations in owned blocks)
	CapacityV6  uint64
	TotalBlocks uint32
}

// Usage reports how much of pool this node uses.
func (m *Manager) Usage(ctx context.Context, pool string) (Usage, error) {
	ps, err := m.pool(ctx, pool)
	if err != nil {
		return Usage{}, err
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	u := Usage{Blocks: uint32(len(ps.blocks)), TotalBlocks: ps.geo.Blocks()}
	has4, has6 := ps.geo.Families()
	per := uint64(ps.geo.BlockSize()) * uint64(ps.geo.Blocks())
	if has4 {
		u.CapacityV4 = per
	}
	if has6 {
		u.CapacityV6 = per
	}
	for _, b := range ps.blocks {
		if b.v4 != nil {
			u.Used += uint64(b.v4.used - b.rsv4.used)
			u.Free += uint64(b.v4.size - b.v4.used)
		}
		if b.v6 != nil {
			u.Used += uint64(b.v6.used - b.rsv6.used)
			u.Free += uint64(b.v6.size - b.v6.used)
		}
	}
	return u, nil
}

// LoadAll loads every stored pool, so OwnedBlocks covers them.
func (m *Manager) LoadAll(ctx context.Context) error {
	pools, err := m.st.ListPools(ctx)
	if err != nil {
		return err
	}
	for _, p := range pools {
		if _, err := m.pool(ctx, p.Name); err != nil {
			return err
		}
	}
	return nil
}

// Pool returns a pool's definition and geometry.
func (m *Manager) Pool(ctx context.Context, name string) (store.Pool, *Geometry, error) {
	ps, err := m.pool(ctx, name)
	if err != nil {
		return store.Pool{}, nil, err
	}
	return ps.def, ps.geo, nil
}

// OwnedBlocks lists the prefixes of every block this node owns in the
// pools loaded so far, for route export.
func (m *Manager) OwnedBlocks() []netip.Prefix {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []netip.Prefix
	for _, ps := range m.pools {
		ps.mu.Lock()
		for _, i := range ps.order {
			if ps.blocks[i].lost {
				continue // another node's now: its routes lead there
			}
			v4, v6 := ps.geo.BlockPrefixes(i)
			for _, p := range []netip.Prefix{v4, v6} {
				if p.IsValid() {
					out = append(out, p)
				}
			}
		}
		ps.mu.Unlock()
	}
	return out
}

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
	// gen counts each pool name's deletions (under mu): a state loaded
	// from the store while the pool was deleted is not kept (pool).
	gen map[string]uint64

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
	m := &Manager{st: o.Store, node: o.Node, changed: changed, log: log, pools: map[string]*poolState{}, gen: map[string]uint64{},
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
	if err := checkPairs(p.Subnets); err != nil {
		return fmt.Errorf("%w %q: %v", ErrInvalidPool, p.Name, err)
	}
	return nil
}

// checkPairs refuses a dual-stack pool whose IPv6 subnet is smaller than
// the IPv4 subnet it pairs with (the n-th of each family): a block pairs
// an IPv4 range with an IPv6 one of the same size, so the IPv4 addresses
// beyond the IPv6 subnet's size could never be handed out, and IPv4
// addresses are the scarce ones. (A larger IPv6 subnet leaves only IPv6
// addresses unused.) Pools stored before this check still load.
func checkPairs(subnets []netip.Prefix) error {
	var v4s, v6s []netip.Prefix
	for _, p := range subnets {
		if p.Addr().Is4() {
			v4s = append(v4s, p)
		} else {
			v6s = append(v6s, p)
		}
	}
	for i := range min(len(v4s), len(v6s)) {
		host4, host6 := 32-v4s[i].Bits(), 128-v6s[i].Bits()
		if host6 < host4 {
			return fmt.Errorf("IPv6 subnet %v (2^%d addresses) is smaller than the IPv4 subnet %v (2^%d) it pairs with: only 2^%d of those IPv4 addresses could be used; give an IPv6 subnet of /%d or shorter",
				v6s[i], host6, v4s[i], host4, host6, 128-host4)
		}
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
	m.gen[name]++
	m.mu.Unlock()
	m.changed()
	return nil
}

// pool returns the in-memory state of a pool, loading it on first use.
func (m *Manager) pool(ctx context.Context, name string) (*poolState, error) {
	for try := 0; ; try++ {
		m.mu.RLock()
		ps, gen := m.pools[name], m.gen[name]
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
		if other := m.pools[name]; other != nil {
			m.mu.Unlock()
			return other, nil
		}
		if m.gen[name] == gen {
			m.pools[name] = ps
			m.mu.Unlock()
			return ps, nil
		}
		m.mu.Unlock()
		// Deleted while it was read (and perhaps made again): what was
		// read may be the old pool. Read it again.
		if try == 3 {
			return nil, fmt.Errorf("%w: pool %q is being deleted and made again", ErrTryAgain, name)
		}
	}
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

// ExportedBlocks is OwnedBlocks while the node may act on its blocks,
// and none while its store fences it (Fencer): another node may be
// getting them, and two nodes must not route one block.
func (m *Manager) ExportedBlocks() []netip.Prefix {
	if m.fenced() != nil {
		return nil
	}
	if m.cluster == nil {
		return m.OwnedBlocks()
	}
	// The store's word, not only the blocks' lost marks: a block the
	// store stopped owning (one found taken when the fence lifted) is
	// marked lost only when something next looks at it.
	return m.blocks(func(pool string, i uint32) bool { return m.cluster.Owns(pool, i, m.node) })
}

// OwnedBlocks lists the prefixes of every block this node owns in the
// pools loaded so far.
func (m *Manager) OwnedBlocks() []netip.Prefix {
	return m.blocks(func(string, uint32) bool { return true })
}

// blocks lists the prefixes of the blocks not lost (another node's now:
// their routes lead there) for which keep says yes.
func (m *Manager) blocks(keep func(pool string, index uint32) bool) []netip.Prefix {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []netip.Prefix
	for _, ps := range m.pools {
		ps.mu.Lock()
		for _, i := range ps.order {
			if ps.blocks[i].lost || !keep(ps.def.Name, i) {
				continue
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

// Room is nil when an ADD on pool could get its addresses now, one of
// each family the pool has: a free address in a block this node can hand
// out from, or a block it could claim (not fully reserved, claimed by no
// node). Otherwise it says which family has no room (ErrExhausted), or
// why the node cannot hand out any (ErrTryAgain while fenced). It changes
// nothing.
func (m *Manager) Room(ctx context.Context, pool string) error {
	ps, err := m.pool(ctx, pool)
	if err != nil {
		return err
	}
	if m.cluster != nil {
		if err := m.fenced(); err != nil {
			return fmt.Errorf("%w: %w", ErrTryAgain, err)
		}
	}
	has4, has6 := ps.geo.Families()
	need := map[bool]bool{}
	if has4 {
		need[false] = true
	}
	if has6 {
		need[true] = true
	}
	ps.mu.Lock()
	if ps.deleting {
		ps.mu.Unlock()
		return fmt.Errorf("%w: pool %q is being deleted", ErrExhausted, pool)
	}
	for _, b := range ps.blocks {
		if b.lost || b.releasing || (m.cluster != nil && !m.cluster.Owns(pool, b.index, m.node)) {
			continue
		}
		if b.v4 != nil && !b.v4.full() {
			delete(need, false)
		}
		if b.v6 != nil && !b.v6.full() {
			delete(need, true)
		}
	}
	atLimit := m.cluster != nil && ps.def.MaxBlocksPerNode > 0 && ps.live() >= ps.def.MaxBlocksPerNode
	ps.mu.Unlock()
	if len(need) == 0 {
		return nil
	}
	if atLimit {
		return fmt.Errorf("%w: node %q holds %d blocks of pool %q, its maxBlocksPerNode, and they are full", ErrExhausted, m.node, ps.def.MaxBlocksPerNode, pool)
	}
	claimed, err := m.st.ListBlocks(ctx, pool)
	if err != nil {
		return err
	}
	taken := make([]uint32, 0, len(claimed))
	for _, b := range claimed {
		taken = append(taken, b.Index)
	}
	slices.Sort(taken)
	for v6 := range need {
		if _, ok := lowestFree(ps.geo.usableBlocks(nil, v6), taken); !ok {
			fam := "IPv4"
			if v6 {
				fam = "IPv6"
			}
			return fmt.Errorf("%w: no free %s address in pool %q on this node, and no block left to claim", ErrExhausted, fam, pool)
		}
	}
	return nil
}

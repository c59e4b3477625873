package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/skeinnet/skein/internal/store"
)

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

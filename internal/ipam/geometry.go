package ipam

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// DefaultBlockSizeBits gives blocks of 32 addresses, as Coil does.
const DefaultBlockSizeBits = 5

// MaxBlockSizeBits bounds the per-block bitmap (8 KiB at 16 bits).
const MaxBlockSizeBits = 16

// Geometry is the arithmetic of one pool: which block an address is in and
// which addresses a block holds.
//
// A pool's subnets are grouped in slots: the i-th IPv4 subnet pairs with the
// i-th IPv6 subnet (a pool is IPv4-only, IPv6-only, or has as many subnets
// of each family). Block b of a slot covers the b-th 2^bits slice of each
// family's subnet, so a dual-stack block always has both families.
type Geometry struct {
	bits     int
	slots    []slot
	reserved []addrRange
	total    uint32
}

type slot struct {
	v4, v6 netip.Prefix // either may be invalid (absent)
	first  uint32       // index of the slot's first block
	blocks uint32
}

type addrRange struct{ first, last netip.Addr }

func (r addrRange) contains(a netip.Addr) bool {
	return a.BitLen() == r.first.BitLen() && r.first.Compare(a) <= 0 && a.Compare(r.last) <= 0
}

// Families reports which address families the pool serves.
func (g *Geometry) Families() (v4, v6 bool) {
	return g.slots[0].v4.IsValid(), g.slots[0].v6.IsValid()
}

// Blocks is the number of blocks in the pool.
func (g *Geometry) Blocks() uint32 { return g.total }

// BlockSize is the number of addresses per family in one block.
func (g *Geometry) BlockSize() uint32 { return 1 << g.bits }

// NewGeometry validates a pool definition and returns its geometry.
// bits 0 means DefaultBlockSizeBits.
func NewGeometry(subnets []netip.Prefix, bits int, reserved []string) (*Geometry, error) {
	if bits == 0 {
		bits = DefaultBlockSizeBits
	}
	if bits < 0 || bits > MaxBlockSizeBits {
		return nil, fmt.Errorf("blockSizeBits %d out of range 1-%d", bits, MaxBlockSizeBits)
	}
	if len(subnets) == 0 {
		return nil, errors.New("a pool needs at least one subnet")
	}
	var v4s, v6s []netip.Prefix
	for _, p := range subnets {
		if !p.IsValid() {
			return nil, fmt.Errorf("invalid subnet %v", p)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("subnet %v has host bits set (did you mean %v?)", p, p.Masked())
		}
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("subnet %v: use the plain IPv4 form", p)
		}
		host := p.Addr().BitLen() - p.Bits()
		if host < bits {
			return nil, fmt.Errorf("subnet %v is smaller than one block of 2^%d addresses", p, bits)
		}
		if p.Addr().Is4() {
			v4s = append(v4s, p)
		} else {
			v6s = append(v6s, p)
		}
	}
	if len(v4s) > 0 && len(v6s) > 0 && len(v4s) != len(v6s) {
		return nil, fmt.Errorf("a dual-stack pool needs as many IPv6 subnets as IPv4 subnets (have %d and %d)", len(v4s), len(v6s))
	}
	for i, a := range subnets {
		for _, b := range subnets[i+1:] {
			if a.Overlaps(b) {
				return nil, fmt.Errorf("subnets %v and %v overlap", a, b)
			}
		}
	}
	g := &Geometry{bits: bits}
	n := max(len(v4s), len(v6s))
	var sum uint64
	for i := 0; i < n; i++ {
		var s slot
		s.blocks = ^uint32(0)
		if i < len(v4s) {
			s.v4 = v4s[i]
			s.blocks = min(s.blocks, blockCount(v4s[i], bits))
		}
		if i < len(v6s) {
			s.v6 = v6s[i]
			s.blocks = min(s.blocks, blockCount(v6s[i], bits))
		}
		sum += uint64(s.blocks)
		g.slots = append(g.slots, s)
	}
	// Block indices are 32 bits. When the slots hold more blocks than
	// that (IPv6 /64s), each slot gets an equal share, so no subnet of the
	// pool is left without blocks.
	if sum > uint64(^uint32(0)) {
		share := ^uint32(0) / uint32(n)
		for i := range g.slots {
			g.slots[i].blocks = min(g.slots[i].blocks, share)
		}
	}
	for i := range g.slots {
		g.slots[i].first = g.total
		g.total += g.slots[i].blocks
	}
	// The network and broadcast addresses of an IPv4 subnet and the
	// subnet-router anycast address of an IPv6 subnet are never handed out:
	// a runtime that imposes the subnet's mask (Docker) treats them
	// specially.
	for _, p := range v4s {
		g.reserved = append(g.reserved, addrRange{p.Addr(), p.Addr()}, addrRange{lastAddr(p), lastAddr(p)})
	}
	for _, p := range v6s {
		g.reserved = append(g.reserved, addrRange{p.Addr(), p.Addr()})
	}
	for _, r := range reserved {
		ar, err := parseRange(r)
		if err != nil {
			return nil, err
		}
		g.reserved = append(g.reserved, ar...)
	}
	return g, nil
}

func blockCount(p netip.Prefix, bits int) uint32 {
	shift := p.Addr().BitLen() - p.Bits() - bits
	if shift >= 32 {
		return ^uint32(0)
	}
	return 1 << shift
}

// parseRange parses an address, a CIDR or "first-last" into ranges.
func parseRange(s string) ([]addrRange, error) {
	s = strings.TrimSpace(s)
	if first, last, ok := strings.Cut(s, "-"); ok {
		a, err1 := netip.ParseAddr(strings.TrimSpace(first))
		b, err2 := netip.ParseAddr(strings.TrimSpace(last))
		a, b = a.Unmap(), b.Unmap()
		if err1 != nil || err2 != nil || a.BitLen() != b.BitLen() || b.Less(a) {
			return nil, fmt.Errorf("invalid address range %q (want FIRST-LAST of one family, FIRST <= LAST)", s)
		}
		return []addrRange{{a, b}}, nil
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("invalid reserved CIDR %q: %w", s, err)
		}
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("invalid reserved CIDR %q: use the plain IPv4 form", s)
		}
		p = p.Masked()
		return []addrRange{{p.Addr(), lastAddr(p)}}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return nil, fmt.Errorf("invalid reserved address %q", s)
	}
	a = a.Unmap()
	return []addrRange{{a, a}}, nil
}

// Reserved reports whether the pool never hands out a.
func (g *Geometry) Reserved(a netip.Addr) bool {
	for _, r := range g.reserved {
		if r.contains(a) {
			return true
		}
	}
	return false
}

// SliceReserved reports whether the pool reserves every address of block
// i's slice of a family (IPv6 when v6); false when the pool lacks the
// family. No address of such a slice is ever handed out, so a block claimed
// for it is no node's to route.
func (g *Geometry) SliceReserved(i uint32, v6 bool) bool {
	v4p, v6p := g.BlockPrefixes(i)
	p := v4p
	if v6 {
		p = v6p
	}
	return p.IsValid() && len(g.usableBlocks([]netip.Prefix{p}, v6)) == 0
}

// BlockPrefixes returns the slices of block i; a family the pool lacks is
// the zero Prefix.
func (g *Geometry) BlockPrefixes(i uint32) (v4, v6 netip.Prefix) {
	s := g.slotOf(i)
	off := uint64(i-s.first) << g.bits
	if s.v4.IsValid() {
		v4 = netip.PrefixFrom(addOffset(s.v4.Addr(), off), 32-g.bits)
	}
	if s.v6.IsValid() {
		v6 = netip.PrefixFrom(addOffset(s.v6.Addr(), off), 128-g.bits)
	}
	return v4, v6
}

func (g *Geometry) slotOf(i uint32) *slot {
	for k := range g.slots {
		s := &g.slots[k]
		if i >= s.first && i-s.first < s.blocks {
			return s
		}
	}
	panic(fmt.Sprintf("ipam: block %d out of range", i))
}

// Addr returns the address at offset off of block i in the family of v6.
func (g *Geometry) Addr(i uint32, off uint32, v6 bool) netip.Addr {
	v4p, v6p := g.BlockPrefixes(i)
	if v6 {
		return addOffset(v6p.Addr(), uint64(off))
	}
	return addOffset(v4p.Addr(), uint64(off))
}

// Locate finds the block and offset of a. ok is false when a is outside
// the pool.
func (g *Geometry) Locate(a netip.Addr) (block, off uint32, ok bool) {
	a = a.Unmap()
	for _, s := range g.slots {
		p := s.v4
		if a.Is6() {
			p = s.v6
		}
		if !p.IsValid() || !p.Contains(a) {
			continue
		}
		d, fits := diff(a, p.Addr())
		b := d >> g.bits
		if !fits || b >= uint64(s.blocks) {
			return 0, 0, false
		}
		return s.first + uint32(b), uint32(d & (1<<g.bits - 1)), true
	}
	return 0, 0, false
}

// indexRange is the block indices [start, end).
type indexRange struct{ start, end uint32 }

// span is the offsets [lo, hi] (inclusive) from the start of a slot's
// subnet in one family.
type span struct{ lo, hi uint64 }

// usableBlocks returns the ranges of blocks, ascending, whose slice of the
// v6 family holds at least one address that is not reserved and, when
// within has prefixes of that family, lies in one of them (prefixes of the
// other family are ignored). A block outside these ranges has nothing to
// hand out in that family: claiming it would cost a store write and fail
// the request (a pool with a reserved /22 would otherwise make 32 requests
// fail, one per block claimed).
//
// The work is interval arithmetic on the reservations, not a walk over
// blocks: a reserved /96 in an IPv6 /64 covers 2^27 blocks.
func (g *Geometry) usableBlocks(within []netip.Prefix, v6 bool) []indexRange {
	within = familyOf(within, v6)
	var out []indexRange
	for _, s := range g.slots {
		p := s.v4
		if v6 {
			p = s.v6
		}
		if !p.IsValid() || s.blocks == 0 {
			continue
		}
		size := uint64(s.blocks) << g.bits // addresses of the slot in use (a /64 has more than 2^32 blocks)
		wanted := []span{{0, size - 1}}
		if len(within) > 0 {
			wanted = wanted[:0]
			for _, w := range within {
				if sp, ok := g.spanOf(p, size, w.Masked().Addr(), lastAddr(w.Masked())); ok {
					wanted = append(wanted, sp)
				}
			}
		}
		var reserved []span
		for _, r := range g.reserved {
			if r.first.Is6() != v6 {
				continue
			}
			if sp, ok := g.spanOf(p, size, r.first, r.last); ok {
				reserved = append(reserved, sp)
			}
		}
		for _, sp := range subtractSpans(mergeSpans(wanted), mergeSpans(reserved)) {
			r := indexRange{s.first + uint32(sp.lo>>g.bits), s.first + uint32(sp.hi>>g.bits) + 1}
			if n := len(out); n > 0 && out[n-1].end >= r.start {
				out[n-1].end = max(out[n-1].end, r.end)
				continue
			}
			out = append(out, r)
		}
	}
	return out
}

// spanOf returns the part of [first, last] inside the first size addresses
// of p, as offsets from p's first address; ok is false when they do not
// meet.
func (g *Geometry) spanOf(p netip.Prefix, size uint64, first, last netip.Addr) (span, bool) {
	base := p.Addr()
	end := addOffset(base, size-1)
	if first.BitLen() != base.BitLen() || last.Less(base) || end.Less(first) {
		return span{}, false
	}
	sp := span{0, size - 1}
	if base.Less(first) {
		sp.lo, _ = diff(first, base)
	}
	if last.Less(end) {
		sp.hi, _ = diff(last, base)
	}
	return sp, true
}

// mergeSpans sorts spans and joins those that overlap or touch.
func mergeSpans(spans []span) []span {
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	var out []span
	for _, sp := range spans {
		if n := len(out); n > 0 && (sp.lo <= out[n-1].hi || sp.lo == out[n-1].hi+1) {
			out[n-1].hi = max(out[n-1].hi, sp.hi)
			continue
		}
		out = append(out, sp)
	}
	return out
}

// subtractSpans returns the parts of a (merged, ascending) not in b
// (merged, ascending).
func subtractSpans(a, b []span) []span {
	var out []span
	k := 0
	for _, sp := range a {
		lo := sp.lo
		for k < len(b) && b[k].hi < lo {
			k++
		}
		j := k
		for ; j < len(b) && b[j].lo <= sp.hi; j++ {
			if b[j].lo > lo {
				out = append(out, span{lo, b[j].lo - 1})
			}
			if b[j].hi >= sp.hi {
				lo = sp.hi + 1
				break
			}
			lo = b[j].hi + 1
		}
		if lo <= sp.hi {
			out = append(out, span{lo, sp.hi})
		}
	}
	return out
}

// Contains reports whether a lies in one of the pool's subnets.
func (g *Geometry) Contains(a netip.Addr) bool {
	_, _, ok := g.Locate(a)
	return ok
}

// Overlaps reports whether any subnet of a overlaps any of b.
func Overlaps(a, b []netip.Prefix) (netip.Prefix, netip.Prefix, bool) {
	for _, x := range a {
		for _, y := range b {
			if x.Overlaps(y) {
				return x, y, true
			}
		}
	}
	return netip.Prefix{}, netip.Prefix{}, false
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As16()
	host := p.Addr().BitLen() - p.Bits()
	for i := 15; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	if p.Addr().Is4() {
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return netip.AddrFrom16(b)
}

// addOffset returns a+off (no overflow check: callers stay in a subnet).
func addOffset(a netip.Addr, off uint64) netip.Addr {
	b := a.As16()
	lo := binary.BigEndian.Uint64(b[8:])
	hi := binary.BigEndian.Uint64(b[:8])
	nlo := lo + off
	if nlo < lo {
		hi++
	}
	binary.BigEndian.PutUint64(b[8:], nlo)
	binary.BigEndian.PutUint64(b[:8], hi)
	if a.Is4() {
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return netip.AddrFrom16(b)
}

// diff returns a-base for a >= base; ok is false when the difference does
// not fit 64 bits.
func diff(a, base netip.Addr) (uint64, bool) {
	x, y := a.As16(), base.As16()
	xlo, ylo := binary.BigEndian.Uint64(x[8:]), binary.BigEndian.Uint64(y[8:])
	xhi, yhi := binary.BigEndian.Uint64(x[:8]), binary.BigEndian.Uint64(y[:8])
	lo := xlo - ylo
	if xlo < ylo {
		yhi++
	}
	return lo, xhi == yhi
}

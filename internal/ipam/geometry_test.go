package ipam

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/store"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func mustGeometry(t testing.TB, subnets []string, bits int, reserved ...string) *Geometry {
	t.Helper()
	g, err := NewGeometry(prefixes(subnets...), bits, reserved)
	if err != nil {
		t.Fatalf("NewGeometry(%v, %d, %v): %v", subnets, bits, reserved, err)
	}
	return g
}

func TestNewGeometryRefuses(t *testing.T) {
	tests := []struct {
		name     string
		subnets  []netip.Prefix
		bits     int
		reserved []string
		want     string // substring of the error
	}{
		{"no subnets", nil, 0, nil, "at least one subnet"},
		{"bits too big", prefixes("10.0.0.0/8"), 17, nil, "out of range"},
		{"bits negative", prefixes("10.0.0.0/8"), -1, nil, "out of range"},
		{"invalid prefix", []netip.Prefix{{}}, 0, nil, "invalid subnet"},
		{"host bits v4", prefixes("10.0.0.1/24"), 0, nil, "host bits set (did you mean 10.0.0.0/24?)"},
		{"host bits v6", prefixes("fd00::1/64"), 0, nil, "host bits set"},
		{"mapped v4", prefixes("::ffff:10.0.0.0/120"), 0, nil, "plain IPv4 form"},
		{"smaller than block", prefixes("10.0.0.0/28"), 5, nil, "smaller than one block"},
		{"smaller than big block", prefixes("fd00::/120"), 16, nil, "smaller than one block"},
		{"unequal families", prefixes("10.0.0.0/24", "10.1.0.0/24", "fd00::/64"), 0, nil, "as many IPv6 subnets as IPv4 subnets (have 2 and 1)"},
		{"overlap v4", prefixes("10.0.0.0/16", "10.0.1.0/24"), 0, nil, "10.0.0.0/16 and 10.0.1.0/24 overlap"},
		{"duplicate", prefixes("10.0.0.0/24", "10.0.0.0/24"), 0, nil, "overlap"},
		{"overlap v6", prefixes("10.0.0.0/24", "10.1.0.0/24", "fd00::/48", "fd00:0:0:1::/64"), 0, nil, "overlap"},
		{"reserved garbage", prefixes("10.0.0.0/24"), 0, []string{"ten"}, `invalid reserved address "ten"`},
		{"reserved bad cidr", prefixes("10.0.0.0/24"), 0, []string{"10.0.0.0/33"}, "invalid reserved CIDR"},
		{"reserved range reversed", prefixes("10.0.0.0/24"), 0, []string{"10.0.0.9-10.0.0.1"}, "invalid address range"},
		{"reserved range mixed", prefixes("10.0.0.0/24"), 0, []string{"10.0.0.1-fd00::1"}, "invalid address range"},
		{"reserved range half", prefixes("10.0.0.0/24"), 0, []string{"10.0.0.1-"}, "invalid address range"},
		{"reserved empty", prefixes("10.0.0.0/24"), 0, []string{""}, "invalid reserved address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGeometry(tt.subnets, tt.bits, tt.reserved)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestValidatePool(t *testing.T) {
	good := store.Pool{Name: "pool-1.a", Subnets: prefixes("10.0.0.0/24")}
	if err := ValidatePool(&good); err != nil {
		t.Fatal(err)
	}
	if good.BlockSizeBits != DefaultBlockSizeBits {
		t.Fatalf("BlockSizeBits = %d, want default %d", good.BlockSizeBits, DefaultBlockSizeBits)
	}
	for _, name := range []string{"", "Pool", "-a", "a-", ".a", "a_b", "a b", "é", strings.Repeat("a", 64)} {
		p := store.Pool{Name: name, Subnets: prefixes("10.0.0.0/24")}
		if err := ValidatePool(&p); err == nil || !strings.Contains(err.Error(), "invalid pool") {
			t.Errorf("name %q: got %v", name, err)
		}
	}
	for _, name := range []string{"a", "0", "a.b-c", strings.Repeat("a", 63)} {
		if err := ValidateName(name); err != nil {
			t.Errorf("name %q refused: %v", name, err)
		}
	}
	bad := store.Pool{Name: "p", Subnets: prefixes("10.0.0.1/24")}
	if err := ValidatePool(&bad); err == nil || !strings.Contains(err.Error(), `invalid pool "p": subnet 10.0.0.1/24 has host bits set`) {
		t.Fatalf("got %v", err)
	}
	// A dual-stack pool whose IPv6 subnet is smaller than its IPv4 one
	// silently lost the IPv4 addresses beyond the IPv6 subnet's size
	// (a /24 with a /126 gave 3 addresses).
	for subnets, want := range map[string]string{
		"10.90.0.0/24,fd00:90::/122":                        "give an IPv6 subnet of /120 or shorter",
		"10.64.0.0/16,fd00::/120":                           "only 2^8 of those IPv4 addresses could be used",
		"10.1.0.0/24,fd00:1::/120,10.2.0.0/16,fd00:2::/112": "",
		"10.1.0.0/24,fd00:1::/64":                           "",
	} {
		p := store.Pool{Name: "d", Subnets: prefixes(strings.Split(subnets, ",")...)}
		err := ValidatePool(&p)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", subnets, err, want)
		}
	}
}

func TestGeometryShape(t *testing.T) {
	tests := []struct {
		name       string
		subnets    []string
		bits       int
		blocks     uint32
		v4, v6     bool
		index      uint32 // a block to look at
		wantV4     string
		wantV6     string
		wantBlocks uint32
	}{
		{name: "v4 /24", subnets: []string{"10.0.0.0/24"}, blocks: 8, v4: true, index: 7, wantV4: "10.0.0.224/27"},
		{name: "v4 /16 bits 5", subnets: []string{"10.1.0.0/16"}, bits: 5, blocks: 2048, v4: true, index: 2047, wantV4: "10.1.255.224/27"},
		{name: "v4 bits 16", subnets: []string{"10.0.0.0/15"}, bits: 16, blocks: 2, v4: true, index: 1, wantV4: "10.1.0.0/16"},
		{name: "v4 one block", subnets: []string{"10.0.0.0/27"}, blocks: 1, v4: true, index: 0, wantV4: "10.0.0.0/27"},
		{name: "v6 /64 capped", subnets: []string{"fd00::/64"}, blocks: ^uint32(0), v6: true, index: 1, wantV6: "fd00::20/123"},
		{name: "v6 /64 last", subnets: []string{"fd00::/64"}, blocks: ^uint32(0), v6: true, index: ^uint32(0) - 1, wantV6: "fd00::1f:ffff:ffc0/123"},
		{name: "v6 /112 bits 8", subnets: []string{"fd00::/112"}, bits: 8, blocks: 256, v6: true, index: 255, wantV6: "fd00::ff00/120"},
		{name: "dual", subnets: []string{"10.0.0.0/24", "fd00::/120"}, blocks: 8, v4: true, v6: true, index: 3, wantV4: "10.0.0.96/27", wantV6: "fd00::60/123"},
		{name: "dual smaller v6 caps", subnets: []string{"10.0.0.0/16", "fd00::/122"}, blocks: 2, v4: true, v6: true, index: 1, wantV4: "10.0.0.32/27", wantV6: "fd00::20/123"},
		{name: "multi v4", subnets: []string{"10.0.0.0/26", "192.168.0.0/24"}, blocks: 10, v4: true, index: 2, wantV4: "192.168.0.0/27"},
		{name: "two /64 share the index space", subnets: []string{"fd00:a::/64", "fd00:b::/64"}, blocks: ^uint32(0) - 1, v6: true, index: 1<<31 - 1, wantV6: "fd00:b::/123"},
		{name: "small subnet keeps its blocks beside a /64", subnets: []string{"fd00:a::/120", "fd00:b::/64"}, blocks: 8 + 1<<31 - 1, v6: true, index: 8, wantV6: "fd00:b::/123"},
		{name: "multi dual pairs in order", subnets: []string{"10.0.0.0/26", "fd00:1::/120", "192.168.0.0/26", "fd00:2::/120"}, blocks: 4, v4: true, v6: true, index: 3, wantV4: "192.168.0.32/27", wantV6: "fd00:2::20/123"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustGeometry(t, tt.subnets, tt.bits)
			if g.Blocks() != tt.blocks {
				t.Errorf("Blocks = %d, want %d", g.Blocks(), tt.blocks)
			}
			bits := tt.bits
			if bits == 0 {
				bits = DefaultBlockSizeBits
			}
			if g.BlockSize() != 1<<bits {
				t.Errorf("BlockSize = %d", g.BlockSize())
			}
			if v4, v6 := g.Families(); v4 != tt.v4 || v6 != tt.v6 {
				t.Errorf("Families = %v, %v", v4, v6)
			}
			v4, v6 := g.BlockPrefixes(tt.index)
			if got := prefixString(v4); got != tt.wantV4 {
				t.Errorf("block %d v4 = %s, want %s", tt.index, got, tt.wantV4)
			}
			if got := prefixString(v6); got != tt.wantV6 {
				t.Errorf("block %d v6 = %s, want %s", tt.index, got, tt.wantV6)
			}
		})
	}
}

func prefixString(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// TestRoundTrip checks Addr, Locate and BlockPrefixes agree, on the edges
// of every block sampled and on random offsets.
func TestRoundTrip(t *testing.T) {
	pools := []struct {
		subnets []string
		bits    int
	}{
		{[]string{"10.0.0.0/24"}, 0},
		{[]string{"10.1.0.0/16"}, 5},
		{[]string{"10.0.0.0/8"}, 16},
		{[]string{"172.16.0.0/30"}, 1},
		{[]string{"fd00::/64"}, 0},
		{[]string{"fd00:1:2::/48"}, 0},
		{[]string{"fd00:1:2::/48"}, 16},
		{[]string{"2001:db8::/32"}, 7},
		{[]string{"10.0.0.0/24", "fd00::/64"}, 0},
		{[]string{"10.0.0.0/26", "10.9.0.0/16", "192.168.1.0/24"}, 5},
		{[]string{"10.0.0.0/26", "fd00:a::/64", "10.9.0.0/16", "fd00:b::/48"}, 6},
		{[]string{"fd00:a::/64", "fd00:b::/48", "2001:db8:ffff:ffff::/64"}, 0},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range pools {
		g := mustGeometry(t, p.subnets, p.bits)
		has4, has6 := g.Families()
		size := g.BlockSize()
		indices := []uint32{0, 1 % g.Blocks(), g.Blocks() - 1, g.Blocks() / 2}
		for range 50 {
			indices = append(indices, rng.Uint32N(g.Blocks()))
		}
		// Block boundaries of every slot.
		for _, s := range g.slots {
			indices = append(indices, s.first, s.first+s.blocks-1)
		}
		for _, i := range indices {
			v4p, v6p := g.BlockPrefixes(i)
			for _, v6 := range []bool{false, true} {
				bp := v4p
				if v6 {
					bp = v6p
				}
				if has := (v6 && has6) || (!v6 && has4); !has {
					if bp.IsValid() {
						t.Errorf("%v block %d: prefix %v for a family the pool lacks", p.subnets, i, bp)
					}
					continue
				}
				if bp.Addr().BitLen()-bp.Bits() != g.bits || bp != bp.Masked() {
					t.Errorf("%v block %d: bad prefix %v", p.subnets, i, bp)
				}
				for _, off := range []uint32{0, 1, size - 1, rng.Uint32N(size)} {
					a := g.Addr(i, off, v6)
					if !bp.Contains(a) {
						t.Errorf("%v: Addr(%d, %d) = %v outside block prefix %v", p.subnets, i, off, a, bp)
					}
					bi, bo, ok := g.Locate(a)
					if !ok || bi != i || bo != off {
						t.Errorf("%v: Locate(%v) = %d, %d, %v; want %d, %d", p.subnets, a, bi, bo, ok, i, off)
					}
					if !g.Contains(a) {
						t.Errorf("%v: Contains(%v) false", p.subnets, a)
					}
					if a.Is4() {
						if bi, bo, ok := g.Locate(netip.AddrFrom16(a.As16())); !ok || bi != i || bo != off {
							t.Errorf("%v: Locate of mapped %v = %d, %d, %v", p.subnets, a, bi, bo, ok)
						}
					}
				}
			}
		}
	}
}

func TestContainsOutside(t *testing.T) {
	tests := []struct {
		subnets []string
		out     []string
	}{
		{[]string{"10.0.0.0/24"}, []string{"9.255.255.255", "10.0.1.0", "0.0.0.0", "255.255.255.255", "fd00::1", "::ffff:10.0.1.0"}},
		{[]string{"10.0.0.0/26", "10.0.1.0/26"}, []string{"10.0.0.64", "10.0.0.255", "10.0.1.64"}},
		{[]string{"fd00::/64"}, []string{"fd00:0:0:1::", "fcff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "10.0.0.1"}},
		// A /64 holds more than 2^32 blocks: addresses past the last one
		// are not in the pool.
		{[]string{"fd00::/64"}, []string{"fd00::ffff:ffff:ffff:ffff", "fd00::20:0:0"}},
		// Beyond the 2^32 blocks and beyond 64 bits of offset.
		{[]string{"fd00::/48"}, []string{"fd00:0:0:1::", "fd00:0:0:ffff::1"}},
		// A dual-stack slot has as many blocks as its smaller subnet.
		{[]string{"10.0.0.0/16", "fd00::/120"}, []string{"10.0.1.0", "10.0.255.255"}},
	}
	for _, tt := range tests {
		g := mustGeometry(t, tt.subnets, 0)
		for _, s := range tt.out {
			a := netip.MustParseAddr(s)
			if _, _, ok := g.Locate(a); ok || g.Contains(a) {
				t.Errorf("%v: %s located inside", tt.subnets, s)
			}
		}
	}
}

func TestReserved(t *testing.T) {
	g := mustGeometry(t, []string{"10.0.0.0/24", "fd00::/64"}, 0,
		"10.0.0.5", " 10.0.0.16/30 ", "10.0.0.100 - 10.0.0.102", "fd00::10-fd00::12", "fd00::8/127", "::ffff:10.0.0.200")
	reserved := []string{
		"10.0.0.0", "10.0.0.255", "fd00::", // network, broadcast, subnet-router anycast
		"10.0.0.5", "10.0.0.16", "10.0.0.19", "10.0.0.100", "10.0.0.101", "10.0.0.102",
		"fd00::10", "fd00::11", "fd00::12", "fd00::8", "fd00::9", "10.0.0.200",
	}
	free := []string{
		"10.0.0.1", "10.0.0.4", "10.0.0.6", "10.0.0.15", "10.0.0.20", "10.0.0.99", "10.0.0.103", "10.0.0.254",
		"10.0.0.31", "10.0.0.32", // block edges are not network/broadcast
		"fd00::1", "fd00::f", "fd00::13", "fd00::7", "fd00::a", "fd00::ffff:ffff",
	}
	for _, s := range reserved {
		if !g.Reserved(netip.MustParseAddr(s)) {
			t.Errorf("%s not reserved", s)
		}
	}
	for _, s := range free {
		if g.Reserved(netip.MustParseAddr(s)) {
			t.Errorf("%s reserved", s)
		}
	}
	// Every subnet of a multi-subnet pool has its own network and broadcast.
	g = mustGeometry(t, []string{"10.0.0.0/26", "10.0.1.0/26"}, 0)
	for _, s := range []string{"10.0.0.0", "10.0.0.63", "10.0.1.0", "10.0.1.63"} {
		if !g.Reserved(netip.MustParseAddr(s)) {
			t.Errorf("%s not reserved", s)
		}
	}
}

func TestUsableBlocks(t *testing.T) {
	g := mustGeometry(t, []string{"10.0.0.0/24", "fd00::/64", "10.0.1.0/24", "fd01::/64"}, 0)
	tests := []struct {
		within []string
		v6     bool
		want   []indexRange
	}{
		{nil, false, []indexRange{{0, 16}}},
		{nil, true, []indexRange{{0, 16}}},
		{[]string{"10.0.0.0/24"}, false, []indexRange{{0, 8}}},
		{[]string{"10.0.0.0/8"}, false, []indexRange{{0, 16}}},
		{[]string{"10.0.0.64/26"}, false, []indexRange{{2, 4}}},
		{[]string{"10.0.0.70/32"}, false, []indexRange{{2, 3}}},
		{[]string{"10.0.1.200/29"}, false, []indexRange{{14, 15}}},
		{[]string{"10.0.2.0/24"}, false, nil},
		{[]string{"10.0.0.0/24"}, true, []indexRange{{0, 16}}}, // an IPv4 range does not limit IPv6
		{[]string{"fd01::40/122"}, true, []indexRange{{10, 12}}},
		{[]string{"fd00::/48"}, true, []indexRange{{0, 8}}},
		// Only reserved addresses: the network address, the broadcast.
		{[]string{"10.0.0.0/32"}, false, nil},
		{[]string{"10.0.1.255/32", "10.0.0.0/32"}, false, nil},
		// Past the addressable blocks of the /64.
		{[]string{"fd00::1:0:0:0/80"}, true, nil},
	}
	for _, tt := range tests {
		got := g.usableBlocks(prefixes(tt.within...), tt.v6)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%v v6=%v: got %v, want %v", tt.within, tt.v6, got, tt.want)
		}
	}
}

// TestUsableBlocksReserved: blocks every address of which is reserved are
// left out, in either family alone, however the reservations are written.
func TestUsableBlocksReserved(t *testing.T) {
	tests := []struct {
		subnets  []string
		reserved []string
		within   []string
		v6       bool
		want     []indexRange
	}{
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.0/27"}, nil, false, []indexRange{{1, 8}}},
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.224/27"}, nil, false, []indexRange{{0, 7}}},
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.64/26"}, nil, false, []indexRange{{0, 2}, {4, 8}}},
		// Pieces that only together cover block 1; the network address
		// and a range cover block 0.
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.1-10.0.0.40", "10.0.0.41/32", "10.0.0.42-10.0.0.63"}, nil, false, []indexRange{{2, 8}}},
		// One address left free keeps the block.
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.32-10.0.0.62"}, nil, false, []indexRange{{0, 8}}},
		{[]string{"10.0.0.0/16"}, []string{"10.0.0.0/22"}, nil, false, []indexRange{{32, 2048}}},
		// A range reaching past the pool on both sides.
		{[]string{"10.0.0.0/24"}, []string{"9.0.0.0-10.0.0.95"}, nil, false, []indexRange{{3, 8}}},
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.0/8"}, nil, false, nil},
		// Within and reservations together.
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.32/28"}, []string{"10.0.0.32/28", "10.0.0.100/32"}, false, []indexRange{{3, 4}}},
		// Dual stack: each family on its own.
		{[]string{"10.0.0.0/24", "fd00::/120"}, []string{"10.0.0.0/27"}, nil, false, []indexRange{{1, 8}}},
		{[]string{"10.0.0.0/24", "fd00::/120"}, []string{"10.0.0.0/27"}, nil, true, []indexRange{{0, 8}}},
		// 2^27 blocks of an IPv6 /64 reserved: no walk over them.
		{[]string{"fd00::/64"}, []string{"fd00::/96"}, nil, true, []indexRange{{1 << 27, 1<<32 - 1}}},
	}
	for _, tt := range tests {
		g := mustGeometry(t, tt.subnets, 0, tt.reserved...)
		got := g.usableBlocks(prefixes(tt.within...), tt.v6)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%v reserved %v within %v v6=%v: got %v, want %v", tt.subnets, tt.reserved, tt.within, tt.v6, got, tt.want)
		}
		// Cross-check against the slow way on small pools.
		if g.Blocks() > 4096 {
			continue
		}
		for i := range g.Blocks() {
			usable := false
			for off := range g.BlockSize() {
				a := g.Addr(i, off, tt.v6)
				in := len(familyOf(prefixes(tt.within...), tt.v6)) == 0
				for _, w := range familyOf(prefixes(tt.within...), tt.v6) {
					in = in || w.Contains(a)
				}
				usable = usable || in && !g.Reserved(a)
			}
			listed := false
			for _, r := range got {
				listed = listed || r.start <= i && i < r.end
			}
			if usable != listed {
				t.Errorf("%v reserved %v: block %d usable=%v but listed=%v", tt.subnets, tt.reserved, i, usable, listed)
			}
		}
	}
}

func TestSubtractSpans(t *testing.T) {
	tests := []struct{ a, b, want []span }{
		{[]span{{0, 9}}, nil, []span{{0, 9}}},
		{[]span{{0, 9}}, []span{{0, 9}}, nil},
		{[]span{{0, 9}}, []span{{3, 4}}, []span{{0, 2}, {5, 9}}},
		{[]span{{0, 9}}, []span{{0, 0}, {9, 9}}, []span{{1, 8}}},
		{[]span{{0, 4}, {10, 14}}, []span{{3, 11}}, []span{{0, 2}, {12, 14}}},
		{[]span{{5, 6}}, []span{{0, 1}, {8, 9}}, []span{{5, 6}}},
	}
	for _, tt := range tests {
		if got := subtractSpans(tt.a, tt.b); !slices.Equal(got, tt.want) {
			t.Errorf("%v - %v = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestOverlaps(t *testing.T) {
	a, b, ok := Overlaps(prefixes("10.0.0.0/24", "fd00::/64"), prefixes("192.168.0.0/16", "fd00::/48"))
	if !ok || a.String() != "fd00::/64" || b.String() != "fd00::/48" {
		t.Fatalf("got %v %v %v", a, b, ok)
	}
	if _, _, ok := Overlaps(prefixes("10.0.0.0/24"), prefixes("10.0.1.0/24", "fd00::/8")); ok {
		t.Fatal("disjoint prefixes overlap")
	}
}

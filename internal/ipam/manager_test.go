package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/skeinnet/skein/internal/store"
)

func openStore(t testing.TB) *store.Bolt {
	t.Helper()
	s, err := store.OpenBolt(filepath.Join(t.TempDir(), "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newManager(t testing.TB, st store.Store, node string) *Manager {
	t.Helper()
	m, err := NewManager(Options{Store: st, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// setup returns a manager for node n1 over a fresh store holding pool "p".
func setup(t testing.TB, subnets []string, bits int, reserved ...string) (*Manager, *store.Bolt) {
	t.Helper()
	st := openStore(t)
	m := newManager(t, st, "n1")
	createPool(t, m, "p", subnets, bits, reserved...)
	return m, st
}

func createPool(t testing.TB, m *Manager, name string, subnets []string, bits int, reserved ...string) {
	t.Helper()
	if _, err := m.CreatePool(context.Background(), store.Pool{Name: name, Subnets: prefixes(subnets...), BlockSizeBits: bits, Reserved: reserved}); err != nil {
		t.Fatal(err)
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func mustAllocate(t testing.TB, m *Manager, r Request) []netip.Addr {
	t.Helper()
	got, err := m.Allocate(context.Background(), r)
	if err != nil {
		t.Fatalf("Allocate(%+v): %v", r, err)
	}
	return got
}

func usage(t testing.TB, m *Manager, pool string) Usage {
	t.Helper()
	u, err := m.Usage(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestNewManagerRequires(t *testing.T) {
	if _, err := NewManager(Options{Node: "n1"}); err == nil {
		t.Error("no store accepted")
	}
	if _, err := NewManager(Options{Store: openStore(t)}); err == nil {
		t.Error("no node accepted")
	}
}

func TestAllocateFamilies(t *testing.T) {
	tests := []struct {
		name    string
		subnets []string
		r       Request
		want    []string // prefix each address must be in, in order
		wantErr error
	}{
		{name: "v4 default", subnets: []string{"10.0.0.0/24"}, want: []string{"10.0.0.0/24"}},
		{name: "v6 default", subnets: []string{"fd00::/64"}, want: []string{"fd00::/64"}},
		{name: "dual default", subnets: []string{"10.0.0.0/24", "fd00::/64"}, want: []string{"10.0.0.0/24", "fd00::/64"}},
		{name: "dual v4 only", subnets: []string{"10.0.0.0/24", "fd00::/64"}, r: Request{IPv4: true}, want: []string{"10.0.0.0/24"}},
		{name: "dual v6 only", subnets: []string{"10.0.0.0/24", "fd00::/64"}, r: Request{IPv6: true}, want: []string{"fd00::/64"}},
		{name: "dual both", subnets: []string{"10.0.0.0/24", "fd00::/64"}, r: Request{IPv4: true, IPv6: true}, want: []string{"10.0.0.0/24", "fd00::/64"}},
		{name: "v6 from v4 pool", subnets: []string{"10.0.0.0/24"}, r: Request{IPv6: true}, wantErr: ErrExhausted},
		{name: "v4 from v6 pool", subnets: []string{"fd00::/64"}, r: Request{IPv4: true}, wantErr: ErrExhausted},
		{name: "unknown pool", subnets: []string{"10.0.0.0/24"}, r: Request{Pool: "nope"}, wantErr: ErrPoolNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := setup(t, tt.subnets, 0)
			if tt.r.Pool == "" {
				tt.r.Pool = "p"
			}
			got, err := m.Allocate(context.Background(), tt.r)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want addresses in %v", got, tt.want)
			}
			for i, a := range got {
				if !netip.MustParsePrefix(tt.want[i]).Contains(a) {
					t.Errorf("address %d = %v, not in %s", i, a, tt.want[i])
				}
			}
		})
	}
}

// TestAllocateNeverReserved drains a pool and checks every usable address
// came out exactly once and no reserved one did.
func TestAllocateNeverReserved(t *testing.T) {
	reserved := []string{"10.0.0.5", "10.0.0.8/30", "10.0.0.20-10.0.0.22", "10.0.0.40", "fd00::7", "fd00::30-fd00::3f"}
	m, _ := setup(t, []string{"10.0.0.0/26", "fd00::/122"}, 5, reserved...)
	_, g, err := m.Pool(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	const want4 = 64 - 2 - 1 - 4 - 3 - 1 // network, broadcast, reservations
	const want6 = 64 - 1 - 1 - 16        // subnet-router anycast, reservations
	seen := map[netip.Addr]bool{}
	for _, r := range []Request{{IPv4: true}, {IPv6: true}} {
		r.Pool = "p"
		for {
			got, err := m.Allocate(context.Background(), r)
			if errors.Is(err, ErrExhausted) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			a := got[0]
			if g.Reserved(a) || seen[a] {
				t.Fatalf("handed out %v (reserved %v, seen %v)", a, g.Reserved(a), seen[a])
			}
			seen[a] = true
		}
	}
	var n4, n6 int
	for a := range seen {
		if a.Is4() {
			n4++
		} else {
			n6++
		}
	}
	if n4 != want4 || n6 != want6 {
		t.Fatalf("handed out %d v4 and %d v6, want %d and %d", n4, n6, want4, want6)
	}
	for _, s := range []string{"10.0.0.0", "10.0.0.63", "10.0.0.5", "10.0.0.10", "10.0.0.21", "fd00::", "fd00::35"} {
		if seen[netip.MustParseAddr(s)] {
			t.Errorf("reserved %s handed out", s)
		}
	}
	u := usage(t, m, "p")
	if u.Used != want4+want6 || u.Free != 0 || u.Blocks != 2 {
		t.Fatalf("usage = %+v", u)
	}
}

func TestStatic(t *testing.T) {
	ctx := context.Background()
	m, st := setup(t, []string{"10.0.0.0/24", "fd00::/64"}, 0, "10.0.0.9")
	m2 := newManager(t, st, "n2")
	// n2 owns block 2 (10.0.0.64/27).
	if got := mustAllocate(t, m2, Request{Pool: "p", Static: addrs("10.0.0.70")}); len(got) != 2 {
		t.Fatalf("n2 static: %v", got)
	}
	mustAllocate(t, m, Request{Pool: "p", Static: addrs("10.0.0.2")})

	tests := []struct {
		name    string
		r       Request
		wantErr error
		wantMsg string
		want    []string
	}{
		{name: "v4 gets dynamic v6", r: Request{Static: addrs("10.0.0.3")}, want: []string{"10.0.0.3", "fd00::/64"}},
		{name: "v6 gets dynamic v4", r: Request{Static: addrs("fd00::34")}, want: []string{"fd00::34", "10.0.0.0/24"}},
		{name: "both static", r: Request{Static: addrs("10.0.0.200", "fd00::c8")}, want: []string{"10.0.0.200", "fd00::c8"}},
		{name: "static only v4 asked", r: Request{IPv4: true, Static: addrs("10.0.0.4")}, want: []string{"10.0.0.4"}},
		{name: "mapped form", r: Request{IPv4: true, Static: addrs("::ffff:10.0.0.6")}, want: []string{"10.0.0.6"}},
		{name: "new block claimed", r: Request{IPv4: true, Static: addrs("10.0.0.250")}, want: []string{"10.0.0.250"}},
		{name: "taken", r: Request{Static: addrs("10.0.0.2")}, wantErr: ErrInUse, wantMsg: "already assigned"},
		{name: "twice in one request", r: Request{Static: addrs("10.0.0.11", "10.0.0.11")}, wantErr: ErrInUse},
		{name: "reserved", r: Request{Static: addrs("10.0.0.9")}, wantErr: ErrReserved},
		{name: "network", r: Request{Static: addrs("10.0.0.0")}, wantErr: ErrReserved},
		{name: "broadcast", r: Request{Static: addrs("10.0.0.255")}, wantErr: ErrReserved},
		{name: "subnet router", r: Request{Static: addrs("fd00::")}, wantErr: ErrReserved},
		{name: "outside", r: Request{Static: addrs("10.0.1.1")}, wantErr: ErrOutOfPool},
		{name: "outside v6", r: Request{Static: addrs("fd01::1")}, wantErr: ErrOutOfPool},
		// The /64 pairs with a /24: only its first 256 addresses have blocks.
		{name: "v6 past the paired v4", r: Request{Static: addrs("fd00::100")}, wantErr: ErrOutOfPool},
		{name: "other node's block", r: Request{Static: addrs("10.0.0.71")}, wantErr: ErrInUse, wantMsg: `owned by node "n2"`},
		{name: "other node's block v6", r: Request{Static: addrs("fd00::47")}, wantErr: ErrInUse, wantMsg: `owned by node "n2"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := usage(t, m, "p")
			tt.r.Pool = "p"
			got, err := m.Allocate(ctx, tt.r)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("error %q does not contain %q", err, tt.wantMsg)
				}
				if got != nil {
					t.Errorf("addresses returned with an error: %v", got)
				}
				if after := usage(t, m, "p"); after.Used != before.Used {
					t.Errorf("failed request holds addresses: used %d -> %d", before.Used, after.Used)
				}
				return
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i, a := range got {
				w := tt.want[i]
				if strings.Contains(w, "/") {
					if !netip.MustParsePrefix(w).Contains(a) {
						t.Errorf("got %v, want in %s", a, w)
					}
				} else if a != netip.MustParseAddr(w) {
					t.Errorf("got %v, want %s", a, w)
				}
			}
		})
	}
}

func TestWithin(t *testing.T) {
	ctx := context.Background()
	m, _ := setup(t, []string{"10.0.0.0/16", "fd00::/64"}, 0)
	r := Request{Pool: "p", Within: prefixes("10.0.1.128/28")}
	var got4 []netip.Addr
	for {
		got, err := m.Allocate(ctx, r)
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("got %v: an IPv4 range must not restrict IPv6", got)
		}
		got4 = append(got4, got[0])
	}
	if len(got4) != 16 {
		t.Fatalf("got %d addresses in a /28, want 16: %v", len(got4), got4)
	}
	for _, a := range got4 {
		if !r.Within[0].Contains(a) {
			t.Errorf("%v outside %v", a, r.Within[0])
		}
	}
	// Only the block holding the range was claimed: 10.0.1.128/27 is block 12.
	blocks := m.OwnedBlocks()
	if !slices.Contains(blocks, netip.MustParsePrefix("10.0.1.128/27")) || len(blocks) != 2 {
		t.Fatalf("owned blocks %v", blocks)
	}
	// The range is exhausted but the rest of the pool is not.
	if got := mustAllocate(t, m, Request{Pool: "p", IPv4: true}); !netip.MustParsePrefix("10.0.1.128/27").Contains(got[0]) {
		t.Fatalf("dynamic after range exhausted: %v (want the owned block used first)", got)
	}

	// A v6 range restricts v6 only.
	got := mustAllocate(t, m, Request{Pool: "p", Within: prefixes("fd00::a00/120")})
	if !netip.MustParsePrefix("fd00::a00/120").Contains(got[1]) {
		t.Fatalf("v6 %v outside range", got[1])
	}

	// Ranges outside the pool, or covering only reserved addresses, fail
	// cleanly and claim nothing.
	before := len(m.OwnedBlocks())
	for _, w := range []string{"192.168.0.0/24", "10.0.0.0/32"} {
		if _, err := m.Allocate(ctx, Request{Pool: "p", IPv4: true, Within: prefixes(w)}); !errors.Is(err, ErrExhausted) {
			t.Errorf("within %s: %v", w, err)
		}
	}
	if after := len(m.OwnedBlocks()); after > before+2 { // 10.0.0.0/32 may claim block 0
		t.Fatalf("blocks %d -> %d", before, after)
	}
	// A range far into a /64 does not walk 2^32 block indices, and one
	// past the pool's last block fails at once.
	createPool(t, m, "v6", []string{"fd01::/64"}, 0)
	got = mustAllocate(t, m, Request{Pool: "v6", Within: prefixes("fd01::1f:ffff:ff00/120")})
	if !netip.MustParsePrefix("fd01::1f:ffff:ff00/120").Contains(got[0]) {
		t.Fatalf("v6 %v outside range", got[0])
	}
	if _, err := m.Allocate(ctx, Request{Pool: "v6", Within: prefixes("fd01::ffff:0:0:0/80")}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("range past the last block: %v", err)
	}
}

// TestNothingHeldAfterFailure fails the second family of dual-stack
// requests, in both orders, and checks the first is given back.
func TestNothingHeldAfterFailure(t *testing.T) {
	ctx := context.Background()
	// One block: 30 usable v4, 31 usable v6.
	m, _ := setup(t, []string{"10.0.0.0/27", "fd00::/123"}, 5)
	for i := 0; i < 31; i++ {
		mustAllocate(t, m, Request{Pool: "p", IPv6: true})
	}
	// v4 succeeds, v6 is exhausted: the v4 address must be released.
	if _, err := m.Allocate(ctx, Request{Pool: "p"}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("err = %v", err)
	}
	if u := usage(t, m, "p"); u.Used != 31 {
		t.Fatalf("used %d after failed request, want 31", u.Used)
	}
	// Static v6 succeeds, v4 exhausted: the v6 must be released.
	m.Release(ctx, "p", addrs("fd00::5"))
	for i := 0; i < 30; i++ {
		mustAllocate(t, m, Request{Pool: "p", IPv4: true})
	}
	if _, err := m.Allocate(ctx, Request{Pool: "p", Static: addrs("fd00::5")}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("err = %v", err)
	}
	if u := usage(t, m, "p"); u.Used != 60 {
		t.Fatalf("used %d after failed request, want 60", u.Used)
	}
	if got := mustAllocate(t, m, Request{Pool: "p", IPv6: true, Static: addrs("fd00::5")}); got[0] != netip.MustParseAddr("fd00::5") {
		t.Fatalf("got %v", got)
	}
	// A static after a good one failing releases the good one.
	m.Release(ctx, "p", addrs("10.0.0.7", "10.0.0.8"))
	if _, err := m.Allocate(ctx, Request{Pool: "p", Static: addrs("10.0.0.7", "10.0.0.99")}); !errors.Is(err, ErrOutOfPool) {
		t.Fatalf("err = %v", err)
	}
	if got := mustAllocate(t, m, Request{Pool: "p", IPv4: true, Static: addrs("10.0.0.7")}); got[0] != netip.MustParseAddr("10.0.0.7") {
		t.Fatalf("got %v", got)
	}
}

func TestClaimsBlocksAndReports(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	var m *Manager
	var calls atomic.Int32
	var seen []int
	m, err := NewManager(Options{Store: st, Node: "n1", OnBlocksChanged: func() {
		calls.Add(1)
		// The callback may read the blocks: no Manager lock is held.
		seen = append(seen, len(m.OwnedBlocks()))
	}})
	if err != nil {
		t.Fatal(err)
	}
	createPool(t, m, "p", []string{"10.0.0.0/24"}, 0)
	got := map[netip.Addr]bool{}
	// Blocks 0 and 7 lose the network and broadcast addresses.
	for i := 0; i < 254; i++ {
		a := mustAllocate(t, m, Request{Pool: "p"})[0]
		if got[a] {
			t.Fatalf("%v handed out twice", a)
		}
		got[a] = true
		if want := (i+1)/32 + 1; int(calls.Load()) != want {
			t.Fatalf("after %d addresses: %d block claims reported, want %d", i+1, calls.Load(), want)
		}
	}
	if _, err := m.Allocate(ctx, Request{Pool: "p"}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("err = %v", err)
	}
	if !slices.Equal(seen, []int{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("OwnedBlocks seen by the callback: %v", seen)
	}
	bs, err := st.ListBlocks(ctx, "p")
	if err != nil || len(bs) != 8 {
		t.Fatalf("store blocks %v, %v", bs, err)
	}
	// Restore claiming a block reports it too.
	m2, err := NewManager(Options{Store: st, Node: "n2", OnBlocksChanged: func() { calls.Add(100) }})
	if err != nil {
		t.Fatal(err)
	}
	createPool(t, m2, "q", []string{"10.1.0.0/24"}, 0)
	if err := m2.Restore(ctx, "q", addrs("10.1.0.40")); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 108 {
		t.Fatalf("Restore claim not reported: %d", calls.Load())
	}
}

func TestBlocksShared(t *testing.T) {
	// Two nodes never hand out the same address: each takes its own blocks.
	_, st := setup(t, []string{"10.0.0.0/25"}, 0)
	ms := []*Manager{newManager(t, st, "n1"), newManager(t, st, "n2")}
	seen := map[netip.Addr]string{}
	for i := 0; ; i++ {
		m := ms[i%2]
		got, err := m.Allocate(context.Background(), Request{Pool: "p"})
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := seen[got[0]]; dup {
			t.Fatalf("%v handed out by %s and %s", got[0], prev, m.node)
		}
		seen[got[0]] = m.node
	}
	if len(seen) != 128-2 {
		t.Fatalf("%d addresses, want 126", len(seen))
	}
}

func TestRelease(t *testing.T) {
	ctx := context.Background()
	m, _ := setup(t, []string{"10.0.0.0/24", "fd00::/64"}, 0)
	first := mustAllocate(t, m, Request{Pool: "p"})
	m.Release(ctx, "p", first)
	m.Release(ctx, "p", first)                          // idempotent
	m.Release(ctx, "p", addrs("10.0.0.0", "10.9.9.9"))  // reserved, outside: ignored
	m.Release(ctx, "p", addrs("10.0.0.77", "fd00::99")) // never allocated, unowned block
	m.Release(ctx, "nope", first)                       // unknown pool
	if u := usage(t, m, "p"); u.Used != 0 {
		t.Fatalf("used %d", u.Used)
	}
	// The freed addresses are not the next ones handed out.
	second := mustAllocate(t, m, Request{Pool: "p"})
	if second[0] == first[0] || second[1] == first[1] {
		t.Fatalf("freed %v reused at once: %v", first, second)
	}
	// Releasing a reserved address never makes it allocatable.
	m.Release(ctx, "p", addrs("10.0.0.31", "::ffff:10.0.0.0"))
	for i := 0; i < 29; i++ {
		a := mustAllocate(t, m, Request{Pool: "p", IPv4: true})[0]
		if a == netip.MustParseAddr("10.0.0.0") || a == netip.MustParseAddr("10.0.0.255") {
			t.Fatalf("reserved %v handed out", a)
		}
	}
	// The mapped form releases the IPv4 address (and nothing of IPv6).
	before := usage(t, m, "p")
	m.Release(ctx, "p", addrs("::ffff:"+second[0].String()))
	if after := usage(t, m, "p"); after.Used != before.Used-1 {
		t.Fatalf("used %d -> %d", before.Used, after.Used)
	}
}

func TestReleaseMappedInV4Pool(t *testing.T) {
	// Regression: a mapped address used to be taken for IPv6 and the nil
	// IPv6 bitmap of a v4-only pool dereferenced.
	ctx := context.Background()
	m, _ := setup(t, []string{"10.0.0.0/24"}, 0)
	a := mustAllocate(t, m, Request{Pool: "p"})[0]
	m.Release(ctx, "p", []netip.Addr{netip.AddrFrom16(a.As16())})
	if err := m.Restore(ctx, "p", []netip.Addr{netip.AddrFrom16(a.As16())}); err != nil {
		t.Fatal(err)
	}
	if u := usage(t, m, "p"); u.Used != 1 {
		t.Fatalf("used %d", u.Used)
	}
}

func TestRestore(t *testing.T) {
	ctx := context.Background()
	m, st := setup(t, []string{"10.0.0.0/24", "fd00::/64"}, 0)
	var held []netip.Addr
	for i := 0; i < 40; i++ {
		held = append(held, mustAllocate(t, m, Request{Pool: "p"})...)
	}
	// A fresh manager (same node) rebuilt from the held addresses.
	m2 := newManager(t, st, "n1")
	if err := m2.Restore(ctx, "p", held); err != nil {
		t.Fatal(err)
	}
	// The same addresses restored again (two records holding them) are
	// reported, and change nothing.
	if err := m2.Restore(ctx, "p", held[:2]); !errors.Is(err, ErrInUse) {
		t.Fatalf("second restore of the same addresses: %v, want ErrInUse", err)
	}
	if u := usage(t, m2, "p"); u.Used != 80 || u.Blocks != 2 {
		t.Fatalf("usage after restore %+v", u)
	}
	seen := map[netip.Addr]bool{}
	for _, a := range held {
		seen[a] = true
	}
	for {
		got, err := m2.Allocate(ctx, Request{Pool: "p", IPv4: true})
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if seen[got[0]] {
			t.Fatalf("restored %v handed out", got[0])
		}
		seen[got[0]] = true
	}
	if u := usage(t, m2, "p"); u.Used != 254+40 {
		t.Fatalf("usage %+v", u)
	}

	// Restore into a block another node owns, or outside the pool, fails.
	m3 := newManager(t, st, "n3")
	if err := m3.Restore(ctx, "p", held[:1]); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("restore into another node's block: %v", err)
	}
	if err := m2.Restore(ctx, "p", addrs("192.168.0.1")); !errors.Is(err, ErrOutOfPool) {
		t.Fatalf("restore outside: %v", err)
	}
	if err := m2.Restore(ctx, "nope", held); !errors.Is(err, ErrPoolNotFound) {
		t.Fatalf("restore unknown pool: %v", err)
	}
}

func TestRestoreMovesCursor(t *testing.T) {
	// After a restart the search starts after the highest restored
	// offset, whatever order the attachments come in.
	ctx := context.Background()
	m, _ := setup(t, []string{"10.0.0.0/24"}, 0)
	if err := m.Restore(ctx, "p", addrs("10.0.0.20", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocate(t, m, Request{Pool: "p"}); got[0] != netip.MustParseAddr("10.0.0.21") {
		t.Fatalf("got %v, want 10.0.0.21", got)
	}
	// Restoring the last offset of a block wraps the search to the
	// block's start; a lower offset restored afterwards must not pull it
	// back into the middle.
	if err := m.Restore(ctx, "p", addrs("10.0.0.63", "10.0.0.40")); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocate(t, m, Request{Pool: "p", Within: prefixes("10.0.0.32/27")}); got[0] != netip.MustParseAddr("10.0.0.32") {
		t.Fatalf("got %v, want 10.0.0.32", got)
	}
}

func TestUsage(t *testing.T) {
	m, _ := setup(t, []string{"10.0.0.0/24", "fd00::/120"}, 0, "10.0.0.1")
	u := usage(t, m, "p")
	if u != (Usage{CapacityV4: 256, CapacityV6: 256, TotalBlocks: 8}) {
		t.Fatalf("empty usage %+v", u)
	}
	for i := 0; i < 3; i++ {
		mustAllocate(t, m, Request{Pool: "p"})
	}
	u = usage(t, m, "p")
	// Block 0: v4 has network and 10.0.0.1 reserved, v6 the anycast.
	want := Usage{Blocks: 1, Used: 6, Free: (32 - 2 - 3) + (32 - 1 - 3), CapacityV4: 256, CapacityV6: 256, TotalBlocks: 8}
	if u != want {
		t.Fatalf("usage %+v, want %+v", u, want)
	}
	if _, err := m.Usage(context.Background(), "nope"); !errors.Is(err, ErrPoolNotFound) {
		t.Fatalf("unknown pool: %v", err)
	}
}

func TestCreatePool(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	m := newManager(t, st, "n1")
	p, err := m.CreatePool(ctx, store.Pool{Name: "a", Subnets: prefixes("10.0.0.0/16", "fd00::/64")})
	if err != nil {
		t.Fatal(err)
	}
	if p.BlockSizeBits != DefaultBlockSizeBits || p.Created.IsZero() {
		t.Fatalf("defaults not filled: %+v", p)
	}
	tests := []struct {
		name    string
		pool    store.Pool
		wantErr error
		wantMsg string
	}{
		{"duplicate name", store.Pool{Name: "a", Subnets: prefixes("10.9.0.0/16")}, store.ErrExists, ""},
		{"overlap v4", store.Pool{Name: "b", Subnets: prefixes("10.0.3.0/24")}, ErrInvalidPool, `subnet 10.0.3.0/24 of pool "b" overlaps 10.0.0.0/16 of pool "a"`},
		{"overlap v4 wider", store.Pool{Name: "b", Subnets: prefixes("10.0.0.0/8")}, ErrInvalidPool, "overlaps"},
		{"overlap v6", store.Pool{Name: "b", Subnets: prefixes("10.1.0.0/16", "fd00::/48")}, ErrInvalidPool, "fd00::/48"},
		{"bad name", store.Pool{Name: "B", Subnets: prefixes("10.1.0.0/16")}, ErrInvalidPool, ""},
		{"bad subnet", store.Pool{Name: "b", Subnets: prefixes("10.1.0.0/30")}, ErrInvalidPool, "smaller than one block"},
		{"bad bits", store.Pool{Name: "b", Subnets: prefixes("10.1.0.0/16"), BlockSizeBits: 17}, ErrInvalidPool, "out of range"},
		{"bad reserved", store.Pool{Name: "b", Subnets: prefixes("10.1.0.0/16"), Reserved: []string{"10.1.0.9-10.1.0.1"}}, ErrInvalidPool, "invalid address range"},
	}
	for _, tt := range tests {
		_, err := m.CreatePool(ctx, tt.pool)
		if !errors.Is(err, tt.wantErr) || !strings.Contains(fmt.Sprint(err), tt.wantMsg) {
			t.Errorf("%s: err = %v, want %v containing %q", tt.name, err, tt.wantErr, tt.wantMsg)
		}
	}
	if _, err := m.CreatePool(ctx, store.Pool{Name: "b", Subnets: prefixes("10.1.0.0/16", "fd01::/64"), BlockSizeBits: 8}); err != nil {
		t.Fatal(err)
	}
	def, g, err := m.Pool(ctx, "b")
	if err != nil || def.BlockSizeBits != 8 || g.BlockSize() != 256 {
		t.Fatalf("Pool = %+v, %v", def, err)
	}
	if _, _, err := m.Pool(ctx, "nope"); !errors.Is(err, ErrPoolNotFound) {
		t.Fatalf("Pool unknown: %v", err)
	}
}

func TestDeletePool(t *testing.T) {
	ctx := context.Background()
	m, st := setup(t, []string{"10.0.0.0/24"}, 0)
	createPool(t, m, "q", []string{"10.1.0.0/24"}, 0)
	var keys []string
	for i := 0; i < 7; i++ {
		a := mustAllocate(t, m, Request{Pool: "p"})
		att := store.Attachment{AttachmentKey: store.AttachmentKey{Network: "net", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}, Pool: "p", Addrs: a}
		if err := st.PutAttachment(ctx, att); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, att.AttachmentKey.String())
	}
	err := m.DeletePool(ctx, "p")
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("delete in use: %v", err)
	}
	for _, want := range append(keys[:5], `pool "p" is in use by 7 attachment(s)`, "and 2 more") {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, _, err := m.Pool(ctx, "p"); err != nil {
		t.Fatalf("refused delete removed the pool: %v", err)
	}
	// An unused pool goes, with its blocks; the name can be reused.
	mustAllocate(t, m, Request{Pool: "q"})
	if err := m.DeletePool(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if bs, _ := st.ListBlocks(ctx, "q"); len(bs) != 0 {
		t.Fatalf("blocks left: %v", bs)
	}
	if _, err := m.Allocate(ctx, Request{Pool: "q"}); !errors.Is(err, ErrPoolNotFound) {
		t.Fatalf("allocate from deleted pool: %v", err)
	}
	if err := m.DeletePool(ctx, "q"); !errors.Is(err, ErrPoolNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	createPool(t, m, "q", []string{"fd00::/64"}, 0)
	if got := mustAllocate(t, m, Request{Pool: "q"}); !got[0].Is6() {
		t.Fatalf("re-created pool served from the old definition: %v", got)
	}
	// Once the attachments are gone, p can go too.
	for i := 0; i < 7; i++ {
		if err := st.DeleteAttachment(ctx, store.AttachmentKey{Network: "net", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.DeletePool(ctx, "p"); err != nil {
		t.Fatal(err)
	}
}

func TestLoadAllOwnedBlocks(t *testing.T) {
	ctx := context.Background()
	m, st := setup(t, []string{"10.0.0.0/24", "fd00::/64"}, 0)
	createPool(t, m, "q", []string{"10.1.0.0/24"}, 0)
	mustAllocate(t, m, Request{Pool: "p", Static: addrs("10.0.0.40")})
	mustAllocate(t, m, Request{Pool: "q"})
	m2 := newManager(t, st, "n1")
	if got := m2.OwnedBlocks(); len(got) != 0 {
		t.Fatalf("before LoadAll: %v", got)
	}
	if err := m2.LoadAll(ctx); err != nil {
		t.Fatal(err)
	}
	got := m2.OwnedBlocks()
	slices.SortFunc(got, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	want := prefixes("10.0.0.32/27", "10.1.0.0/27", "fd00::20/123")
	if !slices.Equal(got, want) {
		t.Fatalf("OwnedBlocks = %v, want %v", got, want)
	}
}

// TestReservedBlocksNotClaimed: a block whose every address is reserved is
// skipped without being claimed, so no request fails on it: the first ADD
// of a /24 with its first /27 reserved succeeds, and reserving a /22 costs
// no failed ADDs and no store writes for its 32 blocks.
func TestReservedBlocksNotClaimed(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		subnets  []string
		reserved []string
		want     []string // the first addresses handed out, in order
		blocks   []uint32 // blocks claimed in the store afterwards
	}{
		{"first /27 of a /24", []string{"10.0.0.0/24"}, []string{"10.0.0.0/27"}, []string{"10.0.0.32", "10.0.0.33"}, []uint32{1}},
		{"first /22 of a /16", []string{"10.0.0.0/16"}, []string{"10.0.0.0/22"}, []string{"10.0.4.0", "10.0.4.1"}, []uint32{32}},
		{"IPv6 /96 of a /64", []string{"fd00::/64"}, []string{"fd00::/96"}, []string{"fd00::1:0:0", "fd00::1:0:1"}, []uint32{1 << 27}},
		{"dual stack, IPv4 half reserved", []string{"10.0.0.0/26", "fd00::/122"}, []string{"10.0.0.0/27"}, []string{"10.0.0.32", "fd00::20"}, []uint32{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, st := setup(t, tt.subnets, 0, tt.reserved...)
			var got []string
			for len(got) < len(tt.want) {
				as, err := m.Allocate(ctx, Request{Pool: "p"})
				if err != nil {
					t.Fatalf("ADD %d failed: %v", len(got)+1, err)
				}
				for _, a := range as {
					got = append(got, a.String())
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("handed out %v, want %v", got, tt.want)
			}
			bs, err := st.ListBlocks(ctx, "p")
			if err != nil {
				t.Fatal(err)
			}
			var idx []uint32
			for _, b := range bs {
				idx = append(idx, b.Index)
			}
			if !slices.Equal(idx, tt.blocks) {
				t.Errorf("blocks claimed in the store: %v, want %v (a fully reserved block must not be claimed)", idx, tt.blocks)
			}
		})
	}

	// A pool with nothing but reservations: exhausted at once, nothing claimed.
	m, st := setup(t, []string{"10.0.0.0/26"}, 0, "10.0.0.0/26")
	if _, err := m.Allocate(ctx, Request{Pool: "p"}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("all reserved: err = %v, want ErrExhausted", err)
	}
	if bs, _ := st.ListBlocks(ctx, "p"); len(bs) != 0 {
		t.Fatalf("all reserved: blocks claimed %v", bs)
	}
}

// TestDeletePoolReports: deleting a pool whose blocks this node owns
// reports the change, and OwnedBlocks (what the export follows) no longer
// lists them when the callback runs.
func TestDeletePoolReports(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	var m *Manager
	var seen [][]netip.Prefix
	m, err := NewManager(Options{Store: st, Node: "n1", OnBlocksChanged: func() { seen = append(seen, m.OwnedBlocks()) }})
	if err != nil {
		t.Fatal(err)
	}
	createPool(t, m, "p", []string{"10.0.0.0/24"}, 0)
	createPool(t, m, "q", []string{"10.1.0.0/24"}, 0)
	mustAllocate(t, m, Request{Pool: "p"})
	a := mustAllocate(t, m, Request{Pool: "q"})
	m.Release(ctx, "q", a)
	seen = nil
	if err := m.DeletePool(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 {
		t.Fatalf("DeletePool reported %d changes, want 1", len(seen))
	}
	if want := prefixes("10.0.0.0/27"); !slices.Equal(seen[0], want) {
		t.Fatalf("OwnedBlocks after DeletePool = %v, want %v", seen[0], want)
	}
	// A refused delete changes nothing and reports nothing.
	seen = nil
	if err := m.DeletePool(ctx, "nope"); !errors.Is(err, ErrPoolNotFound) {
		t.Fatalf("unknown pool: %v", err)
	}
	if len(seen) != 0 {
		t.Fatalf("a failed DeletePool reported %d changes", len(seen))
	}
}

// listHookStore runs hook once, after the first ListBlocks it serves.
type listHookStore struct {
	store.Store
	hook func()
}

func (s *listHookStore) ListBlocks(ctx context.Context, pool string) ([]store.Block, error) {
	bs, err := s.Store.ListBlocks(ctx, pool)
	if h := s.hook; h != nil {
		s.hook = nil
		h()
	}
	return bs, err
}

// TestDeletePoolDuringFirstLoad: a pool deleted (and made again with
// other subnets) while its first load reads the store is not cached in
// its old shape: the old blocks are not exported, and the new pool hands
// out its own addresses only.
func TestDeletePoolDuringFirstLoad(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	hs := &listHookStore{Store: st}
	m := newManager(t, hs, "n1")
	createPool(t, m, "p", []string{"10.0.0.0/24"}, 0)
	if _, err := st.ClaimBlock(ctx, "p", "n1", 8, nil, nil); err != nil {
		t.Fatal(err)
	}
	hs.hook = func() { // pool delete p; pool create p 10.9.0.0/24, meanwhile
		if err := m.DeletePool(ctx, "p"); err != nil {
			t.Fatal(err)
		}
		createPool(t, m, "p", []string{"10.9.0.0/24"}, 0)
	}
	if _, err := m.Usage(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	for _, b := range m.OwnedBlocks() {
		if netip.MustParsePrefix("10.0.0.0/24").Overlaps(b) {
			t.Errorf("block %v of the deleted pool is still exported", b)
		}
	}
	a, err := m.Allocate(ctx, Request{Pool: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if !netip.MustParsePrefix("10.9.0.0/24").Contains(a[0]) {
		t.Errorf("pool p is 10.9.0.0/24 now, yet it handed out %v", a[0])
	}
}

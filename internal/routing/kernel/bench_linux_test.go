package kernel_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
	"github.com/skeinnet/skein/test/harness"
)

// benchRemotes describes nodes nodes with two IPv4 /26 blocks and one IPv6
// /64 block each, node i at 10.100.i/16 and fd64::i on the underlay.
func benchRemotes(nodes int) []routing.Remote {
	var out []routing.Remote
	base := netip.MustParseAddr("10.128.0.0").As4()
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("n%d", i)
		addrs := []netip.Addr{
			netip.AddrFrom4([4]byte{10, 100, byte((i + 2) >> 8), byte(i + 2)}),
			netip.MustParseAddr(fmt.Sprintf("fd64::%x", i+2)),
		}
		for j := 0; j < 2; j++ {
			v := binary.BigEndian.Uint32(base[:]) + uint32(i*2+j)*64
			var v4 [4]byte
			binary.BigEndian.PutUint32(v4[:], v)
			out = append(out, routing.Remote{Block: netip.PrefixFrom(netip.AddrFrom4(v4), 26), Name: fmt.Sprintf("%s-%d", name, j), Node: name, NodeAddrs: addrs})
		}
		out = append(out, routing.Remote{Block: netip.MustParsePrefix(fmt.Sprintf("fd20:%x::/64", i)), Name: name + "-6", Node: name, NodeAddrs: addrs})
	}
	return out
}

// BenchmarkSync1000Nodes: 1,000 remote nodes with 3 blocks each (3,000
// routes, 3,000 neighbour and 1,000 FDB entries in vxlan mode) in one node
// namespace: the first Sync (from nothing) and a Sync that finds everything
// in place.
func BenchmarkSync1000Nodes(b *testing.B) {
	rs := benchRemotes(1000)
	sw := harness.NewNS(b, "rtbsw")
	n := &node{name: "bench", ns: harness.NewNS(b, "rtbn")}
	sw.AddVeth(b, harness.Veth{Name: "p1", PeerName: "ul0", Peer: n.ns})
	addAddr(b, n.ns, "ul0", pfx("10.100.0.1/16"))
	addAddr(b, n.ns, "ul0", pfx("fd64::1/64"))
	n.addrs = []netip.Addr{ip("10.100.0.1"), ip("fd64::1")}
	for _, mode := range []routing.Mode{routing.ModeDirect, routing.ModeVXLAN} {
		k := newKernel(b, n, kernel.KernelConfig{Mode: mode, LocalAddrs: n.addrs})
		check := func(st []routing.Status, err error) {
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range st {
				if !s.Installed {
					b.Fatalf("%s: %s", s.Block, s.Reason)
				}
			}
		}
		b.Run(string(mode)+"/first", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if err := k.Uninstall(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				check(k.Sync(b.Context(), rs))
			}
		})
		b.Run(string(mode)+"/noop", func(b *testing.B) {
			check(k.Sync(b.Context(), rs))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				check(k.Sync(b.Context(), rs))
			}
		})
		if err := k.Uninstall(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSource is a Source whose snapshot the benchmark sets, sorted as a
// Watcher's.
type benchSource struct{ snap routing.Snapshot }

func (s *benchSource) Snapshot(context.Context) (routing.Snapshot, error) { return s.snap, nil }
func (s *benchSource) Changed() <-chan struct{}                           { return nil }

func (s *benchSource) set(rs []routing.Remote) {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b routing.Remote) int {
		return cmp.Or(a.Block.Addr().Compare(b.Block.Addr()), cmp.Compare(a.Block.Bits(), b.Block.Bits()), strings.Compare(a.Name, b.Name))
	})
	s.snap = routing.Snapshot{Remotes: rs, Nodes: map[string]routing.NodeInfo{}}
	for _, r := range rs {
		s.snap.Nodes[r.Node] = routing.NodeInfo{Name: r.Node, Addrs: r.NodeAddrs}
	}
}

// BenchmarkChange3000Blocks: what one change (a block added, then deleted)
// costs the Loop with 3,000 remote blocks of 1,000 nodes in place, in one
// node namespace with the real Kernel: a full sync (what every change
// cost before: compare and rewrite from the whole table) against an
// incremental one (Update of the changed block), alternated in one run.
// It reports each per change (full-ms, incr-ms) and their ratio
// (full/incr). The Watcher's snapshot of the cache is not in it (the same
// for both; see BenchmarkSnapshot3000Blocks).
func BenchmarkChange3000Blocks(b *testing.B) {
	rs := benchRemotes(1000)
	withExtra := append(slices.Clone(rs), routing.Remote{Block: netip.MustParsePrefix("10.200.0.0/26"), Name: "extra", Node: rs[15].Node, NodeAddrs: rs[15].NodeAddrs})
	sw := harness.NewNS(b, "rtbsw")
	n := &node{name: "bench", ns: harness.NewNS(b, "rtbn")}
	sw.AddVeth(b, harness.Veth{Name: "p1", PeerName: "ul0", Peer: n.ns})
	addAddr(b, n.ns, "ul0", pfx("10.100.0.1/16"))
	addAddr(b, n.ns, "ul0", pfx("fd64::1/64"))
	n.addrs = []netip.Addr{ip("10.100.0.1"), ip("fd64::1")}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, mode := range []routing.Mode{routing.ModeDirect, routing.ModeVXLAN} {
		k := newKernel(b, n, kernel.KernelConfig{Mode: mode, LocalAddrs: n.addrs})
		src := &benchSource{}
		l, err := routing.NewLoop(routing.LoopOptions{Mode: mode, Source: src, Syncer: k, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		src.set(rs)
		if err := l.SyncNow(b.Context()); err != nil {
			b.Fatal(err)
		}
		change := func(to []routing.Remote, sync func(context.Context) error) time.Duration {
			src.set(to)
			start := time.Now()
			if err := sync(b.Context()); err != nil {
				b.Fatal(err)
			}
			took := time.Since(start)
			st, _ := l.Statuses()
			if len(st) != len(to) {
				b.Fatalf("%d statuses for %d remotes", len(st), len(to))
			}
			for _, s := range st {
				if !s.Installed {
					b.Fatalf("%s: %s", s.Block, s.Reason)
				}
			}
			return took
		}
		b.Run(string(mode), func(b *testing.B) {
			var full, incr time.Duration
			for i := 0; i < b.N; i++ {
				full += change(withExtra, l.SyncNow)
				full += change(rs, l.SyncNow)
				incr += change(withExtra, l.SyncChanges)
				incr += change(rs, l.SyncChanges)
			}
			changes := float64(2 * b.N)
			b.ReportMetric(float64(full.Milliseconds())/changes, "full-ms/change")
			b.ReportMetric(float64(incr.Microseconds())/1000/changes, "incr-ms/change")
			b.ReportMetric(float64(full)/float64(incr), "full/incr")
		})
		if err := k.Uninstall(); err != nil {
			b.Fatal(err)
		}
	}
}

package kernel_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
)

// TestUpdate: Update applies a change of a few blocks with the netlink
// writes of those blocks alone (counted), and leaves the kernel exactly as
// a full Sync of the same remotes would (the Sync that follows each step
// changes nothing, and reports the same statuses), in direct and vxlan
// mode: a block deleted and added back, a block moving to another node, a
// node's address changing, a node gone with all its blocks, two remotes
// claiming one block. A route someone else added since the last Sync is
// not overwritten. Pods reach each other at the end.
func TestUpdate(t *testing.T) {
	for _, mode := range []routing.Mode{routing.ModeDirect, routing.ModeVXLAN} {
		t.Run(string(mode), func(t *testing.T) { testUpdate(t, mode) })
	}
}

func testUpdate(t *testing.T, mode routing.Mode) {
	nodes := lan(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	cfg := kernel.KernelConfig{Mode: mode, LocalAddrs: n1.addrs}
	var ks []*kernel.Kernel
	for _, n := range nodes {
		c := cfg
		c.LocalAddrs = n.addrs
		ks = append(ks, newKernel(t, n, c))
		requireInstalled(t, mustSync(t, ks[len(ks)-1], remotes(n, nodes...)))
	}
	k := ks[0]
	if _, err := k.Update(t.Context(), nil, nil); err != nil {
		t.Fatalf("empty update: %v", err)
	}
	cur := remotes(n1, nodes...) // what node1's kernel holds: n2's and n3's blocks
	n3v4, n3v6 := n3.blocks[0], n3.blocks[1]
	without := func(rs []routing.Remote, p netip.Prefix) []routing.Remote {
		return slices.DeleteFunc(slices.Clone(rs), func(r routing.Remote) bool { return r.Block == p })
	}
	of := func(rs []routing.Remote, p netip.Prefix) []routing.Remote {
		return slices.DeleteFunc(slices.Clone(rs), func(r routing.Remote) bool { return r.Block != p })
	}
	// step moves node1's view to next, updating blocks; it checks the
	// number of netlink changes (changes < 0: any), that a full Sync then
	// changes nothing, and that both report the same statuses.
	step := func(name string, next []routing.Remote, blocks []netip.Prefix, changes int) []routing.Status {
		t.Helper()
		var rs []routing.Remote
		for _, p := range blocks {
			rs = append(rs, of(next, p)...)
		}
		stop := watch(t, n1.ns, routing.DefaultTable, routing.DefaultProtocol, routing.DefaultVXLANDevice)
		got, err := k.Update(t.Context(), blocks, rs)
		if err != nil {
			t.Fatalf("%s: update: %v", name, err)
		}
		if ch := stop(); changes >= 0 && len(ch) != changes {
			t.Errorf("%s: want %d netlink changes, saw %d:\n  %s", name, changes, len(ch), strings.Join(ch, "\n  "))
		}
		var full []routing.Status
		requireNoChange(t, n1, cfg, func() { full = mustSync(t, k, next) })
		var want []routing.Status
		for _, s := range full {
			if slices.Contains(blocks, s.Block) {
				want = append(want, s)
			}
		}
		if !slices.EqualFunc(got, want, sameStatus) {
			t.Errorf("%s: Update's statuses\n  %v\nSync's\n  %v", name, got, want)
		}
		cur = next
		return got
	}
	// In vxlan mode a block is a route and a neighbour entry (whose
	// deletion the kernel announces twice: failed, then gone); a node also
	// an FDB entry.
	addBlock, delBlock, perNode := 1, 1, 0
	if mode == routing.ModeVXLAN {
		addBlock, delBlock, perNode = 2, 3, 1
	}

	step("block deleted", without(cur, n3v6), []netip.Prefix{n3v6}, delBlock)
	noPing(t, n1, n3.podIPs[1])
	step("block added", remotes(n1, nodes...), []netip.Prefix{n3v6}, addBlock)

	moved := slices.Clone(cur)
	for i := range moved {
		if moved[i].Block == n3v4 {
			moved[i].Node, moved[i].NodeAddrs = n2.name, n2.addrs
		}
	}
	// One route replaced (direct), or one neighbour entry (vxlan: the
	// route through the device stays).
	step("block moved to another node", moved, []netip.Prefix{n3v4}, 1)
	step("block moved back", remotes(n1, nodes...), []netip.Prefix{n3v4}, 1)

	// node3's address changes to one that is not on the segment: direct
	// mode cannot route it (its routes go), vxlan routes through the new
	// tunnel end (neighbours and routes move, a new FDB entry replaces
	// the old one).
	away := []netip.Addr{ip("192.0.2.3"), ip("2001:db8::3")}
	readdr := slices.Clone(cur)
	for i := range readdr {
		if readdr[i].Node == n3.name {
			readdr[i].NodeAddrs = away
		}
	}
	st := step("node address changed", readdr, n3.blocks, -1)
	for _, s := range st {
		if mode == routing.ModeDirect && (s.Installed || !strings.Contains(s.Reason, "node address")) ||
			mode == routing.ModeVXLAN && (!s.Installed || s.Via != away[0]) {
			t.Errorf("node3 at %v: %+v", away, s)
		}
	}
	step("node address back", remotes(n1, nodes...), n3.blocks, -1)

	step("node gone", remotes(n1, n1, n2), n3.blocks, 2*delBlock+perNode)
	step("node back", remotes(n1, nodes...), n3.blocks, 2*addBlock+perNode)

	// Two remotes claim one block: the first is routed, the second told.
	dup := append(slices.Clone(cur), routing.Remote{Block: n3v4, Name: "zz-dup", Node: n2.name, NodeAddrs: n2.addrs})
	slices.SortStableFunc(dup, func(a, b routing.Remote) int { return a.Block.Addr().Compare(b.Block.Addr()) })
	st = step("duplicate claim", dup, []netip.Prefix{n3v4}, 0)
	if len(st) != 2 || !st[0].Installed || st[1].Installed || !strings.Contains(st[1].Reason, "also claimed") {
		t.Errorf("duplicate claim: %+v", st)
	}
	step("duplicate gone", remotes(n1, nodes...), []netip.Prefix{n3v4}, 0)

	// Someone else's route for a block that appears after the last Sync:
	// Update adds (never replaces) where it holds none, so it stays.
	other := pfx("10.77.0.0/24")
	addRoute(t, n1.ns, &netlink.Route{Dst: ipNetOf(other), Type: unix.RTN_BLACKHOLE, Table: routing.DefaultTable, Protocol: 99})
	rs := []routing.Remote{{Block: other, Name: "p-77", Node: n2.name, NodeAddrs: n2.addrs}}
	got, err := k.Update(t.Context(), []netip.Prefix{other}, rs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Installed || !strings.Contains(got[0].Reason, "already holds a route") {
		t.Errorf("block with someone else's route: %+v", got)
	}
	if !slices.Contains(tableRoutes(t, n1.ns, routing.DefaultTable), "10.77.0.0/24 dev  proto 99") {
		t.Errorf("someone else's route was replaced: %q", tableRoutes(t, n1.ns, routing.DefaultTable))
	}
	if _, err := k.Update(t.Context(), []netip.Prefix{other}, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(tableRoutes(t, n1.ns, routing.DefaultTable), "10.77.0.0/24 dev  proto 99") {
		t.Errorf("someone else's route was deleted: %q", tableRoutes(t, n1.ns, routing.DefaultTable))
	}
	pingAll(t, nodes...)

	// Without a Sync since the Kernel was made, or after Uninstall,
	// Update wants one and changes nothing.
	fresh := newKernel(t, n1, cfg)
	requireNoChange(t, n1, cfg, func() {
		if _, err := fresh.Update(t.Context(), []netip.Prefix{n3v4}, nil); !errors.Is(err, routing.ErrFullSync) {
			t.Errorf("Update before any Sync = %v, want ErrFullSync", err)
		}
	})
	if err := k.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Update(t.Context(), []netip.Prefix{n3v4}, nil); !errors.Is(err, routing.ErrFullSync) {
		t.Errorf("Update after Uninstall = %v, want ErrFullSync", err)
	}
}

func sameStatus(a, b routing.Status) bool {
	return a.Block == b.Block && a.Name == b.Name && a.Node == b.Node && a.Via == b.Via && a.Installed == b.Installed &&
		a.Reason == b.Reason && fmt.Sprint(a.NodeAddrs) == fmt.Sprint(b.NodeAddrs)
}

package kernel_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
	"github.com/skeinnet/skein/test/harness"
)

// vxlanCfg: an IPv6 underlay needs a node known by its IPv6 address only
// (with an IPv4 one, UnderlayAddr picks that).
func vxlanCfg(n *node, v6Underlay bool) kernel.KernelConfig {
	addrs := slices.Clone(n.addrs)
	if v6Underlay {
		addrs = addrs[1:]
	}
	return kernel.KernelConfig{Mode: routing.ModeVXLAN, LocalAddrs: addrs}
}

// TestVXLANUnderlayOrder: two dual-stack nodes listing their addresses in
// opposite orders (node1 IPv6 first, node2 IPv4 first) agree on the
// underlay family (IPv4: UnderlayAddr), for the local end and the peers
// alike, and their pods reach each other. Before, node1's device took its
// IPv6 address as local end while addressing node2 over IPv4 — and the
// other way round — so both reported Installed and dropped the traffic.
func TestVXLANUnderlayOrder(t *testing.T) {
	nodes := lan(t, 2)
	rev := slices.Clone(nodes[0].addrs)
	slices.Reverse(rev)
	nodes[0].addrs = rev // as its Node object lists them, to peers too
	for _, n := range nodes {
		k := newKernel(t, n, kernel.KernelConfig{Mode: routing.ModeVXLAN, LocalAddrs: n.addrs})
		st := mustSync(t, k, remotes(n, nodes...))
		requireInstalled(t, st)
		for _, s := range st {
			if !s.Via.Is4() {
				t.Errorf("%s: %s via %s, want the peer's IPv4 address", n.name, s.Block, s.Via)
			}
		}
		if vx := device(t, n); vx.SrcAddr.To4() == nil {
			t.Errorf("%s: device's local end %s, want its IPv4 address", n.name, vx.SrcAddr)
		}
	}
	pingAll(t, nodes...)
}

// TestVXLANLocalAddrChange: SetLocalAddrs with a new underlay address (the
// node's address changed in the API) makes the next Sync recreate the
// device with the new local end and MAC; invalid addresses are refused.
func TestVXLANLocalAddrChange(t *testing.T) {
	nodes := lan(t, 2)
	n := nodes[0]
	k := newKernel(t, n, vxlanCfg(n, true)) // IPv6 only at first
	mustSync(t, k, remotes(n, nodes...))
	if vx := device(t, n); !vx.SrcAddr.Equal(n.addrs[1].AsSlice()) {
		t.Fatalf("device's local end %s, want %s", vx.SrcAddr, n.addrs[1])
	}
	if err := k.SetLocalAddrs([]netip.Addr{ip("127.0.0.1")}); !errors.Is(err, routing.ErrInvalid) {
		t.Errorf("SetLocalAddrs(loopback) = %v, want ErrInvalid", err)
	}
	if err := k.SetLocalAddrs(n.addrs); err != nil {
		t.Fatal(err)
	}
	requireInstalled(t, mustSync(t, k, remotes(n, nodes...)))
	vx := device(t, n)
	if !vx.SrcAddr.Equal(n.addrs[0].AsSlice()) || vx.HardwareAddr.String() != kernel.MACFor(n.addrs[0]).String() {
		t.Errorf("after the change: local end %s mac %s, want %s %s", vx.SrcAddr, vx.HardwareAddr, n.addrs[0], kernel.MACFor(n.addrs[0]))
	}
	k2 := newKernel(t, nodes[1], kernel.KernelConfig{Mode: routing.ModeVXLAN, LocalAddrs: nodes[1].addrs})
	requireInstalled(t, mustSync(t, k2, remotes(nodes[1], nodes...)))
	pingAll(t, nodes...)
}

func device(t testing.TB, n *node) *netlink.Vxlan {
	t.Helper()
	l, err := n.ns.Handle(t).LinkByName(routing.DefaultVXLANDevice)
	if err != nil {
		t.Fatalf("%s: %v", n.name, err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		t.Fatalf("%s: %s is a %s", n.name, routing.DefaultVXLANDevice, l.Type())
	}
	return vx
}

// TestVXLAN: three nodes reach each other's pods (both families) through
// VXLAN over an IPv4 and over an IPv6 underlay; the device, FDB and
// neighbour entries are as designed; a repeated Sync and a restart change
// nothing; a node's removal deletes exactly its entries; attribute changes
// are applied (MTU in place, VNI by recreating); Uninstall restores.
func TestVXLAN(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v6underlay=%t", v6), func(t *testing.T) { testVXLAN(t, v6) })
	}
}

func testVXLAN(t *testing.T, v6 bool) {
	nodes := lan(t, 3)
	var before []harness.State
	var ks []*kernel.Kernel
	for _, n := range nodes {
		foreign(t, n)
		before = append(before, harness.Snapshot(t, n.ns))
		ks = append(ks, newKernel(t, n, vxlanCfg(n, v6)))
	}
	under := func(n *node) netip.Addr { return vxlanCfg(n, v6).LocalAddrs[0] }
	for i, n := range nodes {
		st := mustSync(t, ks[i], remotes(n, nodes...))
		requireInstalled(t, st)
		for _, s := range st {
			if want := under(nodes[s.Node[4]-'1']); s.Via != want {
				t.Errorf("%s: via %s, want %s", s.Block, s.Via, want)
			}
		}
	}
	n1 := nodes[0]
	vx := device(t, n1)
	wantMTU := 1500 - routing.OverheadVXLAN4
	if v6 {
		wantMTU = 1500 - routing.OverheadVXLAN6
	}
	if vx.VxlanId != routing.DefaultVXLANVNI || vx.Port != routing.DefaultVXLANPort || vx.Learning ||
		vx.MTU != wantMTU || vx.HardwareAddr.String() != kernel.MACFor(under(n1)).String() ||
		!vx.SrcAddr.Equal(under(n1).AsSlice()) {
		t.Errorf("device: vni %d port %d learning %t mtu %d mac %s local %s", vx.VxlanId, vx.Port, vx.Learning,
			vx.MTU, vx.HardwareAddr, vx.SrcAddr)
	}
	if mtu, err := ks[0].PodMTU(); err != nil || mtu != wantMTU {
		t.Errorf("PodMTU = %d, %v; want %d", mtu, err, wantMTU)
	}
	var want []string
	for _, o := range nodes[1:] {
		mac := kernel.MACFor(under(o))
		want = append(want, fmt.Sprintf("fam 7 %s %s", under(o), mac))
		for _, b := range o.blocks {
			fam := 2
			if b.Addr().Is6() {
				fam = 10
			}
			want = append(want, fmt.Sprintf("fam %d %s %s", fam, b.Addr(), mac))
		}
	}
	slices.Sort(want)
	if got := neighState(t, n1.ns, routing.DefaultVXLANDevice); !slices.Equal(got, want) {
		t.Errorf("entries of node1's device:\n  got  %q\n  want %q", got, want)
	}
	got := tableRoutes(t, n1.ns, routing.DefaultTable)
	wantRoutes := []string{
		"10.10.2.0/24 via 10.10.2.0 dev skein.vxlan proto 32",
		"10.10.3.0/24 via 10.10.3.0 dev skein.vxlan proto 32",
		"10.99.0.0/24 dev  proto 99",
		"fd10:2::/64 via fd10:2:: dev skein.vxlan proto 32",
		"fd10:3::/64 via fd10:3:: dev skein.vxlan proto 32",
	}
	if !slices.Equal(got, wantRoutes) {
		t.Errorf("table of node1:\n  got  %q\n  want %q", got, wantRoutes)
	}
	pingAll(t, nodes...)

	cfg := vxlanCfg(n1, v6)
	t.Run("resync is a no-op", func(t *testing.T) {
		requireNoChange(t, n1, cfg, func() { mustSync(t, ks[0], remotes(n1, nodes...)) })
	})
	t.Run("restart is a no-op", func(t *testing.T) {
		k := newKernel(t, n1, cfg)
		requireNoChange(t, n1, cfg, func() { requireInstalled(t, mustSync(t, k, remotes(n1, nodes...))) })
	})
	t.Run("stale entries go", func(t *testing.T) {
		requireInstalled(t, mustSync(t, ks[0], remotes(n1, nodes[:2]...)))
		got := neighState(t, n1.ns, routing.DefaultVXLANDevice)
		if len(got) != 3 || contains(got, under(nodes[2]).String()) || contains(got, "10.10.3.0") {
			t.Errorf("entries after node3's removal: %q", got)
		}
		if got := tableRoutes(t, n1.ns, routing.DefaultTable); contains(got, "10.10.3.0/24") || contains(got, "fd10:3::") || len(got) != 3 {
			t.Errorf("routes after node3's removal: %q", got)
		}
		noPing(t, n1, nodes[2].podIPs[0])
		requireInstalled(t, mustSync(t, ks[0], remotes(n1, nodes...)))
		pingAll(t, nodes...)
	})
	outer := t // the kernels made here outlive the subtest
	t.Run("mtu in place, vni recreates", func(t *testing.T) {
		idx := device(t, n1).Index
		c := cfg
		c.VXLAN.MTU = 1400
		requireInstalled(t, mustSync(t, newKernel(t, n1, c), remotes(n1, nodes...)))
		if d := device(t, n1); d.Index != idx || d.MTU != 1400 {
			t.Errorf("after mtu change: index %d (was %d) mtu %d", d.Index, idx, d.MTU)
		}
		for i, n := range nodes {
			c := vxlanCfg(n, v6)
			c.VXLAN.VNI = 4242
			ks[i] = newKernel(outer, n, c)
			requireInstalled(t, mustSync(t, ks[i], remotes(n, nodes...)))
		}
		if d := device(t, n1); d.Index == idx || d.VxlanId != 4242 || d.MTU != wantMTU {
			t.Errorf("after vni change: index %d (was %d) vni %d mtu %d", d.Index, idx, d.VxlanId, d.MTU)
		}
		pingAll(t, nodes...)
	})
	t.Run("uninstall restores", func(t *testing.T) {
		for i, n := range nodes {
			if err := ks[i].Uninstall(); err != nil {
				t.Fatal(err)
			}
			harness.AssertSame(t, before[i], harness.Snapshot(t, n.ns))
		}
	})
}

// TestRoutedUnderlay: two nodes in two IPv4 subnets joined by a router
// namespace. VXLAN carries pod traffic between them; direct mode reports
// the other node as not directly reachable and installs nothing for it.
func TestRoutedUnderlay(t *testing.T) {
	router := harness.NewNS(t, "rtr")
	forwarding(t, router)
	var nodes []*node
	for i := 1; i <= 2; i++ {
		n := newNode(t, i)
		port := fmt.Sprintf("r%d", i)
		router.AddVeth(t, harness.Veth{Name: port, PeerName: "ul0", Peer: n.ns})
		addAddr(t, router, port, pfx(fmt.Sprintf("192.168.6%d.254/24", i)))
		addAddr(t, n.ns, "ul0", pfx(fmt.Sprintf("192.168.6%d.1/24", i)))
		defaultVia(t, n.ns, ip(fmt.Sprintf("192.168.6%d.254", i)))
		n.addrs = []netip.Addr{ip(fmt.Sprintf("192.168.6%d.1", i))}
		nodes = append(nodes, n)
	}
	settle(t, nodes...)
	before := harness.Snapshot(t, nodes[0].ns)

	direct := newKernel(t, nodes[0], kernel.KernelConfig{Mode: routing.ModeDirect, LocalAddrs: nodes[0].addrs})
	for _, s := range mustSync(t, direct, remotes(nodes[0], nodes...)) {
		reason := "not on a directly connected network"
		if s.Block.Addr().Is6() {
			reason = "node has no IPv6 address"
		}
		if s.Installed || !strings.Contains(s.Reason, reason) || s.Via.IsValid() {
			t.Errorf("direct %s: installed=%t via=%v reason=%q", s.Block, s.Installed, s.Via, s.Reason)
		}
	}
	if got := tableRoutes(t, nodes[0].ns, routing.DefaultTable); len(got) != 0 {
		t.Errorf("direct installed %q", got)
	}

	for _, n := range nodes {
		k := newKernel(t, n, kernel.KernelConfig{Mode: routing.ModeVXLAN, LocalAddrs: n.addrs})
		rs := remotes(n, nodes...)
		// A peer with only an IPv6 address cannot be reached over the
		// IPv4 underlay.
		rs = append(rs, routing.Remote{Block: pfx("10.30.0.0/24"), Node: "v6only", NodeAddrs: []netip.Addr{ip("fd50::9")}},
			routing.Remote{Block: pfx("10.31.0.0/24"), Node: "noaddr"})
		st := mustSync(t, k, rs)
		requireInstalled(t, st[:len(st)-2])
		if s := st[len(st)-2]; s.Installed || !strings.Contains(s.Reason, "no IPv4 address") {
			t.Errorf("v6-only peer: installed=%t reason=%q", s.Installed, s.Reason)
		}
		if s := st[len(st)-1]; s.Installed || s.Reason != "node has no address" {
			t.Errorf("peer without address: installed=%t reason=%q", s.Installed, s.Reason)
		}
	}
	pingAll(t, nodes...)
	if err := direct.Uninstall(); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, nodes[0].ns))
}

// TestModeSwitch: each mode replaces what the previous one left: direct ->
// vxlan -> direct -> vxlan -> export, checked in the kernel and by traffic;
// export leaves the namespace as it was and reports the routes a routing
// daemon installed.
func TestModeSwitch(t *testing.T) {
	nodes := lan(t, 2)
	var before []harness.State
	for _, n := range nodes {
		foreign(t, n)
		before = append(before, harness.Snapshot(t, n.ns))
	}
	n1 := nodes[0]
	syncAll := func(mode routing.Mode) {
		t.Helper()
		for _, n := range nodes {
			c := vxlanCfg(n, false)
			c.Mode = mode
			st := mustSync(t, newKernel(t, n, c), remotes(n, nodes...))
			if mode != routing.ModeExport {
				requireInstalled(t, st)
			}
		}
	}
	for _, mode := range []routing.Mode{routing.ModeDirect, routing.ModeVXLAN, routing.ModeDirect, routing.ModeVXLAN} {
		syncAll(mode)
		got := tableRoutes(t, n1.ns, routing.DefaultTable)
		dev := "dev ul0"
		if mode == routing.ModeVXLAN {
			dev = "dev skein.vxlan"
		}
		for _, r := range got {
			if !strings.Contains(r, dev) && !strings.Contains(r, "proto 99") {
				t.Errorf("%s: route %q left of the other mode", mode, r)
			}
		}
		if len(got) != 3 {
			t.Errorf("%s: table %q", mode, got)
		}
		_, err := n1.ns.Handle(t).LinkByName(routing.DefaultVXLANDevice)
		if (err == nil) != (mode == routing.ModeVXLAN) {
			t.Errorf("%s: device lookup: %v", mode, err)
		}
		pingAll(t, nodes...)
	}
	syncAll(routing.ModeExport)
	for i, n := range nodes {
		harness.AssertSame(t, before[i], harness.Snapshot(t, n.ns))
	}

	// A routing daemon (here: by hand) installs node2's IPv4 block in main.
	addRoute(t, n1.ns, &netlink.Route{Dst: ipNetOf(nodes[1].blocks[0]), Gw: nodes[1].addrs[0].AsSlice()})
	k := newKernel(t, n1, kernel.KernelConfig{})
	st := mustSync(t, k, remotes(n1, nodes...))
	if !st[0].Installed || st[0].Via != nodes[1].addrs[0] || st[0].Reason != "" {
		t.Errorf("export, route in main: %+v", st[0])
	}
	if st[1].Installed || st[1].Reason == "" {
		t.Errorf("export, no route: %+v", st[1])
	}
}

// TestForeignDevice: a link with the device's name that is not skein's
// makes the vxlan Sync fail and is neither changed nor deleted, by any mode.
func TestForeignDevice(t *testing.T) {
	nodes := lan(t, 2)
	n := nodes[0]
	h := n.ns.Handle(t)
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: routing.DefaultVXLANDevice}}); err != nil {
		t.Fatal(err)
	}
	before := harness.Snapshot(t, n.ns)
	if _, err := newKernel(t, n, vxlanCfg(n, false)).Sync(t.Context(), remotes(n, nodes...)); err == nil || !strings.Contains(err.Error(), "not skein's") {
		t.Errorf("vxlan sync over a foreign link: %v", err)
	}
	if err := newKernel(t, n, kernel.KernelConfig{}).Uninstall(); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, n.ns))
}

// TestOrphanDevice: a VXLAN device of skein's name and MAC but without the
// alias (a crash between creating it and setting the alias) is adopted,
// not refused.
func TestOrphanDevice(t *testing.T) {
	nodes := lan(t, 2)
	n := nodes[0]
	h := n.ns.Handle(t)
	ul, err := h.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	orphan := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: routing.DefaultVXLANDevice, HardwareAddr: kernel.MACFor(n.addrs[0])},
		VxlanId: 7, VtepDevIndex: ul.Attrs().Index, SrcAddr: n.addrs[0].AsSlice(), Port: 4789}
	if err := h.LinkAdd(orphan); err != nil {
		t.Fatal(err)
	}
	for _, o := range nodes {
		requireInstalled(t, mustSync(t, newKernel(t, o, vxlanCfg(o, false)), remotes(o, nodes...)))
	}
	if d := device(t, n); d.VxlanId != routing.DefaultVXLANVNI || d.Alias != "skein:routing:vxlan" {
		t.Errorf("device: vni %d alias %q", d.VxlanId, d.Alias)
	}
	pingAll(t, nodes...)
}

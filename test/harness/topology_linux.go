package harness

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Topology is a small network of node namespaces for tests of routing
// between nodes: every node has one underlay link, UnderlayDev, with an
// IPv4 and an IPv6 address on its subnet. With one subnet the nodes hang
// off one bridge (an L2 segment: every node reaches every other directly);
// with two, each subnet has its own bridge and a router namespace joins
// them at L3 (forwarding on, each node has a route to the other subnet via
// the router), so nodes of different subnets reach each other only
// through a gateway.
//
// Every namespace is a harness.NS: it is removed at test cleanup, also
// when the test fails, and the links go with it. Nothing is made in the
// namespace the test runs in.
type Topology struct {
	// Nodes in order; node i is on subnet i*Subnets/len(Nodes) (the
	// first half on subnet 0, the second on subnet 1 when there are two).
	Nodes []*TopoNode
	// Switches hold one bridge each (SwitchBridge), one per subnet.
	Switches []*NS
	// Router joins the subnets; nil with a single subnet.
	Router *NS
	// Subnets4 and Subnets6 are the underlay subnets, one per switch.
	Subnets4, Subnets6 []netip.Prefix
	// RouterAddrs are the router's addresses, one [IPv4, IPv6] pair per
	// subnet; empty with a single subnet.
	RouterAddrs [][2]netip.Addr
}

// TopoNode is one node of a Topology.
type TopoNode struct {
	*NS
	// Index is the node's position in Topology.Nodes.
	Index int
	// Subnet is the index of its subnet (its switch).
	Subnet int
	// Addr4 and Addr6 are its underlay addresses on UnderlayDev.
	Addr4, Addr6 netip.Addr
}

// Addrs returns the node's underlay addresses, IPv4 first.
func (n *TopoNode) Addrs() []netip.Addr { return []netip.Addr{n.Addr4, n.Addr6} }

// Addr returns the node's underlay address of one family.
func (n *TopoNode) Addr(v6 bool) netip.Addr {
	if v6 {
		return n.Addr6
	}
	return n.Addr4
}

// Names of the links a Topology makes.
const (
	// UnderlayDev is each node's underlay link.
	UnderlayDev = "eth0"
	// SwitchBridge is the bridge in each switch namespace.
	SwitchBridge = "br0"
)

// TopologyOptions shapes NewTopology. Zero values are usable.
type TopologyOptions struct {
	// Nodes is the number of node namespaces; default 3.
	Nodes int
	// Subnets is 1 (one bridge, the default) or 2 (two bridges joined by
	// a router namespace).
	Subnets int
	// MTU of every underlay link; 0 = the kernel's default (1500).
	MTU int
	// Prefix starts the node namespaces' names (harness.NewNS); default
	// "node".
	Prefix string
}

// Underlay addressing: subnet s is 172.31.s.0/24 and fd00:172:31:s::/64,
// node i is host i+1 on its subnet, the router host 254.
func underlay(subnet, host int) (netip.Prefix, netip.Prefix) {
	v4 := netip.AddrFrom4([4]byte{172, 31, byte(subnet), byte(host)})
	v6 := netip.AddrFrom16([16]byte{0xfd, 0x00, 0x01, 0x72, 0x00, 0x31, 0x00, byte(subnet), 15: byte(host)})
	return netip.PrefixFrom(v4, 24), netip.PrefixFrom(v6, 64)
}

// NewTopology builds the network o describes and returns it once every
// link is up and every address usable (IPv6 addresses skip duplicate
// address detection). It calls t.Fatal on failure; what was made so far
// is removed at cleanup.
func NewTopology(t testing.TB, o TopologyOptions) *Topology {
	t.Helper()
	RequireRoot(t)
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Subnets == 0 {
		o.Subnets = 1
	}
	if o.Prefix == "" {
		o.Prefix = "node"
	}
	if o.Subnets < 1 || o.Subnets > 2 || o.Nodes < o.Subnets || o.Nodes > 200 {
		t.Fatalf("topology: %d nodes on %d subnets: want 1 or 2 subnets and at least one node on each", o.Nodes, o.Subnets)
	}
	topo := &Topology{}
	for s := range o.Subnets {
		sw := NewNS(t, "switch")
		noDAD(t, sw)
		h := sw.Handle(t)
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: SwitchBridge, MTU: o.MTU}, MulticastSnooping: new(bool)}
		if err := h.LinkAdd(br); err != nil {
			t.Fatalf("bridge in %s: %v", sw.Name(), err)
		}
		if err := h.LinkSetUp(br); err != nil {
			t.Fatalf("bridge up in %s: %v", sw.Name(), err)
		}
		topo.Switches = append(topo.Switches, sw)
		p4, p6 := underlay(s, 0)
		topo.Subnets4 = append(topo.Subnets4, p4.Masked())
		topo.Subnets6 = append(topo.Subnets6, p6.Masked())
	}
	if o.Subnets == 2 {
		topo.Router = NewNS(t, "router")
		noDAD(t, topo.Router)
		if err := netns.WriteSysctls(topo.Router.Path(),
			[2]string{"net.ipv4.ip_forward", "1"}, [2]string{"net.ipv6.conf.all.forwarding", "1"}); err != nil {
			t.Fatalf("router forwarding: %v", err)
		}
		for s, sw := range topo.Switches {
			dev := fmt.Sprintf("sub%d", s)
			plug(t, sw, topo.Router, dev, dev, o.MTU)
			a4, a6 := underlay(s, 254)
			addAddrs(t, topo.Router, dev, a4, a6)
			topo.RouterAddrs = append(topo.RouterAddrs, [2]netip.Addr{a4.Addr(), a6.Addr()})
		}
	}
	for i := range o.Nodes {
		s := i * o.Subnets / o.Nodes
		n := &TopoNode{NS: NewNS(t, o.Prefix), Index: i, Subnet: s}
		noDAD(t, n.NS)
		plug(t, topo.Switches[s], n.NS, fmt.Sprintf("n%d", i), UnderlayDev, o.MTU)
		a4, a6 := underlay(s, i+1)
		addAddrs(t, n.NS, UnderlayDev, a4, a6)
		n.Addr4, n.Addr6 = a4.Addr(), a6.Addr()
		if topo.Router != nil {
			other := 1 - s
			h := n.Handle(t)
			link, err := h.LinkByName(UnderlayDev)
			if err != nil {
				t.Fatal(err)
			}
			for fam, dst := range []netip.Prefix{topo.Subnets4[other], topo.Subnets6[other]} {
				gw := topo.RouterAddrs[s][fam]
				r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: ipNet(dst), Gw: gw.AsSlice()}
				if err := h.RouteAdd(r); err != nil {
					t.Fatalf("route %s via %s in %s: %v", dst, gw, n.Name(), err)
				}
			}
		}
		topo.Nodes = append(topo.Nodes, n)
	}
	return topo
}

// noDAD turns IPv6 duplicate address detection off in ns for links made
// from now on, so that addresses are usable at once.
func noDAD(t testing.TB, ns *NS) {
	t.Helper()
	if err := netns.WriteSysctls(ns.Path(),
		[2]string{"net.ipv6.conf.all.accept_dad", "0"}, [2]string{"net.ipv6.conf.default.accept_dad", "0"}); err != nil {
		t.Fatalf("dad off in %s: %v", ns.Name(), err)
	}
}

// plug connects ns to the bridge of switch sw: a veth named swDev in the
// switch (enslaved to the bridge) and dev in ns, both up.
func plug(t testing.TB, sw, ns *NS, swDev, dev string, mtu int) {
	t.Helper()
	br, err := sw.Handle(t).LinkByName(SwitchBridge)
	if err != nil {
		t.Fatalf("bridge in %s: %v", sw.Name(), err)
	}
	sw.AddVeth(t, Veth{Name: swDev, PeerName: dev, Peer: ns, MTU: mtu, Master: br.Attrs().Index})
}

// addAddrs puts the given addresses on dev in ns, IPv6 without DAD.
func addAddrs(t testing.TB, ns *NS, dev string, prefixes ...netip.Prefix) {
	t.Helper()
	h := ns.Handle(t)
	link, err := h.LinkByName(dev)
	if err != nil {
		t.Fatalf("%s in %s: %v", dev, ns.Name(), err)
	}
	for _, p := range prefixes {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, a); err != nil {
			t.Fatalf("add %s to %s in %s: %v", p, dev, ns.Name(), err)
		}
	}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// TableRoutes lists the routes of one routing table in ns, both families
// (unix.RT_TABLE_MAIN for the main table); it calls t.Fatal on error. It
// holds no handle after it returns, so it suits polling loops.
func (ns *NS) TableRoutes(t testing.TB, table int) []netlink.Route {
	t.Helper()
	h, closeH, err := netns.Handle(ns.path)
	if err != nil {
		t.Fatalf("handle in %s: %v", ns.name, err)
	}
	defer closeH()
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatalf("routes of table %d in %s: %v", table, ns.name, err)
	}
	return routes
}

// RouteDst returns a route's destination as a prefix (0/0 or ::/0 for a
// default route).
func RouteDst(r netlink.Route) netip.Prefix {
	if r.Dst == nil {
		if r.Family == unix.AF_INET6 {
			return netip.MustParsePrefix("::/0")
		}
		return netip.MustParsePrefix("0.0.0.0/0")
	}
	a, _ := netip.AddrFromSlice(r.Dst.IP)
	ones, _ := r.Dst.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

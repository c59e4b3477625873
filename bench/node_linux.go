package bench

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// Addresses every benchmark node has, on its lo.
var (
	nodeAddrV4 = netip.MustParseAddr("192.0.2.1")
	nodeAddrV6 = netip.MustParseAddr("2001:db8::1")
)

// newNode makes a node namespace (owned by sc) with lo up and holding an
// address of each family, as every real node has an address. It matters
// for the figures: when the kernel adds an IPv4 route without a source
// address it picks one, from the route's own link first, then from every
// link of the namespace in turn until one has an address — in a namespace
// without any, a walk over every host veth on each host route a
// routed-veth plugin adds, which no real node would make.
//
// Forwarding is on for both families, as on every Kubernetes node (and as
// skeind sets its node by default): with net.ipv6.conf.all.forwarding=1
// every IPv6-enabled link is a router's, and the kernel's delete of such a
// veth takes about twice as long (~40 against ~20 ms here). Before, only
// skein's node had it, and its dual-stack DEL was measured against a floor
// that did not pay for it.
func newNode(sc *scope) *harness.NS {
	n := harness.NewNS(sc, "bnode")
	h := n.Handle(sc)
	lo, err := h.LinkByName("lo")
	if err != nil {
		sc.Fatalf("node lo: %v", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		sc.Fatalf("node lo up: %v", err)
	}
	for _, a := range []netip.Addr{nodeAddrV4, nodeAddrV6} {
		na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
		if err := h.AddrAdd(lo, na); err != nil {
			sc.Fatalf("node address %s: %v", a, err)
		}
	}
	if err := netns.WriteSysctls(n.Path(), [2]string{"net.ipv4.ip_forward", "1"}, [2]string{"net.ipv6.conf.all.forwarding", "1"}); err != nil {
		sc.Fatalf("node forwarding: %v", err)
	}
	return n
}

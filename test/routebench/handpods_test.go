package routebench

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// The floor of the pod rows: pods plumbed by hand the way skein plumbs
// them (a routed veth, the pod's address a /32 with its default route via
// 169.254.1.1 onlink, proxy ARP on the host end, forwarding on, a host
// route per pod) and a static route per remote pod subnet, without skeind,
// its tables or its rules. Pod traffic crosses two more veth pairs and
// two forwarding decisions than node-to-node traffic; these rows show what
// that costs on this machine whoever programs it.

var handGateway = netip.MustParseAddr("169.254.1.1")

// handPod makes a pod namespace behind node n with address addr.
// mtu is both ends' (0: the kernel's default).
func handPod(t testing.TB, n *harness.TopoNode, hostDev string, addr netip.Addr, mtu int) *harness.NS {
	t.Helper()
	pod := harness.NewNS(t, "rb-hpod")
	n.AddVeth(t, harness.Veth{Name: hostDev, PeerName: "eth0", Peer: pod, MTU: mtu})
	if err := netns.WriteSysctls(n.Path(),
		[2]string{"net.ipv4.conf." + hostDev + ".proxy_arp", "1"},
		[2]string{"net.ipv4.ip_forward", "1"}); err != nil { // as skeind --node-forwarding (its default) sets it
		t.Fatal(err)
	}
	hh := n.Handle(t)
	// The gateway is a local route of the node, on no interface (as
	// skein's Init makes it): proxy ARP answers for local addresses.
	lo, err := hh.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := hh.RouteReplace(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: hostPrefix(handGateway), Type: unix.RTN_LOCAL,
		Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST}); err != nil {
		t.Fatalf("local route %s in %s: %v", handGateway, n.Name(), err)
	}
	host, err := hh.LinkByName(hostDev)
	if err != nil {
		t.Fatal(err)
	}
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: hostPrefix(addr)}); err != nil {
		t.Fatalf("route to %s in %s: %v", addr, n.Name(), err)
	}
	ph := pod.Handle(t)
	eth0, err := ph.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ph.AddrAdd(eth0, &netlink.Addr{IPNet: hostPrefix(addr)}); err != nil {
		t.Fatal(err)
	}
	if err := ph.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: handGateway.AsSlice(),
		Flags: int(netlink.FLAG_ONLINK), Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
		t.Fatalf("default route in pod of %s: %v", n.Name(), err)
	}
	return pod
}

// handRoute routes dst via gw (on dev) in n.
func handRoute(t testing.TB, n *harness.TopoNode, dst netip.Prefix, gw netip.Addr, dev string) {
	t.Helper()
	h := n.Handle(t)
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice(),
		Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}}); err != nil {
		t.Fatalf("route %s via %s in %s: %v", dst, gw, n.Name(), err)
	}
}

func hostPrefix(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}
}

// handPodPair makes one pod behind each of a and b, in subnets
// 10.<second>.1.0/24 and 10.<second>.2.0/24, routed to each other via the
// peer's address on dev (the underlay, or the hand-made VXLAN device with
// the peer's address on it), and returns the pods and b's pod address.
// The pods' MTU is dev's, as skein sets it.
func handPodPair(t testing.TB, a, b *harness.TopoNode, second byte, dev string, aVia, bVia netip.Addr) (from, to *harness.NS, toAddr netip.Addr) {
	t.Helper()
	mtu := linkMTU(t, a.NS, dev)
	aPod, bPod := netip.AddrFrom4([4]byte{10, second, 1, 2}), netip.AddrFrom4([4]byte{10, second, 2, 2})
	from = handPod(t, a, fmt.Sprintf("hp%d", second), aPod, mtu)
	to = handPod(t, b, fmt.Sprintf("hp%d", second), bPod, mtu)
	handRoute(t, a, netip.PrefixFrom(bPod, 24).Masked(), bVia, dev)
	handRoute(t, b, netip.PrefixFrom(aPod, 24).Masked(), aVia, dev)
	return from, to, bPod
}

package routebench

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// The underlay: one bridge in its own namespace, every node namespace
// joined to it by a veth (its eth0). Node addresses are 10.99.0.x/16; the
// bridge holds the gateway, so a node's default route has a next hop, as
// on a real segment, and only the /16 is directly connected.
var (
	underlaySubnet  = netip.MustParsePrefix("10.99.0.0/16")
	underlayGateway = netip.MustParseAddr("10.99.255.254")
)

const underlayMTU = 1500

type underlay struct {
	br    *harness.NS
	brIdx int
	nodes int
}

type node struct {
	name string
	ns   *harness.NS
	addr netip.Addr // on eth0
}

func newUnderlay(t testing.TB) *underlay {
	t.Helper()
	u := &underlay{br: harness.NewNS(t, "rb-ul")}
	h := u.br.Handle(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0", MTU: underlayMTU, TxQLen: -1}}
	if err := h.LinkAdd(br); err != nil {
		t.Fatalf("bridge: %v", err)
	}
	if err := h.LinkSetUp(br); err != nil {
		t.Fatalf("bridge up: %v", err)
	}
	u.brIdx = br.Index
	u.br.AddAddr(t, "br0", netip.PrefixFrom(underlayGateway, underlaySubnet.Bits()))
	return u
}

// addNode makes a node namespace on the underlay with forwarding on (as on
// a Kubernetes node) and a default route through the gateway.
func (u *underlay) addNode(t testing.TB, name string) *node {
	t.Helper()
	u.nodes++
	n := &node{name: name, ns: harness.NewNS(t, "rb-"+name), addr: nodeAddr(u.nodes)}
	u.br.AddVeth(t, harness.Veth{Name: fmt.Sprintf("p%d", u.nodes), PeerName: "eth0", Peer: n.ns, MTU: underlayMTU, Master: u.brIdx})
	n.ns.AddAddr(t, "eth0", netip.PrefixFrom(n.addr, underlaySubnet.Bits()))
	h := n.ns.Handle(t)
	if err := h.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, Gw: underlayGateway.AsSlice()}); err != nil {
		t.Fatalf("default route in %s: %v", name, err)
	}
	if err := netns.WriteSysctls(n.ns.Path(), [2]string{"net.ipv4.ip_forward", "1"}); err != nil {
		t.Fatal(err)
	}
	return n
}

// nodeAddr is the i-th (1-based) node address of the underlay.
func nodeAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 99, byte(i / 250), byte(i%250 + 1)})
}

package routebench

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
)

// The baseline of the vxlan rows: a plain kernel VXLAN pair made by hand
// between two node namespaces, as `ip link add hvx type vxlan id 4200
// local A remote B dstport 4789 dev eth0` makes it, with the MTU rule
// skein uses (the underlay's minus routing.OverheadVXLAN4), and an address
// of 192.168.231.0/24 on each end.
const (
	handVNI    = 4200
	handDevice = "hvx"
)

var handSubnet = netip.MustParsePrefix("192.168.231.0/24")

// handVXLAN makes the pair between a and b and returns the far end's
// address of each side (a reaches b at the second).
func handVXLAN(t testing.TB, a, b *harness.TopoNode) (aAddr, bAddr netip.Addr) {
	t.Helper()
	aAddr, bAddr = handSubnet.Addr().Next(), handSubnet.Addr().Next().Next()
	for _, side := range []struct {
		n, peer *harness.TopoNode
		addr    netip.Addr
	}{{a, b, aAddr}, {b, a, bAddr}} {
		h := side.n.Handle(t)
		eth0, err := h.LinkByName(harness.UnderlayDev)
		if err != nil {
			t.Fatal(err)
		}
		vx := &netlink.Vxlan{
			LinkAttrs:    netlink.LinkAttrs{Name: handDevice, MTU: eth0.Attrs().MTU - routing.OverheadVXLAN4, TxQLen: -1},
			VxlanId:      handVNI,
			VtepDevIndex: eth0.Attrs().Index,
			SrcAddr:      side.n.Addr4.AsSlice(),
			Group:        side.peer.Addr4.AsSlice(),
			Port:         routing.DefaultVXLANPort,
			Learning:     true,
		}
		if err := h.LinkAdd(vx); err != nil {
			t.Fatalf("vxlan %s in %s: %v", handDevice, side.n.Name(), err)
		}
		if err := h.AddrAdd(vx, &netlink.Addr{IPNet: &net.IPNet{IP: side.addr.AsSlice(), Mask: net.CIDRMask(handSubnet.Bits(), 32)}}); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(vx); err != nil {
			t.Fatal(err)
		}
	}
	return aAddr, bAddr
}

// Package bench holds skein's benchmarks: the CNI front door through libcni
// (plugin exec included, as a runtime sees it) side by side with the
// raw-netlink floor of the same plumbing, and the harness behind
// `make bench`.
package bench

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Floor does the kernel work of a routed-veth attachment and nothing else —
// no IPAM, no store, no IPC, no process: create the veth pair in the node,
// move the peer into the pod, address it, bring both ends up, route the
// pod's addresses on the host and the pod's default routes via the host.
// It is the physical limit any CNI plugin of this design can approach.
type Floor struct {
	node *netlink.Handle
}

// NewFloor returns a floor plumber for the node namespace at nodePath.
func NewFloor(nodePath string) (*Floor, func(), error) {
	h, closeH, err := netns.Handle(nodePath)
	if err != nil {
		return nil, nil, err
	}
	return &Floor{node: h}, closeH, nil
}

var gw4, gw6 = net.ParseIP("169.254.1.1"), net.ParseIP("fe80::1")

// Setup plumbs host link hostName to ifName in the pod at podPath.
func (f *Floor) Setup(hostName, podPath, ifName string, addrs []netip.Addr) error {
	pod, closePod, err := netns.Handle(podPath)
	if err != nil {
		return err
	}
	defer closePod()
	nsf, err := os.Open(podPath)
	if err != nil {
		return err
	}
	defer nsf.Close()

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName, Flags: net.FlagUp}, PeerName: ifName}
	if err := f.node.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	peer, err := f.node.LinkByName(ifName)
	if err != nil {
		return err
	}
	if err := f.node.LinkSetNsFd(peer, int(nsf.Fd())); err != nil {
		return fmt.Errorf("move: %w", err)
	}
	ctr, err := pod.LinkByName(ifName)
	if err != nil {
		return err
	}
	if err := pod.LinkSetUp(ctr); err != nil {
		return err
	}
	for _, a := range addrs {
		ad := &netlink.Addr{IPNet: netlink.NewIPNet(a.AsSlice())}
		if a.Is6() {
			ad.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrAdd(ctr, ad); err != nil {
			return err
		}
		gw, r := gw4, &netlink.Route{LinkIndex: ctr.Attrs().Index, Flags: int(netlink.FLAG_ONLINK)}
		if a.Is6() {
			gw, r.Flags = gw6, 0
		}
		r.Gw = gw
		if err := pod.RouteAdd(r); err != nil {
			return err
		}
		host := &netlink.Route{LinkIndex: veth.Index, Dst: netlink.NewIPNet(a.AsSlice()), Scope: netlink.SCOPE_LINK, Table: 116}
		if a.Is6() {
			host.Scope = netlink.SCOPE_UNIVERSE
		}
		if err := f.node.RouteAdd(host); err != nil {
			return err
		}
	}
	return nil
}

// Teardown deletes the host link (and with it the peer and the routes).
func (f *Floor) Teardown(hostName string) error {
	l, err := f.node.LinkByName(hostName)
	if err != nil {
		return err
	}
	return f.node.LinkDel(l)
}

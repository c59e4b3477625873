package harness

import (
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

// AddAddr adds prefix to link dev inside the namespace (e.g. a node's own
// address on its lo); it calls t.Fatal on failure.
func (ns *NS) AddAddr(t testing.TB, dev string, prefix netip.Prefix) {
	t.Helper()
	h := ns.Handle(t)
	l, err := h.LinkByName(dev)
	if err == nil {
		err = h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}})
	}
	if err != nil {
		t.Fatalf("add %s to %s in %s: %v", prefix, dev, ns.name, err)
	}
}

// Veth describes a veth pair for NS.AddVeth. Zero values: the kernel's
// default MTU, no master, a random MAC on the peer.
type Veth struct {
	Name     string           // the end in the namespace AddVeth is called on
	PeerName string           // the end moved into Peer
	Peer     *NS              // where the peer lives
	MTU      int              // of both ends
	Master   int              // index of a bridge (in the first namespace) to enslave Name to
	PeerMAC  net.HardwareAddr // the peer's MAC
}

// AddVeth creates the pair v describes, with its first end in ns, and
// brings both ends up; it calls t.Fatal on failure. The pair goes with the
// namespaces at cleanup.
func (ns *NS) AddVeth(t testing.TB, v Veth) {
	t.Helper()
	peerFd, err := os.Open(v.Peer.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer peerFd.Close()
	link := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: v.Name, MTU: v.MTU, MasterIndex: v.Master, TxQLen: -1},
		PeerName:  v.PeerName, PeerHardwareAddr: v.PeerMAC, PeerMTU: uint32(v.MTU),
		PeerNamespace: netlink.NsFd(peerFd.Fd()),
	}
	h := ns.Handle(t)
	if err := h.LinkAdd(link); err != nil {
		t.Fatalf("veth %s (in %s) - %s (in %s): %v", v.Name, ns.name, v.PeerName, v.Peer.name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatalf("veth %s up: %v", v.Name, err)
	}
	ph := v.Peer.Handle(t)
	peer, err := ph.LinkByName(v.PeerName)
	if err == nil {
		err = ph.LinkSetUp(peer)
	}
	if err != nil {
		t.Fatalf("veth %s up in %s: %v", v.PeerName, v.Peer.name, err)
	}
}

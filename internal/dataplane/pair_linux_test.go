package dataplane_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/test/harness"
)

// moveLikeDocker does to a pair's peer what libnetwork does on Join: move
// it into the sandbox, rename it, set the addresses with the network's
// mask (a /24 and a /64, not /32 and /128), bring it up, add the connected
// route to the gateway and the static routes the driver returned, then the
// default routes.
func moveLikeDocker(t *testing.T, node, pod *harness.NS, peer string, v4, v6 netip.Prefix, gw6 netip.Addr) {
	t.Helper()
	nh, ph := node.Handle(t), pod.Handle(t)
	l, err := nh.LinkByName(peer)
	if err != nil {
		t.Fatalf("peer %s not in the node: %v", peer, err)
	}
	f, err := os.Open(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := nh.LinkSetNsFd(l, int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	l, err = ph.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := ph.LinkSetName(l, "eth0"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []netip.Prefix{v4, v6} {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := ph.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := ph.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	idx := l.Attrs().Index
	gw4 := dataplane.DefaultGatewayV4
	routes := []*netlink.Route{
		{LinkIndex: idx, Dst: &net.IPNet{IP: gw4.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK},
		{LinkIndex: idx, Gw: gw4.AsSlice()},
		{LinkIndex: idx, Gw: gw6.AsSlice()},
	}
	// The two halves of the /64 via the gateway: more specific than the
	// subnet route the address brought, so neighbours are not solicited.
	for _, half := range halves(v6.Masked()) {
		routes = append(routes, &netlink.Route{LinkIndex: idx, Gw: gw6.AsSlice(), Dst: &net.IPNet{IP: half.Addr().AsSlice(), Mask: net.CIDRMask(half.Bits(), 128)}})
	}
	for _, r := range routes {
		if err := ph.RouteAdd(r); err != nil {
			t.Fatalf("route %v: %v", r, err)
		}
	}
}

func halves(p netip.Prefix) []netip.Prefix {
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	b := p.Addr().As16()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	return []netip.Prefix{lo, netip.PrefixFrom(netip.AddrFrom16(b), p.Bits()+1)}
}

// TestPairMovedLikeDocker: two pairs made with SetupPair and moved into pods
// as Docker does reach each other and the node in both families, although
// the pods hold /24 and /64 masks; Scan sees both; Teardown by host name
// restores the node exactly.
func TestPairMovedLikeDocker(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{NodeForwarding: true})
	before := harness.Snapshot(t, node)
	pods := []*harness.NS{harness.NewNS(t, "pod"), harness.NewNS(t, "pod")}
	addrs := [][2]netip.Prefix{
		{netip.MustParsePrefix("10.100.0.2/24"), netip.MustParsePrefix("fd00:100::2/64")},
		{netip.MustParsePrefix("10.100.0.3/24"), netip.MustParsePrefix("fd00:100::3/64")},
	}
	hosts := []string{"skpairh0", "skpairh1"}
	for i, pod := range pods {
		p := dataplane.Pair{
			HostName: hosts[i], PeerName: "skpairp" + string(rune('0'+i)),
			Alias: "skein:docker:test:" + pod.Name(),
			Addrs: []netip.Addr{addrs[i][0].Addr(), addrs[i][1].Addr()},
		}
		ap, err := d.SetupPair(p)
		if err != nil {
			t.Fatalf("SetupPair: %v", err)
		}
		peer, err := node.Handle(t).LinkByName(p.PeerName)
		if err != nil {
			t.Fatalf("after SetupPair the peer should wait in the node namespace: %v", err)
		}
		if peer.Attrs().Flags&net.FlagUp != 0 || peer.Attrs().Index != ap.ContainerIndex {
			t.Errorf("peer %s: want down with index %d, got flags %v index %d", p.PeerName, ap.ContainerIndex, peer.Attrs().Flags, peer.Attrs().Index)
		}
		if ap.GatewayV6 != dataplane.LinkLocal(ap.HostMAC) {
			t.Errorf("SetupPair's IPv6 gateway %v should be the host veth's link-local address %v", ap.GatewayV6, dataplane.LinkLocal(ap.HostMAC))
		}
		moveLikeDocker(t, node, pod, p.PeerName, addrs[i][0], addrs[i][1], ap.GatewayV6)
	}
	found, err := d.Scan()
	if err != nil || len(found) != 2 {
		t.Fatalf("Scan = %v, %v; want both host veths", found, err)
	}
	for _, to := range []netip.Addr{addrs[1][0].Addr(), addrs[1][1].Addr(), nodeV4, nodeV6} {
		mustPing(t, pods[0], to)
	}
	mustPing(t, pods[1], addrs[0][0].Addr())
	for _, h := range hosts {
		if err := d.Teardown(h, "", "", nil); err != nil {
			t.Errorf("Teardown %s: %v", h, err)
		}
		if err := d.Teardown(h, "", "", nil); err != nil {
			t.Errorf("Teardown %s twice: %v", h, err)
		}
	}
	harness.AssertSame(t, before, harness.Snapshot(t, node))
	for _, pod := range pods {
		if _, err := pod.Handle(t).LinkByName("eth0"); err == nil {
			t.Errorf("eth0 still in %s after Teardown of its host end", pod.Name())
		}
	}
}

// TestPairNeverMoved: a pair whose peer Docker never took is removed whole.
func TestPairNeverMoved(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{})
	before := harness.Snapshot(t, node)
	if _, err := d.SetupPair(dataplane.Pair{HostName: "skh", PeerName: "skp", Alias: "skein:x", Addrs: []netip.Addr{netip.MustParseAddr("10.1.0.2")}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Teardown("skh", "", "", nil); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, node))
}

func TestPairFailuresLeaveNothing(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{})
	nh := node.Handle(t)
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sktaken", TxQLen: -1}, PeerName: "sktakenp"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SetupPair(dataplane.Pair{HostName: "skother", PeerName: "skotherp", Alias: "skein:o", Addrs: []netip.Addr{netip.MustParseAddr("10.100.0.9")}}); err != nil {
		t.Fatal(err)
	}
	ok := dataplane.Pair{HostName: "skh1", PeerName: "skp1", Alias: "skein:t", Addrs: []netip.Addr{netip.MustParseAddr("fd00::5"), netip.MustParseAddr("10.100.0.5")}}
	mod := func(f func(*dataplane.Pair)) dataplane.Pair { p := ok; f(&p); return p }
	for _, c := range []struct {
		name string
		pair dataplane.Pair
		want error
	}{
		{"peer name taken", mod(func(p *dataplane.Pair) { p.PeerName = "sktakenp" }), dataplane.ErrLinkExists},
		{"host name taken", mod(func(p *dataplane.Pair) { p.HostName = "sktaken" }), dataplane.ErrLinkExists},
		{"same names", mod(func(p *dataplane.Pair) { p.PeerName = p.HostName }), dataplane.ErrInvalid},
		{"peer name too long", mod(func(p *dataplane.Pair) { p.PeerName = "skdabcdefghijklmn" }), dataplane.ErrInvalid},
		{"alias without prefix", mod(func(p *dataplane.Pair) { p.Alias = "docker" }), dataplane.ErrInvalid},
		{"no address", mod(func(p *dataplane.Pair) { p.Addrs = nil }), dataplane.ErrInvalid},
		// Fails after the pair exists: the rollback must remove it.
		{"address already routed", mod(func(p *dataplane.Pair) { p.Addrs = append(p.Addrs, netip.MustParseAddr("10.100.0.9")) }), unix.EEXIST},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := harness.Snapshot(t, node)
			_, err := d.SetupPair(c.pair)
			var de *dataplane.Error
			if !errors.Is(err, c.want) || !errors.As(err, &de) || de.Op != "setup pair" {
				t.Errorf("SetupPair = %v, want *Error wrapping %v", err, c.want)
			}
			harness.AssertSame(t, before, harness.Snapshot(t, node))
		})
	}
}

package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/harness"
)

// The router is no open relay (issue 19): what comes out of a tunnel is
// forwarded only when its inner source is that tunnel's client and its
// destination one of the Egress's; tunnel names cannot collide; a removed
// peer leaves no conntrack state behind.

const probePort = 7031

// recorder listens for UDP on probePort at each of addrs in ns and
// returns the source addresses of what arrives.
func recorder(t *testing.T, ns *harness.NS, addrs ...netip.Addr) <-chan string {
	t.Helper()
	got := make(chan string, 64)
	for _, a := range addrs {
		var pc net.PacketConn
		if err := ns.Do(func() error {
			var err error
			pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, probePort).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			b := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(b)
				if err != nil {
					return
				}
				select {
				case got <- from.(*net.UDPAddr).AddrPort().Addr().Unmap().String():
				default:
				}
			}
		}()
	}
	return got
}

// sendFrom sends one datagram from src (bound; zero: the kernel's
// choice) to dst:probePort inside ns.
func sendFrom(t *testing.T, ns *harness.NS, src, dst netip.Addr) {
	t.Helper()
	err := ns.Do(func() error {
		var laddr *net.UDPAddr
		if src.IsValid() {
			laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		}
		c, err := net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, probePort)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	})
	if err != nil {
		t.Fatalf("send from %s to %s: %v", src, dst, err)
	}
}

// nothingArrives asserts that got stays empty for a while (TCG is slow:
// two seconds).
func nothingArrives(t *testing.T, got <-chan string, what string) {
	t.Helper()
	select {
	case s := <-got:
		t.Errorf("%s: the external server received a packet from %s, want none", what, s)
	case <-time.After(2 * time.Second):
	}
}

// arrives asserts that a packet arrives from one of the routers.
func arrives(t *testing.T, got <-chan string, what string) {
	t.Helper()
	select {
	case s := <-got:
		if routerOf(s) < 0 {
			t.Errorf("%s: the external server saw %s, want a router's address", what, s)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("%s: nothing arrived at the external server", what)
	}
}

func drops(t *testing.T, tp *topo) (src, dst uint64) {
	t.Helper()
	for _, s := range stats(t, tp) {
		src += s.DroppedSource
		dst += s.DroppedDestination
	}
	return src, dst
}

// TestGuestRouterForeignSource: a client that sends through its tunnel
// with an inner source address other than its own gets nothing through:
// neither an address no router knows nor another peer's (each tunnel
// accepts only its own client's address), and Stats counts the drops.
func TestGuestRouterForeignSource(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	stranger4, stranger6 := ip("10.100.0.98"), ip("fd00:100::98")
	other4, other6 := ip("10.100.0.99"), ip("fd00:100::99") // peers, but not of this tunnel
	for i, r := range tp.r {
		if err := r.SyncPeers([]netip.Addr{client4, client6, other4, other6}); err != nil {
			t.Fatalf("router %d: %v", i+1, err)
		}
	}
	// The tunnel first: its local end (the outer source) is the pod's
	// address, not one of those added next.
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	ch := tp.client.Handle(t)
	eth0, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{stranger4, other4, stranger6, other6} {
		addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD}
		if err := ch.AddrAdd(eth0, addr); err != nil {
			t.Fatalf("add %s to the client: %v", a, err)
		}
	}
	got := recorder(t, tp.ext, ext4, ext6)
	src0, _ := drops(t, tp)
	for _, c := range []struct{ src, dst netip.Addr }{
		{stranger4, ext4}, {other4, ext4}, {stranger6, ext6}, {other6, ext6},
	} {
		sendFrom(t, tp.client, c.src, c.dst)
		nothingArrives(t, got, fmt.Sprintf("from %s through the client's tunnel", c.src))
	}
	src1, _ := drops(t, tp)
	if src1-src0 != 4 {
		t.Errorf("the routers counted %d packets dropped for their source, want 4", src1-src0)
	}
	// The client's own addresses still get through: the listener works,
	// and the check is no wall.
	sendFrom(t, tp.client, client4, ext4)
	arrives(t, got, "from the client's own IPv4 address")
	sendFrom(t, tp.client, client6, ext6)
	arrives(t, got, "from the client's own IPv6 address")
	// Without the extra addresses (an unbound socket might pick one),
	// connections go through as before.
	for _, a := range []netip.Addr{stranger4, other4, stranger6, other6} {
		if err := ch.AddrDel(eth0, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, a.BitLen()))}); err != nil {
			t.Fatalf("remove %s from the client: %v", a, err)
		}
	}
	mustVia(t, tp, "tcp", ext4)
	mustVia(t, tp, "tcp", ext6)
}

// TestGuestRouterDestinations: the routers forward from their tunnels
// only to the Egress's destinations, follow SyncDestinations, and refuse
// a bad list without changing anything.
func TestGuestRouterDestinations(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	narrow := []netip.Prefix{pfx("198.51.100.0/24"), pfx("2001:db8:fe::/64")}
	for i, r := range tp.r {
		if err := r.SyncDestinations(narrow); err != nil {
			t.Fatalf("router %d: %v", i+1, err)
		}
	}
	// The client sends everything to the gateway; the routers may not.
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	mustVia(t, tp, "udp", far4)
	mustVia(t, tp, "tcp", far6)
	got := recorder(t, tp.ext, ext4, ext6)
	_, dst0 := drops(t, tp)
	sendFrom(t, tp.client, client4, ext4)
	nothingArrives(t, got, "to "+ext4.String()+", not a destination")
	sendFrom(t, tp.client, client6, ext6)
	nothingArrives(t, got, "to "+ext6.String()+", not a destination")
	if _, dst1 := drops(t, tp); dst1-dst0 != 2 {
		t.Errorf("the routers counted %d packets dropped for their destination, want 2", dst1-dst0)
	}

	// Bad lists: refused, nothing changed.
	for _, bad := range [][]netip.Prefix{
		{pfx("192.0.2.0/24"), {}},
		{netip.PrefixFrom(ip("::ffff:192.0.2.0"), 120)},
		{netip.PrefixFrom(ip("192.0.2.0"), 33)},
	} {
		if err := tp.r[0].SyncDestinations(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("SyncDestinations(%v): %v, want ErrInvalid", bad, err)
		}
	}
	if err := tp.r[1].SyncDestinations([]netip.Prefix{pfx("192.0.2.0/24"), {}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("SyncDestinations with a zero prefix: %v, want ErrInvalid", err)
	}
	sendFrom(t, tp.client, client4, ext4)
	nothingArrives(t, got, "to "+ext4.String()+" after a refused list")
	mustVia(t, tp, "udp", far4)

	// Kept in step: overlapping and adjacent prefixes merge.
	wide := []netip.Prefix{pfx("192.0.2.0/25"), pfx("192.0.2.128/25"), pfx("192.0.2.0/24"),
		pfx("198.51.100.0/24"), pfx("2001:db8:ff::/64"), pfx("2001:db8:fe::/64")}
	for i, r := range tp.r {
		if err := r.SyncDestinations(wide); err != nil {
			t.Fatalf("router %d: %v", i+1, err)
		}
	}
	sendFrom(t, tp.client, client4, ext4)
	arrives(t, got, "to "+ext4.String()+" once a destination")
	sendFrom(t, tp.client, client6, ext6)
	arrives(t, got, "to "+ext6.String()+" once a destination")
	mustVia(t, tp, "tcp", far4)
	mustVia(t, tp, "udp", far6)
}

// ipv4UDP is an IPv4 UDP packet from src:sport to dst:dport carrying
// payload (UDP checksum 0: none).
func ipv4UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0], p[8], p[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	binary.BigEndian.PutUint16(p[6:], 0x4000)
	s4, d4 := src.As4(), dst.As4()
	copy(p[12:], s4[:])
	copy(p[16:], d4[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(p[20:], sport)
	binary.BigEndian.PutUint16(p[22:], dport)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// TestGuestRouterCraftedPrivate: a client that writes its own FoU
// datagrams (no capability needed: a UDP socket to the Service) to a
// router whose Egress has a default route gets nothing to a private
// destination through it, which a client's own rules keep on main: a
// router is no way around the cluster's network policies. A public
// destination crafted the same way goes through, so the probe works.
func TestGuestRouterCraftedPrivate(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false) // destinations 0.0.0.0/0 and ::/0
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	mustDirect(t, tp, "udp", privDst4)
	got := recorder(t, tp.ext, privDst4, ext4)
	craft := func(dst netip.Addr) {
		t.Helper()
		if err := tp.client.Do(func() error {
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(svc4, DefaultPort)))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write(ipv4UDP(client4, dst, 40000, probePort, []byte("x")))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	_, dst0 := drops(t, tp)
	craft(privDst4)
	nothingArrives(t, got, "to the private "+privDst4.String()+" in a crafted FoU datagram")
	if _, dst1 := drops(t, tp); dst1-dst0 != 1 {
		t.Errorf("the routers counted %d packets dropped for their destination, want 1", dst1-dst0)
	}
	craft(ext4)
	arrives(t, got, "to "+ext4.String()+" in a crafted FoU datagram")
}

// fnvCollision returns two addresses made by gen(i), i = 0, 1, ..., whose
// strings hash alike with 32-bit FNV-1a (the old tunnel names' hash).
func fnvCollision(t *testing.T, gen func(i uint32) netip.Addr) (netip.Addr, netip.Addr) {
	t.Helper()
	seen := map[uint32]netip.Addr{}
	for i := uint32(0); i < 1<<22; i++ {
		a := gen(i)
		h := fnv.New32a()
		h.Write([]byte(a.String()))
		if b, ok := seen[h.Sum32()]; ok {
			return b, a
		}
		seen[h.Sum32()] = a
	}
	t.Fatal("no FNV-32a collision found")
	return netip.Addr{}, netip.Addr{}
}

// TestGuestRouterPeerNameCollision: two clients whose addresses hash to
// one 32-bit value (IPv4 and IPv6) both get working tunnels.
func TestGuestRouterPeerNameCollision(t *testing.T) {
	requireTunnels(t)
	a4, b4 := fnvCollision(t, func(i uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{10, 1 + byte(i>>16), byte(i >> 8), byte(i)})
	})
	a6, b6 := fnvCollision(t, func(i uint32) netip.Addr {
		return netip.AddrFrom16([16]byte{0xfd, 0, 1, 0x01, 12: byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)})
	})
	t.Logf("colliding: %s %s, %s %s", a4, b4, a6, b6)
	tp := newTopo(t, false)
	c1, c2 := harness.NewNS(t, "egcol1"), harness.NewNS(t, "egcol2")
	plugPod(t, tp.node, c1, "vcol1", a4, a6)
	plugPod(t, tp.node, c2, "vcol2", b4, b6)
	for i, r := range tp.r {
		if err := r.SyncPeers([]netip.Addr{client4, client6, a4, b4, a6, b6}); err != nil {
			t.Fatalf("router %d: %v", i+1, err)
		}
		if s, err := r.Stats(); err != nil || s.Tunnels != 6 || s.Peers != 6 {
			t.Errorf("router %d: %+v %v, want 6 tunnels and 6 peers", i+1, s, err)
		}
	}
	for _, c := range []*harness.NS{c1, c2, tp.client} {
		if err := ApplyClient(c.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
			t.Fatal(err)
		}
		for _, dst := range []netip.Addr{ext4, ext6} {
			got, err := seenFrom(c, "udp", dst)
			if err != nil {
				t.Errorf("%s: %v", c.Name(), err)
			} else if routerOf(got) < 0 {
				t.Errorf("%s to %s: the server saw %s, want a router's address", c.Name(), dst, got)
			}
		}
	}
	// Dropping one of a colliding pair keeps the other's tunnel.
	for i, r := range tp.r {
		if err := r.SyncPeers([]netip.Addr{client4, client6, b4, b6}); err != nil {
			t.Fatalf("router %d: %v", i+1, err)
		}
	}
	for _, dst := range []netip.Addr{ext4, ext6} {
		if got, err := seenFrom(c2, "udp", dst); err != nil || routerOf(got) < 0 {
			t.Errorf("%s to %s after its twin left: %q %v", c2.Name(), dst, got, err)
		}
	}
}

// conntrackFrom counts the conntrack entries in ns whose original source
// is a.
func conntrackFrom(t *testing.T, ns *harness.NS, a netip.Addr) int {
	t.Helper()
	h, err := openHandle(ns.Path(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	fam := netlink.InetFamily(unix.AF_INET)
	if a.Is6() {
		fam = unix.AF_INET6
	}
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil {
		t.Fatalf("list conntrack in %s: %v", ns.Name(), err)
	}
	n := 0
	for _, f := range flows {
		if addrOf(f.Forward.SrcIP) == a {
			n++
		}
	}
	return n
}

// TestGuestRouterRemovedPeerConntrack: a peer taken out of SyncPeers
// leaves no conntrack entry behind (a pod made later with its address
// would otherwise get the old sessions' replies); the others' stay.
func TestGuestRouterRemovedPeerConntrack(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	i4 := mustVia(t, tp, "udp", ext4)
	mustVia(t, tp, "tcp", ext4)
	i6 := mustVia(t, tp, "udp", ext6)
	if n := conntrackFrom(t, tp.routers[i4], client4); n < 2 {
		t.Fatalf("router %d: %d conntrack entries from %s, want at least 2 before the test means anything", i4+1, n, client4)
	}
	before6 := conntrackFrom(t, tp.routers[i6], client6)
	if before6 < 1 {
		t.Fatalf("router %d: no conntrack entry from %s", i6+1, client6)
	}
	for i, r := range tp.r {
		if err := r.SyncPeers([]netip.Addr{client6}); err != nil {
			t.Fatalf("router %d: %v", i+1, err)
		}
	}
	for i, rns := range tp.routers {
		if n := conntrackFrom(t, rns, client4); n != 0 {
			t.Errorf("router %d: %d conntrack entries from the removed peer %s, want 0", i+1, n, client4)
		}
	}
	if n := conntrackFrom(t, tp.routers[i6], client6); n < before6 {
		t.Errorf("router %d: %d conntrack entries from the remaining peer %s, was %d", i6+1, n, client6, before6)
	}
}

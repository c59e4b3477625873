package egress

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/harness"
)

// The guest tests' network, all namespaces:
//
//	client 10.100.0.10 ─┐                 ┌─ external 192.0.2.10 (eth0),
//	router1 10.100.0.20 ─┼── node (routes, ─┤   198.51.100.10, 10.200.0.10 (lo)
//	router2 10.100.0.21 ─┘  kube-proxy DNAT)└─ 2001:db8:ff::10, 2001:db8:fe::10
//
// Pods are attached the routed way: a /32 (/128) on the pod's eth0, the
// node's end answering for the gateway 10.100.0.1 (fe80::1), one host
// route per pod in the node. The node DNATs the Service's ClusterIPs
// 10.96.0.50 and fd00:96::50 (UDP 5555) to the router pods with nftables,
// as kube-proxy's nftables mode does: a numgen choice between one chain
// per endpoint.
var (
	gw4, gw6         = ip("10.100.0.1"), ip("fe80::1")
	client4, client6 = ip("10.100.0.10"), ip("fd00:100::10")
	router4          = []netip.Addr{ip("10.100.0.20"), ip("10.100.0.21")}
	router6          = []netip.Addr{ip("fd00:100::20"), ip("fd00:100::21")}
	svc4, svc6       = ip("10.96.0.50"), ip("fd00:96::50")
	ext4, ext6       = ip("192.0.2.10"), ip("2001:db8:ff::10")    // default-route destinations
	far4, far6       = ip("198.51.100.10"), ip("2001:db8:fe::10") // specific destinations
	privDst4         = ip("10.200.0.10")                          // a private destination
)

// everywhere are the destinations of the routers newTopo makes.
var everywhere = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

const (
	tcpPort = 7000
	udpPort = 7001
)

type topo struct {
	node, client, ext *harness.NS
	routers           []*harness.NS
	r                 []*Router
	endpoints         []int        // router indexes the Service's DNAT picks from
	svc4, svc6        netip.Addr   // the ClusterIPs DNAT'd; svc4, svc6 when zero
	gone              map[int]bool // routers removed (closed)
}

func addrAdd(t testing.TB, h *netlink.Handle, dev string, p netip.Prefix) {
	t.Helper()
	l, err := h.LinkByName(dev)
	if err == nil {
		err = h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD})
	}
	if err != nil {
		t.Fatalf("add %s to %s: %v", p, dev, err)
	}
}

func routeAdd(t testing.TB, h *netlink.Handle, dev string, dst netip.Prefix, via netip.Addr) {
	t.Helper()
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(dst), Gw: ipOf(via)}
	if !via.IsValid() {
		r.Scope = netlink.SCOPE_LINK
	}
	if via.IsValid() && via.Is4() && dst.Addr().Is4() {
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	if err := h.RouteAdd(r); err != nil {
		t.Fatalf("route %s via %s dev %s: %v", dst, via, dev, err)
	}
}

func sysctls(t testing.TB, ns *harness.NS, kv ...[2]string) {
	t.Helper()
	if _, err := swapSysctls(ns.Path(), kv); err != nil {
		t.Fatal(err)
	}
}

// plugPod attaches pod to the node the routed way.
func plugPod(t testing.TB, node, pod *harness.NS, nodeDev string, a4, a6 netip.Addr) {
	t.Helper()
	pod.AddVeth(t, harness.Veth{Name: "eth0", PeerName: nodeDev, Peer: node})
	ph, nh := pod.Handle(t), node.Handle(t)
	addrAdd(t, ph, "eth0", netip.PrefixFrom(a4, 32))
	routeAdd(t, ph, "eth0", netip.PrefixFrom(gw4, 32), netip.Addr{})
	routeAdd(t, ph, "eth0", pfx("0.0.0.0/0"), gw4)
	addrAdd(t, nh, nodeDev, netip.PrefixFrom(gw4, 32))
	routeAdd(t, nh, nodeDev, netip.PrefixFrom(a4, 32), netip.Addr{})
	if a6.IsValid() {
		addrAdd(t, ph, "eth0", netip.PrefixFrom(a6, 128))
		routeAdd(t, ph, "eth0", pfx("::/0"), gw6)
		addrAdd(t, nh, nodeDev, netip.PrefixFrom(gw6, 64))
		routeAdd(t, nh, nodeDev, netip.PrefixFrom(a6, 128), netip.Addr{})
	}
}

// newTopo builds the network; routers run NewRouter (with sourcePortAuto)
// and know the client as their only peer.
func newTopo(t testing.TB, sourcePortAuto bool) *topo {
	t.Helper()
	tp := &topo{node: harness.NewNS(t, "egnode"), client: harness.NewNS(t, "egclient"), ext: harness.NewNS(t, "egext")}
	sysctls(t, tp.node, [2]string{"net/ipv4/ip_forward", "1"}, [2]string{"net/ipv6/conf/all/forwarding", "1"})
	plugPod(t, tp.node, tp.client, "vclient", client4, client6)
	for i := range router4 {
		r := harness.NewNS(t, fmt.Sprintf("egrouter%d", i+1))
		plugPod(t, tp.node, r, fmt.Sprintf("vrouter%d", i+1), router4[i], router6[i])
		tp.routers = append(tp.routers, r)
	}
	// The external network.
	tp.ext.AddVeth(t, harness.Veth{Name: "eth0", PeerName: "vext", Peer: tp.node})
	eh, nh := tp.ext.Handle(t), tp.node.Handle(t)
	addrAdd(t, eh, "eth0", pfx("192.0.2.10/24"))
	addrAdd(t, eh, "eth0", pfx("2001:db8:ff::10/64"))
	for _, a := range []netip.Addr{far4, privDst4, far6} {
		addrAdd(t, eh, "lo", netip.PrefixFrom(a, a.BitLen()))
	}
	routeAdd(t, eh, "eth0", pfx("0.0.0.0/0"), ip("192.0.2.1"))
	routeAdd(t, eh, "eth0", pfx("::/0"), ip("2001:db8:ff::1"))
	addrAdd(t, nh, "vext", pfx("192.0.2.1/24"))
	addrAdd(t, nh, "vext", pfx("2001:db8:ff::1/64"))
	routeAdd(t, nh, "vext", pfx("198.51.100.0/24"), ext4)
	routeAdd(t, nh, "vext", pfx("10.200.0.0/24"), ext4)
	routeAdd(t, nh, "vext", pfx("2001:db8:fe::/64"), ext6)
	tp.serve(t)
	tp.setEndpoints(t, 0, 1)
	for i, r := range tp.routers {
		rt, err := NewRouter(RouterConfig{NetNS: r.Path(), Local4: router4[i], Local6: router6[i], SourcePortAuto: sourcePortAuto})
		if err != nil {
			t.Fatalf("NewRouter %d: %v", i+1, err)
		}
		t.Cleanup(func() { _ = rt.Close() })
		if err := rt.SyncPeers([]netip.Addr{client4, client6}); err != nil {
			t.Fatalf("SyncPeers %d: %v", i+1, err)
		}
		if err := rt.SyncDestinations(everywhere); err != nil {
			t.Fatalf("SyncDestinations %d: %v", i+1, err)
		}
		tp.r = append(tp.r, rt)
	}
	t.Cleanup(func() { // before the routers close
		if t.Failed() {
			tp.dump(t)
		}
	})
	return tp
}

// serve starts, in the external namespace, a TCP and a UDP server that
// answer each request with the source address they see. UDP listens on
// each address on its own, so that replies leave from the address asked.
func (tp *topo) serve(t testing.TB) {
	t.Helper()
	var ln net.Listener
	var pcs []net.PacketConn
	err := tp.ext.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp", fmt.Sprintf(":%d", tcpPort)); err != nil {
			return err
		}
		for _, a := range []netip.Addr{ext4, ext6, far4, far6, privDst4} {
			pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, udpPort).String())
			if err != nil {
				return err
			}
			pcs = append(pcs, pc)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("servers in the external namespace: %v", err)
	}
	t.Cleanup(func() {
		ln.Close()
		for _, pc := range pcs {
			pc.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1)
				if _, err := c.Read(b); err == nil {
					_, _ = io.WriteString(c, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().String())
				}
			}()
		}
	}()
	for _, pc := range pcs {
		go func() {
			b := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(b)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(from.(*net.UDPAddr).AddrPort().Addr().Unmap().String()), from)
			}
		}()
	}
}

// seenFrom asks the external server at dst, from inside the client, which
// source address it sees; a reply is proof that the way back works too.
func seenFrom(client *harness.NS, proto string, dst netip.Addr) (string, error) {
	var got string
	err := client.Do(func() error {
		port := tcpPort
		if proto == "udp" {
			port = udpPort
		}
		c, err := net.DialTimeout(proto, netip.AddrPortFrom(dst, uint16(port)).String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte{'?'}); err != nil {
			return err
		}
		b := make([]byte, 64)
		n, err := c.Read(b)
		if err != nil {
			return err
		}
		got = strings.TrimSpace(string(b[:n]))
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("%s to %s: %w", proto, dst, err)
	}
	return got, nil
}

// setEndpoints programs the node's kube-proxy emulation: the Service's
// ClusterIPs DNAT to the given routers (table inet kube-emu, replaced as
// a whole, so the change is atomic as kube-proxy's are).
func (tp *topo) setEndpoints(t testing.TB, idx ...int) {
	t.Helper()
	c, err := nftConn(tp.node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: "kube-emu"}
	c.AddTable(tbl)
	c.DelTable(tbl)
	tbl = c.AddTable(tbl)
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	for _, v6 := range []bool{false, true} {
		fam, svc, off, nfproto := "4", svc4, uint32(16), byte(unix.NFPROTO_IPV4)
		if v6 {
			fam, svc, off, nfproto = "6", svc6, 24, unix.NFPROTO_IPV6
		}
		if s := [2]netip.Addr{tp.svc4, tp.svc6}[boolFam(v6)]; s.IsValid() {
			svc = s
		}
		svcChain := c.AddChain(&nftables.Chain{Name: "svc" + fam, Table: tbl})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfproto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(svc.BitLen() / 8)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: svc.AsSlice()},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, DefaultPort)},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: svcChain.Name},
		}})
		for n, i := range idx {
			ep := router4[i]
			if v6 {
				ep = router6[i]
			}
			epChain := c.AddChain(&nftables.Chain{Name: fmt.Sprintf("ep%s-%d", fam, i), Table: tbl})
			natFam := uint32(unix.NFPROTO_IPV4)
			if v6 {
				natFam = unix.NFPROTO_IPV6
			}
			c.AddRule(&nftables.Rule{Table: tbl, Chain: epChain, Exprs: []expr.Any{
				&expr.Immediate{Register: 1, Data: ep.AsSlice()},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: natFam, RegAddrMin: 1},
			}})
			// The first len-1 endpoints each take 1/(remaining) of the
			// new connections; the last takes the rest.
			var pick []expr.Any
			if left := len(idx) - n; left > 1 {
				pick = []expr.Any{
					&expr.Numgen{Register: 1, Modulus: uint32(left), Type: unix.NFT_NG_RANDOM},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
				}
			}
			c.AddRule(&nftables.Rule{Table: tbl, Chain: svcChain,
				Exprs: append(pick, &expr.Verdict{Kind: expr.VerdictGoto, Chain: epChain.Name})})
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("kube-proxy emulation: %v", err)
	}
	tp.endpoints = idx
}

// removeRouter takes router i out of service the way a deleted pod goes:
// out of the Service's endpoints, its router closed, and (as kube-proxy
// does for UDP) the node's conntrack entries NAT'd to it flushed.
func (tp *topo) removeRouter(t testing.TB, i int) {
	t.Helper()
	var keep []int
	for _, e := range tp.endpoints {
		if e != i {
			keep = append(keep, e)
		}
	}
	tp.setEndpoints(t, keep...)
	if tp.gone == nil {
		tp.gone = map[int]bool{}
	}
	tp.gone[i] = true
	if err := tp.r[i].Close(); err != nil {
		t.Errorf("close router %d: %v", i+1, err)
	}
	h, err := openHandle(tp.node.Path(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, a := range []netip.Addr{router4[i], router6[i]} {
		f := &netlink.ConntrackFilter{}
		if err := f.AddIP(netlink.ConntrackReplyAnyIP, ipOf(a)); err != nil {
			t.Fatal(err)
		}
		fam := netlink.InetFamily(unix.AF_INET)
		if a.Is6() {
			fam = unix.AF_INET6
		}
		if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil {
			t.Fatalf("flush conntrack of %s: %v", a, err)
		}
	}
}

// routerOf returns the index of the router whose address is s, or -1.
func routerOf(s string) int {
	for i := range router4 {
		if s == router4[i].String() || s == router6[i].String() {
			return i
		}
	}
	return -1
}

// dump logs what each namespace holds, for a failed test (ip(8) from the
// guest's busybox, or iproute2 on a host).
func (tp *topo) dump(t testing.TB) {
	all := append([]*harness.NS{tp.client, tp.node, tp.ext}, tp.routers...)
	for _, ns := range all {
		for _, args := range [][]string{{"addr"}, {"route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}, {"rule"}} {
			out, _ := ns.Exec(t, "ip", args...)
			t.Logf("%s: ip %s\n%s", ns.Name(), strings.Join(args, " "), out)
		}
		if h, err := openHandle(ns.Path(), false); err == nil {
			fs, err := h.FouList(0)
			t.Logf("%s: fou %+v %v", ns.Name(), fs, err)
			h.Close()
		}
		out, _ := ns.Exec(t, "cat", "/proc/net/snmp")
		t.Logf("%s: snmp\n%s", ns.Name(), out)
	}
	for i, r := range tp.r {
		s, err := r.Stats()
		t.Logf("router %d: %+v %v", i+1, s, err)
	}
}

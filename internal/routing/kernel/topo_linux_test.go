package kernel_test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
	"github.com/skeinnet/skein/test/harness"
)

// node is a node namespace of a test topology: an underlay link "ul0" with
// its addresses, and one pod namespace behind a veth whose node end holds
// the first address of the node's block (so the node routes its own block
// without skein's dataplane).
type node struct {
	name   string
	ns     *harness.NS
	pod    *harness.NS
	addrs  []netip.Addr   // underlay addresses, IPv4 first
	blocks []netip.Prefix // IPv4 and IPv6 block
	podIPs []netip.Addr   // the pod's address in each block
}

// remotes are the blocks of every node in nodes but n, as the API would
// describe them.
func remotes(n *node, nodes ...*node) []routing.Remote {
	var out []routing.Remote
	for _, o := range nodes {
		if o == n {
			continue
		}
		for _, b := range o.blocks {
			out = append(out, routing.Remote{Block: b, Name: o.name + "-" + b.String(), Node: o.name, NodeAddrs: o.addrs})
		}
	}
	return out
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

// addAddr adds p to dev in ns without duplicate address detection.
func addAddr(t testing.TB, ns *harness.NS, dev string, p netip.Prefix) {
	t.Helper()
	h := ns.Handle(t)
	l, err := h.LinkByName(dev)
	if err == nil {
		err = h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
			Flags: unix.IFA_F_NODAD})
	}
	if err != nil {
		t.Fatalf("add %s to %s in %s: %v", p, dev, ns.Name(), err)
	}
}

func addRoute(t testing.TB, ns *harness.NS, r *netlink.Route) {
	t.Helper()
	if err := ns.Handle(t).RouteAdd(r); err != nil {
		t.Fatalf("add route %s in %s: %v", r, ns.Name(), err)
	}
}

func defaultVia(t testing.TB, ns *harness.NS, gw netip.Addr) {
	t.Helper()
	dst := pfx("0.0.0.0/0")
	if gw.Is6() {
		dst = pfx("::/0")
	}
	addRoute(t, ns, &netlink.Route{Dst: ipNetOf(dst), Gw: gw.AsSlice()})
}

func ipNetOf(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func forwarding(t testing.TB, ns *harness.NS) {
	t.Helper()
	if err := netns.WriteSysctls(ns.Path(),
		[2]string{"net.ipv4.ip_forward", "1"},
		[2]string{"net.ipv6.conf.all.forwarding", "1"}); err != nil {
		t.Fatal(err)
	}
}

// newNode makes node number i (1..) with underlay addresses addrs on "ul0"
// (which the caller attaches) and a pod in blocks 10.10.i.0/24 and
// fd10:i::/64.
func newNode(t testing.TB, i int) *node {
	t.Helper()
	n := &node{name: fmt.Sprintf("node%d", i), ns: harness.NewNS(t, fmt.Sprintf("rtn%d", i)), pod: harness.NewNS(t, fmt.Sprintf("rtp%d", i))}
	forwarding(t, n.ns)
	n.blocks = []netip.Prefix{pfx(fmt.Sprintf("10.10.%d.0/24", i)), pfx(fmt.Sprintf("fd10:%d::/64", i))}
	n.podIPs = []netip.Addr{ip(fmt.Sprintf("10.10.%d.10", i)), ip(fmt.Sprintf("fd10:%d::10", i))}
	n.ns.AddVeth(t, harness.Veth{Name: "pod0", PeerName: "eth0", Peer: n.pod})
	for j, b := range n.blocks {
		gw := b.Addr().Next()
		addAddr(t, n.ns, "pod0", netip.PrefixFrom(gw, b.Bits()))
		addAddr(t, n.pod, "eth0", netip.PrefixFrom(n.podIPs[j], b.Bits()))
		defaultVia(t, n.pod, gw)
	}
	return n
}

// underlay is a switch namespace with a bridge; attach plugs a node's ul0
// into it and gives it addrs.
type underlay struct {
	sw     *harness.NS
	bridge int
	n      int
}

func newUnderlay(t testing.TB) *underlay {
	t.Helper()
	sw := harness.NewNS(t, "rtsw")
	h := sw.Handle(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := h.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	return &underlay{sw: sw, bridge: br.Index}
}

func (u *underlay) attach(t testing.TB, n *node, mtu int, addrs ...netip.Prefix) {
	t.Helper()
	u.n++
	port := fmt.Sprintf("p%d", u.n)
	u.sw.AddVeth(t, harness.Veth{Name: port, PeerName: "ul0", Peer: n.ns, Master: u.bridge, MTU: mtu})
	for _, a := range addrs {
		addAddr(t, n.ns, "ul0", a)
		n.addrs = append(n.addrs, a.Addr())
	}
}

// lan makes count nodes on one bridge, each with 192.168.50.i/24 and
// fd50::i/64.
func lan(t testing.TB, count int) []*node {
	t.Helper()
	u := newUnderlay(t)
	var nodes []*node
	for i := 1; i <= count; i++ {
		n := newNode(t, i)
		u.attach(t, n, 0, pfx(fmt.Sprintf("192.168.50.%d/24", i)), pfx(fmt.Sprintf("fd50::%d/64", i)))
		nodes = append(nodes, n)
	}
	settle(t, nodes...)
	return nodes
}

// settle waits until IPv6 on the nodes' and pods' new links has settled
// (harness.Snapshot waits for link-local DAD): pings across nodes went
// unanswered in the links' first second, before that.
func settle(t testing.TB, nodes ...*node) {
	t.Helper()
	for _, n := range nodes {
		harness.Snapshot(t, n.ns)
		harness.Snapshot(t, n.pod)
	}
}

func newKernel(t testing.TB, n *node, cfg kernel.KernelConfig) *kernel.Kernel {
	t.Helper()
	cfg.NodeNetNS = n.ns.Path()
	k, err := kernel.NewKernel(cfg)
	if err != nil {
		t.Fatalf("new kernel for %s: %v", n.name, err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func mustSync(t testing.TB, k *kernel.Kernel, rs []routing.Remote) []routing.Status {
	t.Helper()
	st, err := k.Sync(t.Context(), rs)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if len(st) != len(rs) {
		t.Fatalf("sync returned %d statuses for %d remotes", len(st), len(rs))
	}
	return st
}

func requireInstalled(t testing.TB, st []routing.Status) {
	t.Helper()
	for _, s := range st {
		if !s.Installed || s.Reason != "" || !s.Via.IsValid() {
			t.Errorf("%s (node %s): installed=%t via=%v reason=%q", s.Block, s.Node, s.Installed, s.Via, s.Reason)
		}
	}
}

// pingAll pings every other node's pod, in every family, from every pod.
func pingAll(t *testing.T, nodes ...*node) {
	t.Helper()
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			for _, dst := range b.podIPs {
				if err := harness.Ping(t, a.pod, dst); err != nil {
					if err := harness.Ping(t, a.pod, dst); err != nil {
						t.Errorf("pod of %s -> pod of %s: %v", a.name, b.name, err)
					}
				}
			}
		}
	}
}

func noPing(t *testing.T, from *node, to netip.Addr) {
	t.Helper()
	if err := harness.Ping(t, from.pod, to); err == nil {
		t.Errorf("pod of %s reaches %s; want no route", from.name, to)
	}
}

// tableRoutes describes the routes of table (all protocols), sorted.
func tableRoutes(t testing.TB, ns *harness.NS, table int) []string {
	t.Helper()
	h := ns.Handle(t)
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range routes {
		dev := ""
		if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		via := ""
		if r.Gw != nil {
			via = " via " + r.Gw.String()
		}
		if v, ok := r.Via.(*netlink.Via); ok {
			via = " via inet6 " + v.Addr.String()
		}
		out = append(out, fmt.Sprintf("%s%s dev %s proto %d", r.Dst, via, dev, r.Protocol))
	}
	sort.Strings(out)
	return out
}

// neighState describes the permanent neighbour and FDB entries of dev.
func neighState(t testing.TB, ns *harness.NS, dev string) []string {
	t.Helper()
	h := ns.Handle(t)
	l, err := h.LinkByName(dev)
	if err != nil {
		return nil
	}
	var out []string
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6, unix.AF_BRIDGE} {
		ns, err := h.NeighList(l.Attrs().Index, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.State&netlink.NUD_PERMANENT == 0 {
				continue
			}
			out = append(out, fmt.Sprintf("fam %d %s %s", fam, n.IP, n.HardwareAddr))
		}
	}
	sort.Strings(out)
	return out
}

// watch records every netlink change notification in ns that concerns
// routing's objects (routes in table or with protocol proto, policy rules,
// links named dev, neighbour and FDB entries on dev) until the returned
// function is called, which returns them.
func watch(t testing.TB, ns *harness.NS, table, proto int, dev string) func() []string {
	t.Helper()
	var s *nl.NetlinkSocket
	err := ns.Do(func() error {
		var err error
		s, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH,
			unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE, unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE)
		return err
	})
	if err != nil {
		t.Fatalf("subscribe in %s: %v", ns.Name(), err)
	}
	devIndex := 0
	if l, err := ns.Handle(t).LinkByName(dev); err == nil {
		devIndex = l.Attrs().Index
	}
	return func() []string {
		defer s.Close()
		if err := s.SetReceiveTimeout(&unix.Timeval{Usec: 200000}); err != nil {
			t.Fatal(err)
		}
		var changes []string
		for {
			msgs, _, err := s.Receive()
			if err != nil {
				break // the timeout: nothing more
			}
			for _, m := range msgs {
				switch m.Header.Type {
				case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
					rt := nl.DeserializeRtMsg(m.Data)
					if int(rt.Table) == table || int(rt.Protocol) == proto {
						changes = append(changes, fmt.Sprintf("route %d table %d proto %d", m.Header.Type, rt.Table, rt.Protocol))
					}
				case unix.RTM_NEWRULE, unix.RTM_DELRULE:
					changes = append(changes, fmt.Sprintf("rule %d", m.Header.Type))
				case unix.RTM_NEWLINK, unix.RTM_DELLINK:
					h := unix.NlMsghdr{Len: m.Header.Len, Type: m.Header.Type, Flags: m.Header.Flags, Seq: m.Header.Seq, Pid: m.Header.Pid}
					if l, err := netlink.LinkDeserialize(&h, m.Data); err == nil && l.Attrs().Name == dev {
						changes = append(changes, fmt.Sprintf("link %d %s", m.Header.Type, dev))
					}
				case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
					if n, err := netlink.NeighDeserialize(m.Data); err == nil && devIndex != 0 && n.LinkIndex == devIndex {
						changes = append(changes, fmt.Sprintf("neigh %d %s %s", m.Header.Type, n.IP, n.HardwareAddr))
					}
				}
			}
		}
		return changes
	}
}

// requireNoChange runs fn and fails if it changed any of routing's objects.
func requireNoChange(t testing.TB, n *node, cfg kernel.KernelConfig, fn func()) {
	t.Helper()
	table, proto, dev := cfg.Table, cfg.Protocol, cfg.VXLAN.Device
	if table == 0 {
		table = routing.DefaultTable
	}
	if proto == 0 {
		proto = routing.DefaultProtocol
	}
	if dev == "" {
		dev = routing.DefaultVXLANDevice
	}
	stop := watch(t, n.ns, table, proto, dev)
	time.Sleep(20 * time.Millisecond)
	fn()
	if ch := stop(); len(ch) > 0 {
		t.Errorf("%s: want no netlink changes, got %d:\n  %s", n.name, len(ch), strings.Join(ch, "\n  "))
	}
}

func contains(ss []string, sub string) bool {
	return slices.ContainsFunc(ss, func(s string) bool { return strings.Contains(s, sub) })
}

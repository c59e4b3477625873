package guest_test

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	cnins "github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/guest"
	"github.com/skeinnet/skein/test/harness"
)

// TestGuestKernel runs TestGuestKernelInside in the qemu guest: the
// kernel features this host lacks (fou, ipip, ip6tnl) and nftables NAT,
// exercised through the libraries skein uses, in namespaces made by
// test/harness. It is also the pattern for other packages' guest tests.
func TestGuestKernel(t *testing.T) {
	modules := append(append(append([]string{}, guest.TunnelModules...), guest.NftablesModules...), guest.VethModules...)
	res := guest.Run(t, guest.Config{
		Package: "./test/guest",
		Run:     "^TestGuestKernelInside$",
		Modules: modules,
	})
	if res.Passed && !strings.Contains(res.Output, "--- PASS: TestGuestKernelInside") {
		t.Errorf("the guest run passed but TestGuestKernelInside did not report PASS:\n%s", res.Output)
	}
}

// tunnelEncapFOU is TUNNEL_ENCAP_FOU of linux/if_tunnel.h (the netlink
// package has no name for it).
const tunnelEncapFOU = 1

// fouPort is the seed's FoU port.
const fouPort = 5555

// TestGuestKernelInside: two namespaces joined by a veth pair, FoU on port
// 5555 for IPIP (v4) and IPv6-in-IPv6 (v6) in both, an ipip and an ip6tnl
// tunnel with FoU encapsulation between them, a ping through each; an
// nftables table with a masquerade rule; and the CNI plugins' ns package
// entering a harness namespace.
func TestGuestKernelInside(t *testing.T) {
	guest.RequireGuest(t)
	a, b := harness.NewNS(t, "guest-a"), harness.NewNS(t, "guest-b")
	a.AddVeth(t, harness.Veth{Name: "eth0", PeerName: "eth0", Peer: b})
	under := map[*harness.NS][2]netip.Addr{
		a: {netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")},
		b: {netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")},
	}
	over := map[*harness.NS][2]netip.Addr{
		a: {netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1")},
		b: {netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("2001:db8:1::2")},
	}
	for ns, peer := range map[*harness.NS]*harness.NS{a: b, b: a} {
		h := genlHandle(t, ns)
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		addAddr(t, h, eth0, netip.PrefixFrom(under[ns][0], 24))
		addAddr(t, h, eth0, netip.PrefixFrom(under[ns][1], 64))
		for _, f := range []netlink.Fou{
			{Family: unix.AF_INET, Port: fouPort, Protocol: unix.IPPROTO_IPIP, EncapType: netlink.FOU_ENCAP_DIRECT},
			{Family: unix.AF_INET6, Port: fouPort, Protocol: unix.IPPROTO_IPV6, EncapType: netlink.FOU_ENCAP_DIRECT},
		} {
			if err := h.FouAdd(f); err != nil {
				t.Fatalf("fou add port %d ipproto %d (family %d) in %s: %v", f.Port, f.Protocol, f.Family, ns.Name(), err)
			}
		}
		tun4 := &netlink.Iptun{
			LinkAttrs: netlink.LinkAttrs{Name: "fou4"},
			Local:     under[ns][0].AsSlice(), Remote: under[peer][0].AsSlice(), Ttl: 64,
			EncapType: tunnelEncapFOU, EncapSport: fouPort, EncapDport: fouPort,
		}
		tun6 := &netlink.Ip6tnl{
			LinkAttrs: netlink.LinkAttrs{Name: "fou6"},
			Local:     under[ns][1].AsSlice(), Remote: under[peer][1].AsSlice(), Ttl: 64,
			Proto: unix.IPPROTO_IPV6, EncapLimit: 4,
			EncapType: tunnelEncapFOU, EncapSport: fouPort, EncapDport: fouPort,
		}
		for _, l := range []netlink.Link{tun4, tun6} {
			if err := h.LinkAdd(l); err != nil {
				t.Fatalf("add %s link %s in %s: %v", l.Type(), l.Attrs().Name, ns.Name(), err)
			}
			if err := h.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		for i, l := range []netlink.Link{tun4, tun6} {
			addAddr(t, h, l, netip.PrefixFrom(over[ns][i], over[ns][i].BitLen()))
			dst := over[peer][i]
			route := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(dst.BitLen(), dst.BitLen())}}
			if err := h.RouteAdd(route); err != nil {
				t.Fatalf("route %s dev %s in %s: %v", dst, l.Attrs().Name, ns.Name(), err)
			}
		}
		got, err := h.LinkByName("fou4")
		if err != nil {
			t.Fatal(err)
		}
		if ip, ok := got.(*netlink.Iptun); !ok || ip.EncapType != tunnelEncapFOU || ip.EncapDport != fouPort {
			t.Errorf("fou4 in %s reads back as %#v, want an ipip link with FoU encapsulation to port %d", ns.Name(), got, fouPort)
		}
	}
	for _, i := range []int{0, 1} {
		// The first echo waits for neighbour resolution on the veth,
		// which under emulation can take longer than Ping's second.
		var err error
		for try := 0; try < 5; try++ {
			if err = harness.Ping(t, a, over[b][i]); err == nil {
				break
			}
		}
		if err != nil {
			t.Errorf("through the FoU tunnel (5 tries): %v", err)
		}
	}

	t.Run("nftables masquerade", func(t *testing.T) { nftMasquerade(t, a) })

	t.Run("cni ns package", func(t *testing.T) {
		n, err := cnins.GetNS(a.Path())
		if err != nil {
			t.Fatalf("ns.GetNS(%s): %v", a.Path(), err)
		}
		defer n.Close()
		var names []string
		err = n.Do(func(cnins.NetNS) error {
			links, err := netlink.LinkList()
			for _, l := range links {
				names = append(names, l.Attrs().Name)
			}
			return err
		})
		if err != nil || !strings.Contains(strings.Join(names, " "), "fou4") {
			t.Errorf("ns.Do in %s saw links %v (err %v), want fou4 among them", a.Name(), names, err)
		}
	})
}

// genlHandle is a netlink handle in ns for route and generic netlink:
// FouAdd speaks generic netlink, and a handle without a socket of that
// protocol (harness.NS.Handle has NETLINK_ROUTE only) silently sends it
// from the calling thread's namespace instead.
func genlHandle(t *testing.T, ns *harness.NS) *netlink.Handle {
	t.Helper()
	var h *netlink.Handle
	err := ns.Do(func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
		return err
	})
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", ns.Name(), err)
	}
	t.Cleanup(h.Close)
	return h
}

func addAddr(t *testing.T, h *netlink.Handle, l netlink.Link, p netip.Prefix) {
	t.Helper()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, addr); err != nil {
		t.Fatalf("add %s to %s: %v", p, l.Attrs().Name, err)
	}
}

// nftMasquerade adds an inet table with a NAT postrouting chain holding a
// counter and masquerade rule in ns, and reads it back.
func nftMasquerade(t *testing.T, ns *harness.NS) {
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "skein-guest"})
	chain := c.AddChain(&nftables.Chain{
		Name: "postrouting", Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("eth0")},
		&expr.Counter{},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("add an nftables table with a masquerade rule: %v", err)
	}
	rules, err := c.GetRules(table, chain)
	if err != nil {
		t.Fatal(err)
	}
	masq := false
	for _, r := range rules {
		for _, e := range r.Exprs {
			if _, ok := e.(*expr.Masq); ok {
				masq = true
			}
		}
	}
	if !masq {
		t.Errorf("the postrouting chain of table skein-guest has no masquerade rule after Flush (rules: %d)", len(rules))
	}
}

// ifname is an interface name as nftables compares it: NUL-padded to
// IFNAMSIZ.
func ifname(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}

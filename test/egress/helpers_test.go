package egress

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
)

// The external network: a namespace behind a veth from the node, with a
// TCP and a UDP echo server telling each client its source address.
const (
	extTCPPort = 7000
	extUDPPort = 7001
	extNodeDev = "ext0"
)

var (
	extGW4 = netip.MustParseAddr("192.0.2.254")
	extGW6 = netip.MustParseAddr("2001:db8:ff::fe")
)

type external struct {
	ns           *harness.NS
	addr4, addr6 netip.Addr

	mu   sync.Mutex
	seen []netip.Addr // every source address the servers answered
}

// startExternal makes the external namespace, joins it to the node (the
// guest's root namespace) and starts its echo servers.
func startExternal(t *testing.T) *external {
	t.Helper()
	e := &external{ns: harness.NewNS(t, "ext"),
		addr4: netip.MustParseAddr("192.0.2.1"), addr6: netip.MustParseAddr("2001:db8:ff::1")}
	f, err := os.Open(e.ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: extNodeDev}, PeerName: "eth0", PeerNamespace: netlink.NsFd(f.Fd())}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("veth to the external namespace: %v", err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	node, err := netlink.LinkByName(extNodeDev)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []netip.Prefix{netip.PrefixFrom(extGW4, 24), netip.PrefixFrom(extGW6, 64)} {
		if err := netlink.AddrAdd(node, nlAddr(p)); err != nil {
			t.Fatalf("add %v to %s: %v", p, extNodeDev, err)
		}
	}
	if err := netlink.LinkSetUp(node); err != nil {
		t.Fatal(err)
	}
	h := e.ns.Handle(t)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []netip.Prefix{netip.PrefixFrom(e.addr4, 24), netip.PrefixFrom(e.addr6, 64)} {
		if err := h.AddrAdd(eth0, nlAddr(p)); err != nil {
			t.Fatalf("add %v to the external eth0: %v", p, err)
		}
	}
	if err := h.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	for _, gw := range []netip.Addr{extGW4, extGW6} {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			t.Fatalf("default route via %v in the external namespace: %v", gw, err)
		}
	}
	var tl net.Listener
	var ul net.PacketConn
	err = e.ns.Do(func() error {
		var err error
		if tl, err = net.Listen("tcp", fmt.Sprintf(":%d", extTCPPort)); err != nil {
			return err
		}
		ul, err = net.ListenPacket("udp", fmt.Sprintf(":%d", extUDPPort))
		return err
	})
	if err != nil {
		t.Fatalf("echo servers in the external namespace: %v", err)
	}
	t.Cleanup(func() { tl.Close(); ul.Close() })
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			src := e.saw(c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
			fmt.Fprintf(c, "%s\n", src)
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := ul.ReadFrom(buf)
			if err != nil {
				return
			}
			src := e.saw(from.(*net.UDPAddr).AddrPort().Addr())
			ul.WriteTo([]byte(src.String()+"\n"), from)
		}
	}()
	return e
}

// saw records a client's source address.
func (e *external) saw(a netip.Addr) netip.Addr {
	a = a.Unmap()
	e.mu.Lock()
	e.seen = append(e.seen, a)
	e.mu.Unlock()
	return a
}

// wantNeverSaw fails t if the servers ever answered one of addrs.
func (e *external) wantNeverSaw(t *testing.T, addrs ...netip.Addr) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range e.seen {
		if slices.Contains(addrs, a) {
			t.Errorf("the external servers saw the client's own address %v while it had the gateway (sources: %v)", a, e.seen)
			return
		}
	}
}

// echo asks the external TCP or UDP echo at dst, from inside ns, which
// source address it sees.
func echo(ns *harness.NS, proto string, dst netip.Addr) (netip.Addr, error) {
	port := extTCPPort
	if proto == "udp" {
		port = extUDPPort
	}
	addr := netip.AddrPortFrom(dst, uint16(port)).String()
	var line string
	err := ns.Do(func() error {
		c, err := net.DialTimeout(proto, addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if proto == "udp" {
			if _, err := c.Write([]byte("who am i\n")); err != nil {
				return err
			}
		}
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s to %s: %w", proto, addr, err)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(line))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s to %s: answer %q: %w", proto, addr, line, errNoSource)
	}
	return a, nil
}

// hostNAT masquerades what leaves by the guest's NIC (the router pods'
// connections to the API server at guest.HostAddr), in a table of the
// test's own.
func hostNAT(t *testing.T) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "skein-test-hostnat"})
	chain := c.AddChain(&nftables.Chain{Name: "postrouting", Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("eth0")},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("nftables masquerade out of eth0: %v", err)
	}
	t.Cleanup(func() { c.DelTable(table); c.Flush() })
}

// proxy emulates kube-proxy's nftables mode for the Egress's Service: UDP
// to ClusterIP:5555 from the pods is DNAT'd to a router pod picked by
// numgen through a map, per family. kube-proxy picks at random; here the
// pick is round-robin from the first endpoint (numgen inc, its counter
// starting with each rule), so that a client's first flow of either
// family takes the same router and the test knows the failover moves
// both.
type proxy struct {
	c     *nftables.Conn
	table *nftables.Table
	gws   []*gateway
}

func newProxy(t *testing.T, gws ...*gateway) *proxy {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{c: c, gws: gws}
	t.Cleanup(func() {
		if p.table != nil {
			c.DelTable(p.table)
			c.Flush()
		}
	})
	return p
}

// sync makes each gateway Service's endpoints its routers (the table is
// replaced in one transaction; conntrack keeps existing flows, as with
// kube-proxy).
func (p *proxy) sync(t *testing.T) {
	t.Helper()
	if p.table != nil {
		p.c.DelTable(p.table)
	}
	p.table = p.c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "skein-test-kubeproxy"})
	chain := p.c.AddChain(&nftables.Chain{Name: "services", Table: p.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	for _, gw := range p.gws {
		if len(gw.endpoints) == 0 {
			continue
		}
		for _, v6 := range []bool{false, true} {
			cip, dt, proto, daddrOff, fam := gw.cip4, nftables.TypeIPAddr, unix.NFPROTO_IPV4, uint32(16), 4
			if v6 {
				cip, dt, proto, daddrOff, fam = gw.cip6, nftables.TypeIP6Addr, unix.NFPROTO_IPV6, 24, 6
			}
			m := &nftables.Set{Table: p.table, Name: fmt.Sprintf("%s-endpoints-%d", gw.name, fam),
				IsMap: true, KeyType: nftables.TypeInteger, DataType: dt}
			var elems []nftables.SetElement
			for i, r := range gw.endpoints {
				elems = append(elems, nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(uint32(i)), Val: r.pod.Addr(v6).AsSlice()})
			}
			if err := p.c.AddSet(m, elems); err != nil {
				t.Fatal(err)
			}
			p.c.AddRule(&nftables.Rule{Table: p.table, Chain: chain, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(proto)}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: daddrOff, Len: uint32(cip.BitLen() / 8)},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: cip.AsSlice()},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(egress.DefaultPort)},
				&expr.Numgen{Register: 1, Modulus: uint32(len(gw.endpoints)), Type: unix.NFT_NG_INCREMENTAL},
				&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
				&expr.Counter{},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(proto), RegAddrMin: 1},
			}})
		}
	}
	if err := p.c.Flush(); err != nil {
		t.Fatalf("kube-proxy emulation: %v", err)
	}
}

// flushConntrack removes the node's connection-tracking entries of flows
// DNAT'd to r, as kube-proxy does for UDP endpoints that go away.
func flushConntrack(t *testing.T, r *router) {
	t.Helper()
	for _, a := range r.pod.Addrs {
		fam := netlink.InetFamily(unix.AF_INET)
		if a.Is6() {
			fam = unix.AF_INET6
		}
		f := &netlink.ConntrackFilter{}
		if err := f.AddIP(netlink.ConntrackReplySrcIP, a.AsSlice()); err != nil {
			t.Fatal(err)
		}
		n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		if err != nil {
			t.Fatalf("flush conntrack of %v: %v", a, err)
		}
		t.Logf("flushed %d conntrack entries of %v", n, a)
	}
}

// tunnelProblem checks the egress state in the pod's namespace (a client
// of the Egress nat): with want, an egr4- and an egr6- tunnel to the
// Service's ClusterIPs (kube-proxy
// DNATs them), FoU ports of both families, the seed's
// policy rules (tables 117 and 118) and the destinations' routes in table
// 117 through the tunnels; without, none of it. It returns what is wrong
// ("" = nothing).
func (cl *cluster) tunnelProblem(p *kubenode.Pod, want bool) string {
	var h *netlink.Handle
	err := p.NS.Do(func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
		return err
	})
	if err != nil {
		return err.Error()
	}
	defer h.Close()
	var problems []string
	links, err := h.LinkList()
	if err != nil {
		return err.Error()
	}
	tunnels := map[string]netlink.Link{}
	for _, l := range links {
		for _, pre := range []string{"egr4-", "egr6-"} {
			// The flow-based devices (egr4-flow, egr6-flow) are the
			// fallback for replies from router pods' own addresses.
			if strings.HasPrefix(l.Attrs().Name, pre) && l.Attrs().Name != pre+"flow" {
				tunnels[pre] = l
			}
		}
	}
	var rules []string
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := h.RuleList(fam)
		if err != nil {
			return err.Error()
		}
		for _, r := range rs {
			if r.Priority >= egress.PrioLinkLocal && r.Priority <= egress.PrioWide || r.Table == egress.TableNarrow || r.Table == egress.TableWide {
				rules = append(rules, fmt.Sprintf("pref %d table %d (family %d)", r.Priority, r.Table, fam))
			}
		}
	}
	var fous []netlink.Fou
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		fs, err := h.FouList(fam)
		if err != nil {
			return fmt.Sprintf("list FoU ports: %v", err)
		}
		fous = append(fous, fs...)
	}
	if !want {
		if len(tunnels) > 0 {
			problems = append(problems, fmt.Sprintf("tunnels %v left", keys(tunnels)))
		}
		if len(rules) > 0 {
			problems = append(problems, fmt.Sprintf("rules %v left", rules))
		}
		if len(fous) > 0 {
			problems = append(problems, fmt.Sprintf("FoU ports %v left", fous))
		}
		return strings.Join(problems, "; ")
	}
	for pre, cip := range map[string]netip.Addr{"egr4-": cl.nat.cip4, "egr6-": cl.nat.cip6} {
		var remote net.IP
		switch l := tunnels[pre].(type) {
		case nil:
			problems = append(problems, "no "+pre+" tunnel")
			continue
		case *netlink.Iptun:
			remote = l.Remote
		case *netlink.Ip6tnl:
			remote = l.Remote
		}
		if r, _ := netip.AddrFromSlice(remote); r.Unmap() != cip {
			problems = append(problems, fmt.Sprintf("tunnel %s to %v, want the ClusterIP %v", tunnels[pre].Attrs().Name, remote, cip))
		}
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		if !slices.ContainsFunc(rules, func(s string) bool {
			return s == fmt.Sprintf("pref %d table %d (family %d)", egress.PrioNarrow, egress.TableNarrow, fam)
		}) {
			problems = append(problems, fmt.Sprintf("no rule pref %d lookup %d (family %d) among %v", egress.PrioNarrow, egress.TableNarrow, fam, rules))
		}
	}
	if len(fous) < 2 {
		problems = append(problems, fmt.Sprintf("FoU ports %v, want one per family", fous))
	}
	for pre, dst := range map[string]netip.Prefix{"egr4-": extDst4, "egr6-": extDst6} {
		l := tunnels[pre]
		if l == nil {
			continue
		}
		routes, err := h.RouteListFiltered(familyOf(dst), &netlink.Route{Table: egress.TableNarrow}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err.Error()
		}
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
			return r.Dst != nil && r.Dst.String() == dst.String() && r.LinkIndex == l.Attrs().Index
		}) {
			problems = append(problems, fmt.Sprintf("no route %v dev %s in table %d", dst, l.Attrs().Name, egress.TableNarrow))
		}
	}
	return strings.Join(problems, "; ")
}

// wantTunnels waits until the pod's egress state is as want says.
func (cl *cluster) wantTunnels(t *testing.T, p *kubenode.Pod, want bool) {
	t.Helper()
	kubenode.Eventually(t, 10*time.Second, fmt.Sprintf("egress state of %s (tunnels wanted: %v)", p.RT.ContainerID, want), func() string {
		return cl.tunnelProblem(p, want)
	})
}

// httpProblem GETs url and says what is wrong ("" = 200 OK).
func httpProblem(url string) string {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.Status
	}
	return ""
}

func familyOf(p netip.Prefix) int {
	if p.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func nlAddr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// ifname is an interface name as nftables compares it.
func ifname(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}

// describeNS summarizes ns for a failure report: links (kind, addresses,
// tunnel ends), policy rules, routes of every table, FoU ports and
// nftables tables.
func describeNS(ns *harness.NS) string {
	var b strings.Builder
	var h *netlink.Handle
	err := ns.Do(func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
		return err
	})
	if err != nil {
		return err.Error()
	}
	defer h.Close()
	links, _ := h.LinkList()
	for _, l := range links {
		a := l.Attrs()
		fmt.Fprintf(&b, "link %s %s %s", a.Name, l.Type(), a.OperState)
		switch x := l.(type) {
		case *netlink.Iptun:
			fmt.Fprintf(&b, " local %v remote %v encap %d sport %d dport %d flow %v", x.Local, x.Remote, x.EncapType, x.EncapSport, x.EncapDport, x.FlowBased)
		case *netlink.Ip6tnl:
			fmt.Fprintf(&b, " local %v remote %v encap %d sport %d dport %d flow %v", x.Local, x.Remote, x.EncapType, x.EncapSport, x.EncapDport, x.FlowBased)
		}
		addrs, _ := h.AddrList(l, netlink.FAMILY_ALL)
		for _, ad := range addrs {
			fmt.Fprintf(&b, " %s", ad.IPNet)
		}
		b.WriteString("\n")
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, _ := h.RuleList(fam)
		for _, r := range rules {
			fmt.Fprintf(&b, "rule pref %d from %v to %v iif %q lookup %d\n", r.Priority, r.Src, r.Dst, r.IifName, r.Table)
		}
		routes, _ := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		for _, r := range routes {
			fmt.Fprintf(&b, "route table %d %v\n", r.Table, r)
		}
		fous, _ := h.FouList(fam)
		for _, f := range fous {
			fmt.Fprintf(&b, "fou port %d ipproto %d family %d\n", f.Port, f.Protocol, fam)
		}
	}
	if f, err := os.Open(ns.Path()); err == nil {
		defer f.Close()
		if c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd()))); err == nil {
			tables, _ := c.ListTables()
			for _, tb := range tables {
				fmt.Fprintf(&b, "nftables table %s (family %d)\n", tb.Name, tb.Family)
			}
		}
	}
	return b.String()
}

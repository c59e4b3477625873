package egress

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

func TestPlanClientRoutesAndTunnels(t *testing.T) {
	cfg := ClientConfig{Gateways: []Gateway{
		{Namespace: "ns", Name: "b", ServiceIPs: []netip.Addr{ip("10.96.0.2")},
			Destinations: []netip.Prefix{pfx("0.0.0.0/0"), pfx("198.51.100.0/24"), pfx("2001:db8::/32")}},
		{Namespace: "ns", Name: "a", ServiceIPs: []netip.Addr{ip("10.96.0.1"), ip("fd00:96::1")}, SourcePortAuto: true,
			Destinations: []netip.Prefix{pfx("198.51.100.7/24"), pfx("::/0")}},
	}}
	p, err := planClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a4, a6, b4 := clientTunnelName(false, "ns", "a"), clientTunnelName(true, "ns", "a"), clientTunnelName(false, "ns", "b")
	wantRoutes := []route{
		{table: TableNarrow, dst: pfx("198.51.100.0/24"), dev: a4}, // ns/a sorts first and wins; masked
		{table: TableWide, dst: pfx("::/0"), dev: a6},
		{table: TableWide, dst: pfx("0.0.0.0/0"), dev: b4},
		// 2001:db8::/32 of ns/b is skipped: ns/b has no IPv6 service IP
	}
	if !reflect.DeepEqual(p.routes, wantRoutes) {
		t.Errorf("routes = %+v, want %+v", p.routes, wantRoutes)
	}
	var names []string
	for _, tn := range p.tunnels {
		names = append(names, tn.name)
	}
	if want := []string{a4, a6, b4, flowDevice4, flowDevice6}; !reflect.DeepEqual(names, want) {
		t.Errorf("tunnels = %v, want %v", names, want)
	}
	if p.tunnels[0].sport != 0 || p.tunnels[2].sport != DefaultPort || p.tunnels[2].dport != DefaultPort {
		t.Errorf("source ports: auto gateway %d, fixed gateway %d/%d", p.tunnels[0].sport, p.tunnels[2].sport, p.tunnels[2].dport)
	}
	if want := []fouPort{{port: DefaultPort}, {v6: true, port: DefaultPort}}; !reflect.DeepEqual(p.fou, want) {
		t.Errorf("fou = %+v, want %+v", p.fou, want)
	}
	// The seed's rules of both families, and each tunnel's ServiceIP to
	// main at PrioServiceIP (after link-local, before table 117).
	var want []rule
	for _, v6 := range []bool{false, true} {
		rs := clientRules(v6)
		want = append(want, rs[0]) // link-local
		if v6 {
			want = append(want, rule{prio: PrioServiceIP, v6: true, dst: pfx("fd00:96::1/128"), table: tableMain})
		} else {
			want = append(want, rule{prio: PrioServiceIP, dst: pfx("10.96.0.1/32"), table: tableMain},
				rule{prio: PrioServiceIP, dst: pfx("10.96.0.2/32"), table: tableMain})
		}
		want = append(want, rs[1:]...)
	}
	if !reflect.DeepEqual(p.rules, want) {
		t.Errorf("rules = %+v\nwant %+v", p.rules, want)
	}
	for _, n := range names {
		if len(n) > 15 {
			t.Errorf("device name %q longer than IFNAMSIZ-1", n)
		}
	}
}

func TestPlanClientEmptyAndUnusedFamily(t *testing.T) {
	p, err := planClient(ClientConfig{})
	if err != nil || !p.empty() || len(p.rules)+len(p.routes)+len(p.fou) != 0 {
		t.Fatalf("zero config: %+v, %v", p, err)
	}
	// A v6-only gateway with only v4 destinations makes nothing.
	p, err = planClient(ClientConfig{Gateways: []Gateway{{Namespace: "n", Name: "x",
		ServiceIPs: []netip.Addr{ip("fd00::1")}, Destinations: []netip.Prefix{pfx("0.0.0.0/0")}}}})
	if err != nil || !p.empty() {
		t.Fatalf("unused family: %+v, %v", p, err)
	}
}

func TestPlanClientInvalid(t *testing.T) {
	for name, gw := range map[string]Gateway{
		"two v4 service IPs": {Namespace: "n", Name: "x", ServiceIPs: []netip.Addr{ip("10.96.0.1"), ip("10.96.0.2")}},
		"no name":            {Namespace: "n", ServiceIPs: []netip.Addr{ip("10.96.0.1")}},
		"zero service IP":    {Namespace: "n", Name: "x", ServiceIPs: []netip.Addr{{}}},
		"mapped service IP":  {Namespace: "n", Name: "x", ServiceIPs: []netip.Addr{ip("::ffff:10.96.0.1")}},
		"bad destination":    {Namespace: "n", Name: "x", ServiceIPs: []netip.Addr{ip("10.96.0.1")}, Destinations: []netip.Prefix{{}}},
		"port":               {Namespace: "n", Name: "x", Port: 70000},
	} {
		if _, err := planClient(ClientConfig{Gateways: []Gateway{gw}}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	dup := Gateway{Namespace: "n", Name: "x"}
	if _, err := planClient(ClientConfig{Gateways: []Gateway{dup, dup}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("duplicate gateway: err = %v, want ErrInvalid", err)
	}
}

func TestTunnelNames(t *testing.T) {
	long := "a-very-long-namespace-name-that-goes-on/and-an-egress-name-as-long"
	n := clientTunnelName(false, long, long)
	if len(n) != 13 || n[:5] != clientPrefix4 {
		t.Errorf("client name %q", n)
	}
	if clientTunnelName(false, "ns", "a") == clientTunnelName(false, "ns", "b") {
		t.Errorf("two gateways share the name %q", clientTunnelName(false, "ns", "a"))
	}
	if r := routerName6(ip("fd00:100::10"), 0); r[:5] != routerPrefix6 || len(r) != 13 || !isPeerName(r) {
		t.Errorf("router name %q", r)
	}
	if r := routerName4(ip("10.100.0.10")); r != "egc4-0a64000a" || !isPeerName(r) {
		t.Errorf("router name %q, want egc4-0a64000a", r)
	}
}

// collide finds two addresses gen(0), gen(1), ... whose strings hash
// alike with 32-bit FNV-1a (the hash of the IPv6 names, and of the IPv4
// names before they were the address).
func collide(t *testing.T, gen func(i uint32) netip.Addr) (netip.Addr, netip.Addr) {
	t.Helper()
	seen := map[string]netip.Addr{}
	for i := uint32(0); i < 1<<22; i++ {
		a := gen(i)
		h := hash8(a.String())
		if b, ok := seen[h]; ok {
			return b, a
		}
		seen[h] = a
	}
	t.Fatal("no collision found")
	return netip.Addr{}, netip.Addr{}
}

// TestPeerNames: peers whose hashes collide get distinct names; a peer
// keeps the name of the tunnel it has; foreign devices' names are
// avoided; the outcome does not depend on the peers' order.
func TestPeerNames(t *testing.T) {
	a4, b4 := collide(t, func(i uint32) netip.Addr { return netip.AddrFrom4([4]byte{10, 1 + byte(i>>16), byte(i >> 8), byte(i)}) })
	a6, b6 := collide(t, func(i uint32) netip.Addr {
		return netip.AddrFrom16([16]byte{0xfd, 0, 12: byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)})
	})
	check := func(what string, got map[netip.Addr]string, err error, peers ...netip.Addr) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		byName := map[string]netip.Addr{}
		for _, p := range peers {
			n := got[p]
			if !isPeerName(n) {
				t.Errorf("%s: %s named %q", what, p, n)
			}
			if o, ok := byName[n]; ok {
				t.Errorf("%s: %s and %s share %s", what, o, p, n)
			}
			byName[n] = p
		}
		if len(got) != len(peers) {
			t.Errorf("%s: %d names for %d peers: %v", what, len(got), len(peers), got)
		}
	}
	got, err := peerNames([]netip.Addr{b4, a4, b6, a6}, nil, nil)
	check("colliding peers", got, err, a4, b4, a6, b6)
	got2, err := peerNames([]netip.Addr{a6, a4, b6, b4}, nil, nil)
	if err != nil || !reflect.DeepEqual(got, got2) {
		t.Errorf("another order: %v %v, want %v", got2, err, got)
	}
	// b6 made first holds a6's first candidate: both keep working names,
	// b6 its own.
	cur := map[string]netip.Addr{routerName6(a6, 0): b6}
	got, err = peerNames([]netip.Addr{a6, b6}, cur, nil)
	check("existing tunnel", got, err, a6, b6)
	if got[b6] != routerName6(a6, 0) {
		t.Errorf("b6 named %s, want its tunnel's %s", got[b6], routerName6(a6, 0))
	}
	// A foreign device holds the first candidate.
	got, err = peerNames([]netip.Addr{a6}, nil, map[string]bool{routerName6(a6, 0): true})
	check("foreign device", got, err, a6)
	if got[a6] == routerName6(a6, 0) {
		t.Errorf("a6 got the foreign device's name %s", got[a6])
	}
	// A tunnel of a peer no longer wanted keeps its name from others.
	got, err = peerNames([]netip.Addr{a6}, map[string]netip.Addr{routerName6(a6, 0): b6}, nil)
	check("leaving tunnel", got, err, a6)
	if got[a6] == routerName6(a6, 0) {
		t.Errorf("a6 took the name %s of the tunnel still there", got[a6])
	}
}

func TestDestRanges(t *testing.T) {
	r := func(a, b string) addrRange { return addrRange{ip(a), ip(b)} }
	for _, c := range []struct {
		in     []string
		v4, v6 []addrRange
	}{
		{in: nil},
		{in: []string{"0.0.0.0/0", "::/0"}, v4: []addrRange{r("0.0.0.0", "255.255.255.255")},
			v6: []addrRange{r("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}},
		{in: []string{"192.0.2.0/24", "10.0.0.0/8", "10.1.0.0/16"}, v4: []addrRange{r("10.0.0.0", "10.255.255.255"), r("192.0.2.0", "192.0.2.255")}},
		{in: []string{"192.0.2.128/25", "192.0.2.0/25", "192.0.3.0/24"}, v4: []addrRange{r("192.0.2.0", "192.0.3.255")}},
		{in: []string{"192.0.2.0/25", "192.0.2.129/32"}, v4: []addrRange{r("192.0.2.0", "192.0.2.127"), r("192.0.2.129", "192.0.2.129")}},
		{in: []string{"255.255.255.255/32", "255.255.255.0/24"}, v4: []addrRange{r("255.255.255.0", "255.255.255.255")}},
		{in: []string{"2001:db8::/32", "2001:db8:1::/48"}, v6: []addrRange{r("2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")}},
	} {
		var ps []netip.Prefix
		for _, s := range c.in {
			ps = append(ps, pfx(s))
		}
		v4, v6, err := destRanges(ps)
		if err != nil || !reflect.DeepEqual(v4, c.v4) || !reflect.DeepEqual(v6, c.v6) {
			t.Errorf("destRanges(%v) = %v %v %v, want %v %v", c.in, v4, v6, err, c.v4, c.v6)
		}
	}
	for _, bad := range []netip.Prefix{{}, netip.PrefixFrom(ip("::ffff:10.0.0.0"), 104), netip.PrefixFrom(ip("10.0.0.0"), 33)} {
		if _, _, err := destRanges([]netip.Prefix{pfx("10.0.0.0/8"), bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("destRanges with %v: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestPlanWithoutFamily(t *testing.T) {
	p, err := planClient(ClientConfig{Gateways: []Gateway{{Namespace: "n", Name: "x", SourcePortAuto: true,
		ServiceIPs:   []netip.Addr{ip("10.96.0.1"), ip("fd00::1")},
		Destinations: []netip.Prefix{pfx("0.0.0.0/0"), pfx("::/0")}}}})
	if err != nil {
		t.Fatal(err)
	}
	q := p.withoutFamily(true)
	for _, tn := range q.tunnels {
		if tn.v6 {
			t.Errorf("IPv6 tunnel %s left", tn.name)
		}
	}
	if len(q.tunnels) != 2 || len(q.routes) != 1 || len(q.fou) != 1 || len(q.rules) != len(clientRules(false))+1 {
		t.Errorf("without IPv6: %+v", q)
	}
	if e := p.withoutFamily(false).withoutFamily(true); !e.empty() || len(e.rules)+len(e.routes)+len(e.fou) != 0 {
		t.Errorf("without both: %+v", e)
	}
}

// TestPlanClientFlowDeviceWithFixedPort: a fixed-port gateway gets the
// flow-based device of its family too (what a router sends from its own
// address once the node's conntrack entry of the outer flow is gone).
func TestPlanClientFlowDeviceWithFixedPort(t *testing.T) {
	p, err := planClient(ClientConfig{Gateways: []Gateway{{Namespace: "n", Name: "x",
		ServiceIPs: []netip.Addr{ip("10.96.0.1"), ip("fd00::1")}, Destinations: []netip.Prefix{pfx("0.0.0.0/0")}}}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tn := range p.tunnels {
		names = append(names, tn.name)
	}
	if want := []string{clientTunnelName(false, "n", "x"), flowDevice4}; !reflect.DeepEqual(names, want) {
		t.Errorf("tunnels = %v, want %v (no IPv6 destination: no IPv6 device)", names, want)
	}
}

// TestPlanClientServiceIPRules: each tunnel's ServiceIP goes to main at
// PrioInCluster, once per address (two gateways behind one ClusterIP
// share the rule), in the in-cluster range and after the private ones.
func TestPlanClientServiceIPRules(t *testing.T) {
	if !(PrioInCluster > PrioPrivate+len(private4) && PrioInCluster < PrioWide) {
		t.Fatalf("PrioInCluster %d not between the private rules and PrioWide %d", PrioInCluster, PrioWide)
	}
	// The ServiceIPs' rules come before table 117's: a destination that
	// covers the Service range must not catch the tunnels' own packets.
	if !(PrioServiceIP > PrioLinkLocal && PrioServiceIP < PrioNarrow) {
		t.Fatalf("PrioServiceIP %d not between PrioLinkLocal %d and PrioNarrow %d", PrioServiceIP, PrioLinkLocal, PrioNarrow)
	}
	p, err := planClient(ClientConfig{Gateways: []Gateway{
		{Namespace: "n", Name: "x", ServiceIPs: []netip.Addr{ip("100.96.0.50"), ip("2001:db8:96::50")},
			Destinations: []netip.Prefix{pfx("0.0.0.0/0"), pfx("::/0")}},
		{Namespace: "n", Name: "y", ServiceIPs: []netip.Addr{ip("100.96.0.50")}, Destinations: []netip.Prefix{pfx("198.51.100.0/24")}},
		// Its destination covers the Service range, ServiceIPs included.
		{Namespace: "n", Name: "z", ServiceIPs: []netip.Addr{ip("100.96.0.60")}, Destinations: []netip.Prefix{pfx("100.96.0.0/16")}},
	}, InCluster: []netip.Prefix{pfx("100.64.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	var got []rule
	for _, r := range p.rules {
		if r.prio == PrioInCluster || r.prio == PrioServiceIP {
			got = append(got, r)
		}
		if isInClusterRule(r) != (r.prio == PrioInCluster || r.prio == PrioServiceIP) {
			t.Errorf("isInClusterRule(%+v) = %v", r, isInClusterRule(r))
		}
	}
	want := []rule{
		{prio: PrioServiceIP, dst: pfx("100.96.0.50/32"), table: tableMain},
		{prio: PrioServiceIP, dst: pfx("100.96.0.60/32"), table: tableMain},
		{prio: PrioInCluster, dst: pfx("100.64.0.0/16"), table: tableMain},
		{prio: PrioServiceIP, v6: true, dst: pfx("2001:db8:96::50/128"), table: tableMain},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("in-cluster rules = %+v, want %+v", got, want)
	}
	if e, _ := planClient(ClientConfig{}); len(e.rules) != 0 {
		t.Errorf("zero config has rules %+v", e.rules)
	}
}

// TestPlanClientInCluster: in-cluster networks go to main at
// PrioInCluster in the families that have a tunnel, masked, deduplicated
// (with each other and with the ServiceIPs) and sorted; none without a
// gateway; bad ones and too many are ErrInvalid.
func TestPlanClientInCluster(t *testing.T) {
	gw := Gateway{Namespace: "n", Name: "x", ServiceIPs: []netip.Addr{ip("100.96.0.50")}, Destinations: []netip.Prefix{pfx("0.0.0.0/0")}}
	p, err := planClient(ClientConfig{Gateways: []Gateway{gw}, InCluster: []netip.Prefix{
		pfx("100.64.0.0/16"), pfx("2001:db8:64::/64"), pfx("100.64.7.1/16"), pfx("100.96.0.50/32"), pfx("100.32.0.0/12"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Prefix
	for _, r := range p.rules {
		if r.prio == PrioInCluster || r.prio == PrioServiceIP {
			got = append(got, r.dst)
			if r.v6 || r.table != tableMain {
				t.Errorf("in-cluster rule %+v", r)
			}
			// The ServiceIP listed as an in-cluster network too keeps its
			// place before table 117.
			if (r.dst == pfx("100.96.0.50/32")) != (r.prio == PrioServiceIP) {
				t.Errorf("rule %+v: want PrioServiceIP for the ServiceIP only", r)
			}
		}
	}
	// 2001:db8:64::/64 is left out: the pod has no IPv6 tunnel.
	if want := []netip.Prefix{pfx("100.96.0.50/32"), pfx("100.32.0.0/12"), pfx("100.64.0.0/16")}; !reflect.DeepEqual(got, want) {
		t.Errorf("in-cluster rules to %v, want %v", got, want)
	}
	if p, err := planClient(ClientConfig{InCluster: []netip.Prefix{pfx("100.64.0.0/16")}}); err != nil || len(p.rules) != 0 || !p.empty() {
		t.Errorf("without a gateway: %+v, %v", p, err)
	}
	many := make([]netip.Prefix, MaxInCluster+1)
	for i := range many {
		many[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}), 32)
	}
	if _, err := planClient(ClientConfig{Gateways: []Gateway{gw}, InCluster: many[:MaxInCluster]}); err != nil {
		t.Errorf("%d in-cluster networks: %v", MaxInCluster, err)
	}
	for name, n := range map[string][]netip.Prefix{
		"too many": many, "zero": {{}}, "default route": {pfx("0.0.0.0/0")}, "mapped": {pfx("::ffff:100.64.0.0/112")},
	} {
		if _, err := planClient(ClientConfig{Gateways: []Gateway{gw}, InCluster: n}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

// TestRouterDestRanges: a router forwards what a client routes through
// it: never link-local, a default route without the private ranges (a
// client keeps those on main), a narrower destination as given, private
// or not.
func TestRouterDestRanges(t *testing.T) {
	r := func(a, b string) addrRange { return addrRange{ip(a), ip(b)} }
	for _, c := range []struct {
		in     []string
		v4, v6 []addrRange
	}{
		{in: []string{"0.0.0.0/0"}, v4: []addrRange{
			r("0.0.0.0", "9.255.255.255"), r("11.0.0.0", "169.253.255.255"), r("169.255.0.0", "172.15.255.255"),
			r("172.32.0.0", "192.167.255.255"), r("192.169.0.0", "255.255.255.255")}},
		{in: []string{"::/0"}, v6: []addrRange{
			r("::", "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), r("fe00::", "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
			r("fec0::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}},
		// Named private destinations go through, as a client sends them.
		{in: []string{"10.5.0.0/16", "192.0.2.0/24"}, v4: []addrRange{r("10.5.0.0", "10.5.255.255"), r("192.0.2.0", "192.0.2.255")}},
		// Link-local never, even named.
		{in: []string{"169.254.0.0/15"}, v4: []addrRange{r("169.255.0.0", "169.255.255.255")}},
		{in: []string{"169.254.169.254/32"}},
		// A default route and a named private range: that range too.
		{in: []string{"0.0.0.0/0", "10.200.0.0/16"}, v4: []addrRange{
			r("0.0.0.0", "9.255.255.255"), r("10.200.0.0", "10.200.255.255"), r("11.0.0.0", "169.253.255.255"),
			r("169.255.0.0", "172.15.255.255"), r("172.32.0.0", "192.167.255.255"), r("192.169.0.0", "255.255.255.255")}},
	} {
		var ps []netip.Prefix
		for _, s := range c.in {
			ps = append(ps, pfx(s))
		}
		v4, v6, err := routerDestRanges(ps)
		if err != nil || !reflect.DeepEqual(v4, c.v4) || !reflect.DeepEqual(v6, c.v6) {
			t.Errorf("routerDestRanges(%v) = %v %v %v,\nwant %v %v", c.in, v4, v6, err, c.v4, c.v6)
		}
	}
	if _, _, err := routerDestRanges([]netip.Prefix{pfx("0.0.0.0/0"), {}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a zero prefix: %v, want ErrInvalid", err)
	}
}

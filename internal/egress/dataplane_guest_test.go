package egress

import (
	"errors"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
)

// The tests in this file need a kernel with fou, ipip and ip6_tunnel:
// they run inside the qemu guest (TestEgressInGuest starts it) and skip
// elsewhere.

func requireTunnels(t *testing.T) {
	t.Helper()
	requireGuest(t)
	harness.RequireRoot(t)
	if err := requireFoU(); err != nil {
		t.Fatalf("in the guest but: %v", err)
	}
}

func gateway(auto bool, dsts ...string) ClientConfig {
	g := Gateway{Namespace: "default", Name: "egress", ServiceIPs: []netip.Addr{svc4, svc6}, SourcePortAuto: auto}
	for _, d := range dsts {
		g.Destinations = append(g.Destinations, pfx(d))
	}
	return ClientConfig{Gateways: []Gateway{g}}
}

func stats(t *testing.T, tp *topo) []RouterStats {
	t.Helper()
	var out []RouterStats
	for i, r := range tp.r {
		if tp.gone[i] {
			out = append(out, RouterStats{})
			continue
		}
		s, err := r.Stats()
		if err != nil {
			t.Fatalf("router %d stats: %v", i+1, err)
		}
		out = append(out, s)
	}
	return out
}

func packets(ss []RouterStats) (n uint64) {
	for _, s := range ss {
		n += s.Packets
	}
	return n
}

// mustVia asserts that proto traffic from the client to dst leaves SNAT'd
// through a router (the server sees a router's address, of dst's family)
// and that the routers' nft counters moved; it returns the router's index.
func mustVia(t *testing.T, tp *topo, proto string, dst netip.Addr) int {
	t.Helper()
	before := stats(t, tp)
	got, err := seenFrom(tp.client, proto, dst)
	if err != nil {
		t.Fatalf("through the gateway: %v", err)
	}
	i := routerOf(got)
	if i < 0 || ip(got).Is4() != dst.Is4() {
		t.Fatalf("%s to %s: the server saw %s, want a router pod's address of that family", proto, dst, got)
	}
	after := stats(t, tp)
	if after[i].Packets <= before[i].Packets || after[i].NATConnections <= before[i].NATConnections {
		t.Errorf("%s to %s via router %d: its counters did not move (before %+v, after %+v)", proto, dst, i+1, before[i], after[i])
	}
	return i
}

// settled returns the routers' forwarded-packet total once it has stopped
// moving. A connection the test made through a router a moment ago may
// still send its last packets (the client's FIN, the ACK of the server's)
// after the call that made it returned; a baseline read while they are in
// flight charges them to the next flow.
func settled(t *testing.T, tp *topo) uint64 {
	t.Helper()
	const quiet = 3 // equal reads in a row, 50 ms apart
	last, same := packets(stats(t, tp)), 0
	for deadline := time.Now().Add(5 * time.Second); same < quiet; {
		if time.Now().After(deadline) {
			t.Fatalf("the routers' forwarded packets kept moving for 5 s (last %d) with no traffic of the test's own", last)
		}
		time.Sleep(50 * time.Millisecond)
		n := packets(stats(t, tp))
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// mustDirect asserts that traffic to dst leaves with the client's own
// address and not through any router.
func mustDirect(t *testing.T, tp *topo, proto string, dst netip.Addr) {
	t.Helper()
	before := settled(t, tp)
	got, err := seenFrom(tp.client, proto, dst)
	if err != nil {
		t.Fatalf("direct: %v", err)
	}
	if got != client4.String() && got != client6.String() {
		t.Errorf("%s to %s: the server saw %s, want the client's own address", proto, dst, got)
	}
	if after := settled(t, tp); after != before {
		t.Errorf("%s to %s went through a router: forwarded packets %d -> %d", proto, dst, before, after)
	}
}

func TestGuestEgressFixedPort(t *testing.T) { testEgress(t, false) }
func TestGuestEgressAutoPort(t *testing.T)  { testEgress(t, true) }

func testEgress(t *testing.T, auto bool) {
	requireTunnels(t)
	tp := newTopo(t, auto)
	before := harness.Snapshot(t, tp.client)

	// Everything through the gateway: default routes of both families.
	cfg := gateway(auto, "0.0.0.0/0", "::/0")
	// The calling thread stays in its namespace.
	runtime.LockOSThread()
	self, _ := os.Readlink("/proc/thread-self/ns/net")
	err := ApplyClient(tp.client.Path(), cfg)
	now, _ := os.Readlink("/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatalf("ApplyClient: %v", err)
	}
	if self == "" || self != now {
		t.Errorf("the calling thread's namespace changed: %q -> %q", self, now)
	}
	st, err := ClientState(tp.client.Path())
	if err != nil {
		t.Fatal(err)
	}
	checkState(t, st, auto)
	// Idempotent: a second apply changes nothing.
	mid := harness.Snapshot(t, tp.client)
	if err := ApplyClient(tp.client.Path(), cfg); err != nil {
		t.Fatalf("ApplyClient again: %v", err)
	}
	harness.AssertSame(t, mid, harness.Snapshot(t, tp.client))

	for _, dst := range []netip.Addr{ext4, ext6} {
		for _, proto := range []string{"tcp", "udp"} {
			mustVia(t, tp, proto, dst)
		}
	}
	// Private destinations stay on main, even with a default gateway.
	mustDirect(t, tp, "tcp", privDst4)
	mustDirect(t, tp, "udp", privDst4)

	for i, s := range stats(t, tp) {
		if s.Tunnels != 2 || s.Peers != 2 {
			t.Errorf("router %d: %d tunnels, %d peers; want 2 and 2", i+1, s.Tunnels, s.Peers)
		}
	}
	var ct int
	for _, s := range stats(t, tp) {
		ct += s.ConntrackEntries
	}
	if ct == 0 {
		t.Errorf("no conntrack entries of the client counted on the routers after its traffic")
	}

	// Specific destinations only (table 117): the rest goes direct.
	if err := ApplyClient(tp.client.Path(), gateway(auto, "198.51.100.0/24", "2001:db8:fe::/64")); err != nil {
		t.Fatalf("ApplyClient, specific destinations: %v", err)
	}
	mustVia(t, tp, "tcp", far4)
	mustVia(t, tp, "udp", far6)
	mustDirect(t, tp, "tcp", ext4)
	mustDirect(t, tp, "tcp", ext6)

	// A router goes away: new connections take the other one.
	if err := ApplyClient(tp.client.Path(), cfg); err != nil {
		t.Fatal(err)
	}
	served := mustVia(t, tp, "tcp", ext4)
	tp.removeRouter(t, served)
	other := 1 - served
	for _, dst := range []netip.Addr{ext4, ext6} {
		for _, proto := range []string{"tcp", "udp"} {
			got, err := seenFrom(tp.client, proto, dst)
			if err != nil {
				t.Fatalf("after router %d went: %v", served+1, err)
			}
			if routerOf(got) != other {
				t.Errorf("after router %d went, %s to %s: the server saw %s, want router %d", served+1, proto, dst, got, other+1)
			}
		}
	}

	// The zero config removes everything.
	if err := ApplyClient(tp.client.Path(), ClientConfig{}); err != nil {
		t.Fatalf("ApplyClient(zero): %v", err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, tp.client))
	if st, err := ClientState(tp.client.Path()); err != nil || !st.Empty() {
		t.Errorf("ClientState after the zero config = %+v, %v; want empty", st, err)
	}
	mustDirect(t, tp, "tcp", ext4)
}

func checkState(t *testing.T, st ClientStatus, auto bool) {
	t.Helper()
	sport := DefaultPort
	if auto {
		sport = 0
	}
	want := []TunnelStatus{
		{Device: clientTunnelName(false, "default", "egress"), Gateway: "default/egress", Remote: svc4, Local: client4, SourcePort: sport, DestPort: DefaultPort},
		{Device: clientTunnelName(true, "default", "egress"), Gateway: "default/egress", IPv6: true, Remote: svc6, Local: client6, SourcePort: sport, DestPort: DefaultPort},
	}
	// The flow-based devices, with either source port.
	want = append(want, TunnelStatus{Device: flowDevice4, FlowBased: true}, TunnelStatus{Device: flowDevice6, IPv6: true, FlowBased: true})
	sortTunnels(want)
	if !reflect.DeepEqual(st.Tunnels, want) {
		t.Errorf("tunnels = %+v\nwant %+v", st.Tunnels, want)
	}
	wantRoutes := []RouteStatus{
		{Table: TableWide, Dst: pfx("0.0.0.0/0"), Device: want[0].Device},
		{Table: TableWide, Dst: pfx("::/0"), Device: clientTunnelName(true, "default", "egress")},
	}
	if !reflect.DeepEqual(st.Routes, wantRoutes) {
		t.Errorf("routes = %+v, want %+v", st.Routes, wantRoutes)
	}
	if len(st.Rules) != len(clientRules(false))+len(clientRules(true))+2 {
		t.Errorf("rules = %+v, want the seed's for both families and one per ServiceIP", st.Rules)
	}
	for _, r := range []RuleStatus{
		{Priority: PrioServiceIP, Dst: netip.PrefixFrom(svc4, 32), Table: tableMain},
		{Priority: PrioServiceIP, IPv6: true, Dst: netip.PrefixFrom(svc6, 128), Table: tableMain},
	} {
		if !slices.Contains(st.Rules, r) {
			t.Errorf("rules = %+v, want %+v among them", st.Rules, r)
		}
	}
	if w := []FoUPortStatus{{Port: DefaultPort}, {IPv6: true, Port: DefaultPort}}; !reflect.DeepEqual(st.FoUPorts, w) {
		t.Errorf("fou ports = %+v, want %+v", st.FoUPorts, w)
	}
}

func sortTunnels(ts []TunnelStatus) {
	for i := range ts {
		for j := i + 1; j < len(ts); j++ {
			if ts[j].Device < ts[i].Device {
				ts[i], ts[j] = ts[j], ts[i]
			}
		}
	}
}

// TestGuestApplyClientRollback: failures half-way through leave the pod
// as it was: links, addresses, routes, rules (the snapshot) and FoU ports.
func TestGuestApplyClientRollback(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	pod := tp.client
	a := Gateway{Namespace: "a", Name: "gw", ServiceIPs: []netip.Addr{svc4}, Destinations: []netip.Prefix{pfx("0.0.0.0/0")}}
	b := Gateway{Namespace: "b", Name: "gw", ServiceIPs: []netip.Addr{ip("10.96.0.51")}, Destinations: []netip.Prefix{pfx("198.51.100.0/24")}}

	// A foreign device holds b's tunnel name; a's tunnel is made first.
	clash := clientTunnelName(false, "b", "gw")
	h := pod.Handle(t)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: clash}, PeerName: "clashpeer"}); err != nil {
		t.Fatal(err)
	}
	empty := harness.Snapshot(t, pod)
	err := ApplyClient(pod.Path(), ClientConfig{Gateways: []Gateway{a, b}})
	if !errors.Is(err, ErrNameClash) {
		t.Fatalf("name clash: err = %v, want ErrNameClash", err)
	}
	harness.AssertSame(t, empty, harness.Snapshot(t, pod))
	if st, err := ClientState(pod.Path()); err != nil || !st.Empty() {
		t.Errorf("after the failed apply: %+v, %v; want nothing", st, err)
	}

	// A working state, then a change that replaces a's tunnel (new
	// ServiceIP) before failing on b: a's old tunnel and routes return.
	if err := ApplyClient(pod.Path(), ClientConfig{Gateways: []Gateway{a}}); err != nil {
		t.Fatal(err)
	}
	good := harness.Snapshot(t, pod)
	goodState, _ := ClientState(pod.Path())
	a2 := a
	a2.ServiceIPs = []netip.Addr{ip("10.96.0.99")}
	a2.Destinations = append(a2.Destinations, pfx("203.0.113.0/24"))
	if err := ApplyClient(pod.Path(), ClientConfig{Gateways: []Gateway{a2, b}}); !errors.Is(err, ErrNameClash) {
		t.Fatalf("replace then clash: err = %v, want ErrNameClash", err)
	}
	harness.AssertSame(t, good, harness.Snapshot(t, pod))
	if st, err := ClientState(pod.Path()); err != nil || !reflect.DeepEqual(st, goodState) {
		t.Errorf("after the failed change: %+v, %v\nwant %+v", st, err, goodState)
	}

	// A pod without IPv6 and a dual-stack gateway: the IPv6 side is left
	// out, the IPv4 side made; the zero config takes it all away again.
	if err := h.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: clash}}); err != nil {
		t.Fatal(err)
	}
	if err := ApplyClient(pod.Path(), ClientConfig{}); err != nil {
		t.Fatal(err)
	}
	noV6 := harness.NewNS(t, "egnov6")
	plugPod(t, tp.node, noV6, "vnov6", ip("10.100.0.30"), netip.Addr{})
	before := harness.Snapshot(t, noV6)
	if err := ApplyClient(noV6.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatalf("a dual-stack gateway in an IPv4-only pod: %v", err)
	}
	st, err := ClientState(noV6.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Tunnels) != 2 || st.Tunnels[0].IPv6 || st.Tunnels[1].IPv6 || len(st.Routes) != 1 || len(st.Rules) != len(clientRules(false))+1 || len(st.FoUPorts) != 1 {
		t.Errorf("IPv4-only pod: %+v, want the IPv4 tunnel (and flow-based device), route, rules and port only", st)
	}
	if err := ApplyClient(noV6.Path(), ClientConfig{}); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, noV6))
}

// TestGuestRouterPeers: SyncPeers keeps exactly one tunnel per peer, and
// Close leaves the router's namespace as NewRouter found it.
func TestGuestRouterPeers(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	r := tp.r[0]
	name6 := routerName6(client6, 0)
	if err := r.SyncPeers([]netip.Addr{client4}); err != nil {
		t.Fatal(err)
	}
	s, err := r.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.Tunnels != 1 || s.Peers != 1 {
		t.Errorf("after dropping a peer: %+v, want 1 tunnel and 1 peer", s)
	}
	if _, err := tp.routers[0].Handle(t).LinkByName(name6); err == nil {
		t.Errorf("the dropped peer's tunnel %s is still there", name6)
	}
	if err := r.SyncPeers([]netip.Addr{client4, client6, ip("10.100.0.77")}); err != nil {
		t.Fatal(err)
	}
	if s, _ := r.Stats(); s.Tunnels != 3 || s.Peers != 3 {
		t.Errorf("after adding peers: %+v, want 3 tunnels and 3 peers", s)
	}
	rt := tp.routers[0].Handle(t)
	routes, err := rt.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: RouterTable}, netlink.RT_FILTER_TABLE)
	if err != nil || len(routes) != 2 {
		t.Errorf("router table %d holds %d IPv4 routes (%v), want 2", RouterTable, len(routes), err)
	}

	// Close removes all; a fresh router in a fresh pod compares exactly.
	fresh := harness.NewNS(t, "egrouter3")
	plugPod(t, tp.node, fresh, "vrouter3", ip("10.100.0.22"), ip("fd00:100::22"))
	// Sysctls stay as NewRouter set them (documented); IPv6 forwarding
	// adds the subnet-router anycast route, so it is on before the
	// snapshot.
	sysctls(t, fresh, [2]string{"net/ipv4/ip_forward", "1"}, [2]string{"net/ipv6/conf/all/forwarding", "1"})
	before := harness.Snapshot(t, fresh)
	r3, err := NewRouter(RouterConfig{NetNS: fresh.Path(), Local4: ip("10.100.0.22"), Local6: ip("fd00:100::22")})
	if err != nil {
		t.Fatal(err)
	}
	if err := r3.SyncPeers([]netip.Addr{client4, client6}); err != nil {
		t.Fatal(err)
	}
	if err := r3.Close(); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, fresh))
	c, err := nftConn(fresh.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	if _, err := c.ListTableOfFamily(NFTable, nftTable.Family); err == nil {
		t.Errorf("the nftables table %s is still there after Close", NFTable)
	}
}

// TestGuestApplyClientConcurrent: skeind attaches pods in parallel;
// ApplyClient on several namespaces at once makes each pod's state and
// nothing else.
func TestGuestApplyClientConcurrent(t *testing.T) {
	requireTunnels(t)
	node := harness.NewNS(t, "egnode")
	const n = 6
	pods := make([]*harness.NS, n)
	for i := range pods {
		pods[i] = harness.NewNS(t, "egpar")
		plugPod(t, node, pods[i], "vp"+string(rune('a'+i)), netip.AddrFrom4([4]byte{10, 100, 3, byte(i + 1)}),
			netip.AddrFrom16([16]byte{0xfd, 0, 1, 0, 14: 3, 15: byte(i + 1)}))
	}
	errs := make(chan error, n)
	for _, p := range pods {
		go func() { errs <- ApplyClient(p.Path(), gateway(true, "0.0.0.0/0", "::/0")) }()
	}
	for range pods {
		if err := <-errs; err != nil {
			t.Errorf("concurrent ApplyClient: %v", err)
		}
	}
	for i, p := range pods {
		st, err := ClientState(p.Path())
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Tunnels) != 4 || len(st.Routes) != 2 || len(st.FoUPorts) != 2 {
			t.Errorf("pod %d after concurrent applies: %+v", i, st)
		}
		for _, tn := range st.Tunnels {
			want := netip.AddrFrom4([4]byte{10, 100, 3, byte(i + 1)})
			if tn.IPv6 {
				want = netip.AddrFrom16([16]byte{0xfd, 0, 1, 0, 14: 3, 15: byte(i + 1)})
			}
			if !tn.FlowBased && tn.Local != want {
				t.Errorf("pod %d: tunnel %s has local %s, want the pod's own %s", i, tn.Device, tn.Local, want)
			}
		}
	}
	if st, err := ClientState(node.Path()); err != nil || !st.Empty() {
		t.Errorf("the node namespace got egress state: %+v, %v", st, err)
	}
}

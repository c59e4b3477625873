package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/harness"
)

// Router-side guest tests found by review (see dataplane_guest_test.go for
// the main ones).

func conntrackSum(t *testing.T, tp *topo) int {
	t.Helper()
	n := 0
	for _, s := range stats(t, tp) {
		n += s.ConntrackEntries
	}
	return n
}

// listenIn starts a TCP server in ns that answers "ok" and closes.
func listenIn(t *testing.T, ns *harness.NS, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() error { var err error; ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
}

func dialIn(ns *harness.NS, to netip.AddrPort) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", to.String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(c)
		return err
	})
}

// TestGuestRouterConntrackCount: ConntrackEntries counts the sessions the
// router SNATs for its clients and nothing else: not the FoU flows that
// carry them, not a client's direct connection to the router pod (a
// Prometheus pod that is itself an egress client scraping the router).
func TestGuestRouterConntrackCount(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	for i := range tp.routers {
		listenIn(t, tp.routers[i], ":7020")
		for _, a := range []netip.Addr{router4[i], router6[i]} {
			if err := dialIn(tp.client, netip.AddrPortFrom(a, 7020)); err != nil {
				t.Fatalf("the client to router %d directly (%s): %v", i+1, a, err)
			}
		}
	}
	if n := conntrackSum(t, tp); n != 0 {
		t.Errorf("after the client's direct connections to the routers: %d conntrack entries counted, want 0", n)
	}
	mustVia(t, tp, "udp", ext4)
	if n := conntrackSum(t, tp); n != 1 {
		t.Errorf("after one UDP exchange through the gateway: %d conntrack entries counted, want 1 (the SNAT'd flow, not its FoU carrier)", n)
	}
	mustVia(t, tp, "tcp", ext6)
	if n := conntrackSum(t, tp); n != 2 {
		t.Errorf("after a TCP connection through the gateway too: %d conntrack entries counted, want 2", n)
	}
}

// withoutModule unloads the kernel module name for the rest of the test
// and loads it again (from the guest's module directory) at cleanup.
func withoutModule(t *testing.T, name string) {
	t.Helper()
	if _, err := os.Stat("/sys/module/" + name); err != nil {
		t.Skipf("skipping: %s is not a loaded module in this guest: %v", name, err)
	}
	ko := "/lib/modules/skein/" + name + ".ko"
	if _, err := os.Stat(ko); err != nil {
		t.Skipf("skipping: no %s to load %s again: %v", ko, name, err)
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// Namespaces of earlier tests may still be going away.
		if err = unix.DeleteModule(name, unix.O_NONBLOCK); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("unload %s: %v", name, err)
	}
	t.Cleanup(func() {
		f, err := os.Open(ko)
		if err == nil {
			err = unix.FinitModule(int(f.Fd()), "", 0)
			f.Close()
		}
		if err != nil {
			t.Errorf("load %s again: %v", name, err)
		}
	})
}

// TestGuestNoFoU6: on a kernel with fou but without fou6 (which nothing
// loads on demand), IPv6 tunnels fail with ErrNotSupported naming fou6,
// and the client pod is left as it was.
func TestGuestNoFoU6(t *testing.T) {
	requireTunnels(t)
	withoutModule(t, "fou6")
	node := harness.NewNS(t, "egnode")
	pod, rns := harness.NewNS(t, "egpod"), harness.NewNS(t, "egrouter")
	plugPod(t, node, pod, "vnofou6", client4, client6)
	plugPod(t, node, rns, "vnofou6r", router4[0], router6[0])

	before := harness.Snapshot(t, pod)
	err := ApplyClient(pod.Path(), gateway(false, "0.0.0.0/0", "::/0"))
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "fou6 module not available") {
		t.Errorf("ApplyClient without fou6: err = %v, want ErrNotSupported naming fou6", err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, pod))

	r, err := NewRouter(RouterConfig{NetNS: rns.Path(), Local4: router4[0], Local6: router6[0]})
	if err != nil {
		t.Fatalf("NewRouter without fou6 (receiving needs only fou): %v", err)
	}
	defer r.Close()
	err = r.SyncPeers([]netip.Addr{client4, client6})
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "fou6 module not available") {
		t.Errorf("SyncPeers with an IPv6 peer without fou6: err = %v, want ErrNotSupported naming fou6", err)
	}
	if got := r.Peers(); len(got) != 1 || got[0] != client4 {
		t.Errorf("peers with a tunnel = %v, want the IPv4 one only", got)
	}
}

// TestGuestRouterStatsManyEntries: Stats runs at every metrics scrape, and
// a busy router's conntrack table is large. The count is exact over
// thousands of entries of every shape, and costs well under decoding the
// whole dump into flows (what it did before).
func TestGuestRouterStatsManyEntries(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	r, rns := tp.r[1], tp.routers[1]
	h, err := openHandle(rns.Path(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	const snat, other = 2000, 400
	add := func(i int, src, dst, replyDst netip.Addr) {
		t.Helper()
		f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 600,
			Forward: netlink.IPTuple{SrcIP: ipOf(src), DstIP: ipOf(dst), Protocol: unix.IPPROTO_UDP, SrcPort: uint16(10000 + i), DstPort: 53},
			Reverse: netlink.IPTuple{SrcIP: ipOf(dst), DstIP: ipOf(replyDst), Protocol: unix.IPPROTO_UDP, SrcPort: 53, DstPort: uint16(10000 + i)}}
		if src.Is6() {
			f.FamilyType = unix.AF_INET6
		}
		if err := h.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(f.FamilyType), f); err != nil {
			t.Fatalf("conntrack entry %d: %v", i, err)
		}
	}
	for i := 0; i < snat; i++ {
		if i%4 == 0 { // a quarter IPv6
			add(i, client6, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}), router6[1])
			continue
		}
		add(i, client4, netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), router4[1])
	}
	for i := 0; i < other; i++ {
		switch i % 2 {
		case 0: // a client's own flow to the router (not SNAT'd)
			add(snat+i, client4, router4[1], client4)
		case 1: // not a peer
			add(snat+i, ip("10.100.0.99"), netip.AddrFrom4([4]byte{203, 1, byte(i >> 8), byte(i)}), router4[1])
		}
	}
	// The former way: every entry decoded into a flow, then filtered.
	decodeAll := func() int {
		n := 0
		for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range flows {
				if src := addrOf(f.Forward.SrcIP); (src == client4 || src == client6) && addrOf(f.Reverse.DstIP) != src {
					n++
				}
			}
		}
		return n
	}
	best := func(f func()) time.Duration {
		b := time.Duration(1 << 62)
		for range 5 {
			start := time.Now()
			f()
			b = min(b, time.Since(start))
		}
		return b
	}
	var s RouterStats
	statsTime := best(func() {
		if s, err = r.Stats(); err != nil {
			t.Fatal(err)
		}
	})
	if s.ConntrackEntries != snat {
		t.Errorf("Stats counted %d conntrack entries, want %d", s.ConntrackEntries, snat)
	}
	var n int
	decodeTime := best(func() { n = decodeAll() })
	if n != snat {
		t.Errorf("the full decode counted %d, want %d", n, snat)
	}
	// The times are reported, not asserted: a test's timing moves with
	// the machine's load (under TCG most of all); the counts above are
	// what must hold.
	t.Logf("%d entries: Stats %v, a full decode %v", snat+other, statsTime, decodeTime)
}

// TestGuestEgressPodMTU: with the pods' MTU below 1500 (skeind's VXLAN
// mode gives them 1450), the tunnels on both ends leave room for the
// encapsulation (IPv4: 20 + 8 bytes, IPv6: 40 + 8), and bulk TCP through
// the gateway works both ways with full-size segments.
func TestGuestEgressPodMTU(t *testing.T) {
	requireTunnels(t)
	const mtu = 1450
	tp := newTopo(t, false)
	for _, r := range tp.r { // the routers' tunnels are made again below
		if err := r.SyncPeers(nil); err != nil {
			t.Fatal(err)
		}
	}
	nh := tp.node.Handle(t)
	for i, ns := range append([]*harness.NS{tp.client}, tp.routers...) {
		nodeDev := "vclient"
		if i > 0 {
			nodeDev = fmt.Sprintf("vrouter%d", i)
		}
		for _, end := range []struct {
			h   *netlink.Handle
			dev string
		}{{ns.Handle(t), "eth0"}, {nh, nodeDev}} {
			l, err := end.h.LinkByName(end.dev)
			if err == nil {
				err = end.h.LinkSetMTU(l, mtu)
			}
			if err != nil {
				t.Fatalf("mtu of %s: %v", end.dev, err)
			}
		}
	}
	for _, r := range tp.r {
		if err := r.SyncPeers([]netip.Addr{client4, client6}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	wantMTU := func(ns *harness.NS, dev string, want int) {
		t.Helper()
		l, err := ns.Handle(t).LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().MTU != want {
			t.Errorf("%s in %s: mtu %d, want %d", dev, ns.Name(), l.Attrs().MTU, want)
		}
	}
	wantMTU(tp.client, clientTunnelName(false, "default", "egress"), mtu-28)
	wantMTU(tp.client, clientTunnelName(true, "default", "egress"), mtu-48)
	for _, rns := range tp.routers {
		wantMTU(rns, routerName4(client4), mtu-28)
		wantMTU(rns, routerName6(client6, 0), mtu-48)
	}

	// A server in the external namespace that sinks ('u') or sends ('d')
	// 4 MiB.
	const size = 4 << 20
	var ln net.Listener
	if err := tp.ext.Do(func() error { var err error; ln, err = net.Listen("tcp", ":7030"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := []byte{0}
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				if b[0] == 'd' {
					_, _ = c.Write(make([]byte, size))
					return
				}
				n, _ := io.Copy(io.Discard, c)
				_, _ = fmt.Fprint(c, n)
			}()
		}
	}()
	for _, dst := range []netip.Addr{ext4, ext6} {
		for _, dir := range []string{"u", "d"} {
			var got int64
			err := tp.client.Do(func() error {
				c, err := net.DialTimeout("tcp", netip.AddrPortFrom(dst, 7030).String(), 5*time.Second)
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(60 * time.Second))
				if _, err := c.Write([]byte(dir)); err != nil {
					return err
				}
				if dir == "d" {
					got, err = io.Copy(io.Discard, c)
					return err
				}
				if _, err := c.Write(make([]byte, size)); err != nil {
					return err
				}
				_ = c.(*net.TCPConn).CloseWrite()
				b, err := io.ReadAll(c)
				_, _ = fmt.Sscan(string(b), &got)
				return err
			})
			if err != nil || got != size {
				t.Errorf("%s %s through the gateway at mtu %d: %d of %d bytes, %v", map[string]string{"u": "upload to", "d": "download from"}[dir], dst, mtu, got, size, err)
			}
		}
	}
}

// TestGuestRouterOwnTraffic: the router's rule "iif <out> lookup
// RouterTable" and its masquerade leave the router pod's own traffic
// alone: it reaches the API server (here: the external server) from its
// own address, un-NAT'd and not forwarded; the kubelet's probes (from the
// node) and a client pod's direct connections (a Prometheus that is an
// egress client itself) get their answers.
func TestGuestRouterOwnTraffic(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	before := stats(t, tp)
	for i, rns := range tp.routers {
		for _, dst := range []netip.Addr{ext4, ext6} {
			for _, proto := range []string{"tcp", "udp"} {
				got, err := seenFrom(rns, proto, dst)
				want := router4[i]
				if dst.Is6() {
					want = router6[i]
				}
				if err != nil || got != want.String() {
					t.Errorf("router %d's own %s to %s: the server saw %q (%v), want %s", i+1, proto, dst, got, err, want)
				}
			}
		}
		listenIn(t, rns, ":7020")
		for _, a := range []netip.Addr{router4[i], router6[i]} {
			for _, from := range []*harness.NS{tp.node, tp.client} {
				if err := dialIn(from, netip.AddrPortFrom(a, 7020)); err != nil {
					t.Errorf("%s to router %d at %s: %v", from.Name(), i+1, a, err)
				}
			}
		}
	}
	for i, s := range stats(t, tp) {
		if s.Packets != before[i].Packets || s.NATConnections != before[i].NATConnections {
			t.Errorf("router %d: its own traffic was forwarded or NAT'd: %+v -> %+v", i+1, before[i], s)
		}
	}
	// And the clients' traffic still goes through.
	mustVia(t, tp, "tcp", ext4)
	mustVia(t, tp, "tcp", ext6)
}

// TestGuestRouterRestart: skein-egress restarting in its pod (a crash:
// no Close) finds its own leftovers; NewRouter adopts or replaces them
// without duplicates, the clients' traffic flows again after SyncPeers,
// and Close then leaves nothing.
func TestGuestRouterRestart(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	tp.setEndpoints(t, 0)
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	if i := mustVia(t, tp, "udp", ext4); i != 0 {
		t.Fatalf("via router %d, want 1", i+1)
	}
	rns := tp.routers[0]
	r2, err := NewRouter(RouterConfig{NetNS: rns.Path(), Local4: router4[0], Local6: router6[0]})
	if err != nil {
		t.Fatalf("NewRouter over a running router's leftovers: %v", err)
	}
	tp.r[0] = r2 // the crashed one is never closed
	if err := r2.SyncPeers([]netip.Addr{client4, client6}); err != nil {
		t.Fatal(err)
	}
	if err := r2.SyncDestinations(everywhere); err != nil {
		t.Fatal(err)
	}
	h, err := openHandle(rns.Path(), false) // with a generic netlink socket there, for FoU
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, x := range rules {
		if x.Table == RouterTable {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d rules to table %d after the restart, want 2 (one per family)", n, RouterTable)
	}
	if fs, err := h.FouList(0); err != nil || len(fs) != 2 {
		t.Errorf("fou ports after the restart: %+v, %v; want 2", fs, err)
	}
	c, err := nftConn(rns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, ch := range chains {
		if ch.Table.Name == NFTable {
			rs, err := c.GetRules(ch.Table, ch)
			if err != nil {
				t.Fatal(err)
			}
			ours = append(ours, fmt.Sprintf("%s:%d", ch.Name, len(rs)))
		}
	}
	if strings.Join(ours, " ") != "forward:6 postrouting:1" {
		t.Errorf("nftables table %s after the restart: chains %v, want forward with 6 rules (4 drops, 2 counters), postrouting with 1", NFTable, ours)
	}
	for _, proto := range []string{"tcp", "udp"} {
		for _, dst := range []netip.Addr{ext4, ext6} {
			if i := mustVia(t, tp, proto, dst); i != 0 {
				t.Errorf("%s to %s via router %d, want 1", proto, dst, i+1)
			}
		}
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	tp.gone = map[int]bool{0: true}
	if s, err := ClientState(rns.Path()); err != nil || !s.Empty() {
		t.Errorf("router namespace after Close: %+v, %v", s, err)
	}
	rules, _ = h.RuleList(netlink.FAMILY_ALL)
	for _, x := range rules {
		if x.Table == RouterTable {
			t.Errorf("rule left after Close: %+v", x)
		}
	}
	if fs, err := h.FouList(0); err != nil || len(fs) != 0 {
		t.Errorf("fou ports after Close: %+v, %v", fs, err)
	}
	if _, err := c.ListTableOfFamily(NFTable, nftTable.Family); err == nil {
		t.Errorf("the nftables table %s is still there after Close", NFTable)
	}
	if ts, err := listTunnels(h, routerPrefix4, routerPrefix6); err != nil || len(ts.ours) != 0 {
		t.Errorf("tunnels after Close: %+v, %v", ts.ours, err)
	}
}

// TestGuestClientServiceIPChange: an Egress Service re-created with new
// ClusterIPs retargets the pod's tunnels in place (same devices, new
// remote ends, routes back), and traffic flows through the new address.
func TestGuestClientServiceIPChange(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	cfg := gateway(false, "0.0.0.0/0", "198.51.100.0/24", "::/0")
	cfg.Gateways[0].ServiceIPs = []netip.Addr{ip("10.96.0.77"), ip("fd00:96::77")} // the old Service
	if err := ApplyClient(tp.client.Path(), cfg); err != nil {
		t.Fatal(err)
	}
	old, err := ClientState(tp.client.Path())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateways[0].ServiceIPs = []netip.Addr{svc4, svc6}
	if err := ApplyClient(tp.client.Path(), cfg); err != nil {
		t.Fatalf("ApplyClient with the new ClusterIPs: %v", err)
	}
	st, err := ClientState(tp.client.Path())
	if err != nil {
		t.Fatal(err)
	}
	var remotes []netip.Addr
	for _, tn := range st.Tunnels {
		if !tn.FlowBased {
			remotes = append(remotes, tn.Remote)
		}
	}
	if len(st.Tunnels) != len(old.Tunnels) || !reflect.DeepEqual(remotes, []netip.Addr{svc4, svc6}) {
		t.Errorf("tunnels after the change: %+v, want remotes %s and %s", st.Tunnels, svc4, svc6)
	}
	// The rules are the same but for the ServiceIPs' own (PrioServiceIP),
	// which follow the new addresses.
	retarget := func(rs []RuleStatus) []RuleStatus {
		var out []RuleStatus
		for _, r := range rs {
			switch r.Dst {
			case pfx("10.96.0.77/32"):
				r.Dst = netip.PrefixFrom(svc4, 32)
			case pfx("fd00:96::77/128"):
				r.Dst = netip.PrefixFrom(svc6, 128)
			}
			out = append(out, r)
		}
		return out
	}
	if !reflect.DeepEqual(st.Routes, old.Routes) || !reflect.DeepEqual(st.Rules, retarget(old.Rules)) {
		t.Errorf("routes or rules changed with the ClusterIPs (beyond the ServiceIP rules):\n%+v\nwant\n%+v", st, old)
	}
	mustVia(t, tp, "tcp", ext4)
	mustVia(t, tp, "udp", far4)
	mustVia(t, tp, "tcp", ext6)
}

// TestGuestClientDestinationMoves: a destination two gateways list goes
// through the first; when that one stops listing it (or goes), the same
// apply hands the route to the other gateway.
func TestGuestClientDestinationMoves(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	a := Gateway{Namespace: "a", Name: "gw", ServiceIPs: []netip.Addr{ip("10.96.0.77"), ip("fd00:96::77")},
		Destinations: []netip.Prefix{pfx("198.51.100.0/24"), pfx("0.0.0.0/0"), pfx("2001:db8:fe::/64"), pfx("203.0.113.0/24")}}
	b := Gateway{Namespace: "b", Name: "gw", ServiceIPs: []netip.Addr{svc4, svc6},
		Destinations: []netip.Prefix{pfx("198.51.100.0/24"), pfx("0.0.0.0/0"), pfx("2001:db8:fe::/64")}}
	if err := ApplyClient(tp.client.Path(), ClientConfig{Gateways: []Gateway{a, b}}); err != nil {
		t.Fatal(err)
	}
	wantRoutes := func(want map[netip.Prefix]string) {
		t.Helper()
		st, err := ClientState(tp.client.Path())
		if err != nil {
			t.Fatal(err)
		}
		got := map[netip.Prefix]string{}
		for _, r := range st.Routes {
			got[r.Dst] = r.Device
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("routes %v, want %v", got, want)
		}
	}
	a4, a6 := clientTunnelName(false, "a", "gw"), clientTunnelName(true, "a", "gw")
	b4, b6 := clientTunnelName(false, "b", "gw"), clientTunnelName(true, "b", "gw")
	wantRoutes(map[netip.Prefix]string{pfx("198.51.100.0/24"): a4, pfx("0.0.0.0/0"): a4, pfx("2001:db8:fe::/64"): a6, pfx("203.0.113.0/24"): a4})

	// a keeps one destination of its own; the shared ones move to b.
	a.Destinations = []netip.Prefix{pfx("203.0.113.0/24")}
	if err := ApplyClient(tp.client.Path(), ClientConfig{Gateways: []Gateway{a, b}}); err != nil {
		t.Fatalf("the shared destinations moving from a to b: %v", err)
	}
	wantRoutes(map[netip.Prefix]string{pfx("198.51.100.0/24"): b4, pfx("0.0.0.0/0"): b4, pfx("2001:db8:fe::/64"): b6, pfx("203.0.113.0/24"): a4})
	mustVia(t, tp, "tcp", far4)
	mustVia(t, tp, "udp", far6)
	mustVia(t, tp, "tcp", ext4)

	// Back to a holding all, then a gone at once.
	a.Destinations = []netip.Prefix{pfx("198.51.100.0/24"), pfx("0.0.0.0/0"), pfx("2001:db8:fe::/64")}
	if err := ApplyClient(tp.client.Path(), ClientConfig{Gateways: []Gateway{a, b}}); err != nil {
		t.Fatal(err)
	}
	wantRoutes(map[netip.Prefix]string{pfx("198.51.100.0/24"): a4, pfx("0.0.0.0/0"): a4, pfx("2001:db8:fe::/64"): a6})
	if err := ApplyClient(tp.client.Path(), ClientConfig{Gateways: []Gateway{b}}); err != nil {
		t.Fatalf("gateway a gone, b taking its destinations: %v", err)
	}
	wantRoutes(map[netip.Prefix]string{pfx("198.51.100.0/24"): b4, pfx("0.0.0.0/0"): b4, pfx("2001:db8:fe::/64"): b6})
	mustVia(t, tp, "tcp", far4)
}

// TestGuestEgressQuietConnection: with the fixed source port, the node's
// conntrack entry of a pod's outer flow is what turns a router's packets
// into ones from the ClusterIP. Once it is gone (idle past the UDP
// timeout; flushed here) and the external server speaks first on a quiet
// connection, the router's packets reach the pod from the router's own
// address: the pod must take them (and its answers get through).
func TestGuestEgressQuietConnection(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	tp.setEndpoints(t, 0)
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []netip.Addr{ext4, ext6} {
		var ln net.Listener
		if err := tp.ext.Do(func() error { var err error; ln, err = net.Listen("tcp", ":7040"); return err }); err != nil {
			t.Fatal(err)
		}
		push := make(chan struct{})
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			b := []byte{0}
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			<-push
			_, _ = c.Write([]byte("push"))
			if _, err := io.ReadFull(c, b); err == nil {
				_, _ = c.Write([]byte("pong"))
			}
			_, _ = io.Copy(io.Discard, c)
		}()
		var c net.Conn
		err := tp.client.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(dst, 7040).String(), 5*time.Second)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("a")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // the server has read it, the ACK is back
		h, err := openHandle(tp.node.Path(), true)
		if err != nil {
			t.Fatal(err)
		}
		f := &netlink.ConntrackFilter{}
		_ = f.AddIP(netlink.ConntrackOrigSrcIP, ipOf(client4))
		_ = f.AddIP(netlink.ConntrackOrigDstIP, ipOf(svc4))
		fam := netlink.InetFamily(unix.AF_INET)
		if dst.Is6() {
			f = &netlink.ConntrackFilter{}
			_ = f.AddIP(netlink.ConntrackOrigSrcIP, ipOf(client6))
			_ = f.AddIP(netlink.ConntrackOrigDstIP, ipOf(svc6))
			fam = unix.AF_INET6
		}
		if n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil || n != 1 {
			t.Fatalf("expire the pod's outer flow on the node: %d entries, %v", n, err)
		}
		h.Close()
		close(push)
		b := make([]byte, 4)
		_ = c.SetDeadline(time.Now().Add(8 * time.Second))
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "push" {
			t.Errorf("%s: the server's data after the node's entry expired: %q, %v", dst, b, err)
		} else if _, err := c.Write([]byte("b")); err != nil {
			t.Errorf("%s: %v", dst, err)
		} else if _, err := io.ReadFull(c, b); err != nil || string(b) != "pong" {
			t.Errorf("%s: the answer to the pod's next request: %q, %v", dst, b, err)
		}
		c.Close()
		ln.Close()
	}
}

// TestGuestRouterUntaggedLeftover: a router that died between creating a
// peer's tunnel and tagging it leaves an untagged device of that name; the
// next NewRouter clears it, so the peer is not refused for good, and
// leaves a foreign device of another shape alone.
func TestGuestRouterUntaggedLeftover(t *testing.T) {
	requireTunnels(t)
	node, rns := harness.NewNS(t, "egnode"), harness.NewNS(t, "egrouter")
	plugPod(t, node, rns, "vleft", router4[0], router6[0])
	h, err := openHandle(rns.Path(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r0, err := NewRouter(RouterConfig{NetNS: rns.Path(), Local4: router4[0], Local6: router6[0]})
	if err != nil {
		t.Fatal(err)
	}
	_ = r0 // dies without Close
	for _, p := range []netip.Addr{client4, client6} {
		name := routerName6(p, 0)
		if p.Is4() {
			name = routerName4(p)
		}
		tn := (&Router{cfg: RouterConfig{Port: DefaultPort, Local4: router4[0], Local6: router6[0]}}).tunnelFor(p, name)
		tn.alias = "" // created, not tagged yet
		if err := h.LinkAdd(tn.link()); err != nil {
			t.Fatalf("the untagged leftover %s: %v", tn.name, err)
		}
	}
	// A foreign device with our prefix but not a peer's name shape.
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "egc4-mine"}, PeerName: "egc4-minepeer"}); err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(RouterConfig{NetNS: rns.Path(), Local4: router4[0], Local6: router6[0]})
	if err != nil {
		t.Fatalf("NewRouter over untagged leftovers: %v", err)
	}
	defer r.Close()
	if err := r.SyncPeers([]netip.Addr{client4, client6}); err != nil {
		t.Fatalf("SyncPeers after untagged leftovers: %v", err)
	}
	if s, err := r.Stats(); err != nil || s.Tunnels != 2 || s.Peers != 2 {
		t.Errorf("stats %+v, %v; want 2 tunnels and 2 peers", s, err)
	}
	if _, err := h.LinkByName("egc4-mine"); err != nil {
		t.Errorf("the foreign device egc4-mine: %v, want it left alone", err)
	}
}

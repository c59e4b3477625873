package egress

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/skeinnet/skein/test/harness"
)

// Non-private cluster addresses: a Service range in CGNAT space and a
// global IPv6 one, as some clusters have.
var (
	cgnatSvc4  = ip("100.96.0.50")
	globalSvc6 = ip("2001:db8:96::50")
)

// TestGuestEgressNonPrivateService: with ClusterIPs outside the private
// ranges and a default route through the gateway, the tunnel's own FoU
// packets to the ClusterIP must stay on main (the PrioInCluster rule);
// traffic leaves SNAT'd through a router. Without the rule they would
// fall into table 118, into the tunnel again, and be dropped.
func TestGuestEgressNonPrivateService(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	tp.svc4, tp.svc6 = cgnatSvc4, globalSvc6
	tp.setEndpoints(t, 0, 1)
	cfg := ClientConfig{Gateways: []Gateway{{Namespace: "default", Name: "egress",
		ServiceIPs: []netip.Addr{cgnatSvc4, globalSvc6}, Destinations: []netip.Prefix{pfx("0.0.0.0/0"), pfx("::/0")}}}}
	if err := ApplyClient(tp.client.Path(), cfg); err != nil {
		t.Fatalf("ApplyClient: %v", err)
	}
	for _, dst := range []netip.Addr{ext4, ext6} {
		for _, proto := range []string{"tcp", "udp"} {
			mustVia(t, tp, proto, dst)
		}
	}
	st, err := ClientState(tp.client.Path())
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range st.Tunnels {
		if !tn.FlowBased && tn.Local != client4 && tn.Local != client6 {
			t.Errorf("tunnel %s: local %s, want the pod's own address", tn.Device, tn.Local)
		}
	}
	// The rule is what makes it work: without it the IPv4 tunnel's
	// packets loop and nothing gets through.
	h, err := openHandle(tp.client.Path(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r := rule{prio: PrioServiceIP, dst: netip.PrefixFrom(cgnatSvc4, 32), table: tableMain}
	if err := h.RuleDel(r.nl()); err != nil {
		t.Fatalf("delete the ServiceIP rule: %v", err)
	}
	if got, err := seenFrom(tp.client, "udp", ext4); err == nil {
		t.Errorf("without the ServiceIP rule the server still answered (saw %s): the test cannot tell", got)
	}
	// The next apply puts it back, and traffic flows again.
	if err := ApplyClient(tp.client.Path(), cfg); err != nil {
		t.Fatalf("ApplyClient again: %v", err)
	}
	mustVia(t, tp, "udp", ext4)
	if err := ApplyClient(tp.client.Path(), ClientConfig{}); err != nil {
		t.Fatal(err)
	}
	if st, err := ClientState(tp.client.Path()); err != nil || !st.Empty() {
		t.Errorf("after the zero configuration: %+v, %v", st, err)
	}
}

// serveSource starts in ns a TCP server on tcpPort that answers each
// request with the source address it sees.
func serveSource(t *testing.T, ns *harness.NS) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() error { var err error; ln, err = net.Listen("tcp", fmt.Sprintf(":%d", tcpPort)); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b := make([]byte, 1)
			if _, err := c.Read(b); err == nil {
				_, _ = io.WriteString(c, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().String())
			}
			c.Close()
		}
	}()
}

// TestGuestEgressInClusterPool: a pod pool in 100.64.0.0/16 (and a global
// IPv6 one), a default route through the gateway: with the pools as
// InCluster the client reaches another pod of the pool directly (that pod
// sees the client's own address) while external traffic still goes
// through a router. Without them the pod traffic would leave SNAT'd.
func TestGuestEgressInClusterPool(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	c4, c6 := ip("100.64.0.10"), ip("2001:db8:64::10")
	o4, o6 := ip("100.64.0.11"), ip("2001:db8:64::11")
	client := harness.NewNS(t, "egpoolc")
	other := harness.NewNS(t, "egpoolo")
	plugPod(t, tp.node, client, "vpoolc", c4, c6)
	plugPod(t, tp.node, other, "vpoolo", o4, o6)
	for i, r := range tp.r {
		if err := r.SyncPeers([]netip.Addr{client4, client6, c4, c6}); err != nil {
			t.Fatalf("SyncPeers %d: %v", i+1, err)
		}
	}
	serveSource(t, other)
	pools := []netip.Prefix{pfx("100.64.0.0/16"), pfx("2001:db8:64::/64")}
	cfg := gateway(false, "0.0.0.0/0", "::/0")
	apply := func(in []netip.Prefix) {
		t.Helper()
		cfg.InCluster = in
		if err := ApplyClient(client.Path(), cfg); err != nil {
			t.Fatalf("ApplyClient (in-cluster %v): %v", in, err)
		}
	}
	seen := func(dst netip.Addr) string {
		t.Helper()
		got, err := seenFrom(client, "tcp", dst)
		if err != nil {
			t.Fatalf("to the other pod: %v", err)
		}
		return got
	}
	// Without the pools the other pod is reached through a router: the
	// test can tell.
	apply(nil)
	for _, dst := range []netip.Addr{o4, o6} {
		if got := seen(dst); routerOf(got) < 0 {
			t.Errorf("without in-cluster networks, %s saw %s, want a router's address", dst, got)
		}
	}
	apply(pools)
	for dst, want := range map[netip.Addr]netip.Addr{o4: c4, o6: c6} {
		if got := seen(dst); got != want.String() {
			t.Errorf("to the other pod %s: it saw %s, want the client's own %s", dst, got, want)
		}
	}
	for _, dst := range []netip.Addr{ext4, ext6} {
		got, err := seenFrom(client, "tcp", dst)
		if err != nil {
			t.Fatalf("external: %v", err)
		}
		if routerOf(got) < 0 {
			t.Errorf("to %s: the server saw %s, want a router's address", dst, got)
		}
	}
	st, err := ClientState(client.Path())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools {
		r := RuleStatus{Priority: PrioInCluster, IPv6: p.Addr().Is6(), Dst: p, Table: tableMain}
		if !slices.Contains(st.Rules, r) {
			t.Errorf("rules %+v lack %+v", st.Rules, r)
		}
	}
	// Dropping the pools removes their rules and nothing else.
	apply(nil)
	if after, err := ClientState(client.Path()); err != nil || len(after.Rules) != len(st.Rules)-len(pools) {
		t.Errorf("rules after dropping the pools: %+v, %v", after.Rules, err)
	}
	if err := ApplyClient(client.Path(), ClientConfig{}); err != nil {
		t.Fatal(err)
	}
	if st, err := ClientState(client.Path()); err != nil || !st.Empty() {
		t.Errorf("after the zero configuration: %+v, %v", st, err)
	}
}

// TestGuestEgressDestinationCoversService: an Egress whose destinations
// cover its own Service range (here the CGNAT range of the ClusterIP)
// still carries traffic. Table 117 routes the range into the tunnel, so
// the tunnel's own FoU packets to the ClusterIP must reach main before
// it: the ServiceIP rule sits at PrioServiceIP, before PrioNarrow. At its
// old place (after 117) they looped into their own tunnel and the gateway
// carried nothing.
func TestGuestEgressDestinationCoversService(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	tp.svc4, tp.svc6 = cgnatSvc4, globalSvc6
	tp.setEndpoints(t, 0, 1)
	cfg := ClientConfig{Gateways: []Gateway{{Namespace: "default", Name: "egress",
		ServiceIPs:   []netip.Addr{cgnatSvc4},
		Destinations: []netip.Prefix{pfx("100.96.0.0/16"), netip.PrefixFrom(ext4, 32)}}}}
	if err := ApplyClient(tp.client.Path(), cfg); err != nil {
		t.Fatalf("ApplyClient: %v", err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		mustVia(t, tp, proto, ext4)
	}
}

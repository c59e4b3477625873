package egress

import (
	"net/netip"
	"testing"
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
	r := rule{prio: PrioInCluster, dst: netip.PrefixFrom(cgnatSvc4, 32), table: tableMain}
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

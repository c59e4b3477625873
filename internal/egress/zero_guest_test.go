package egress

import (
	"net/netip"
	"testing"
)

// TestGuestApplyClientZeroLeavesRouter: skeind applies the zero
// configuration to running pods that name no Egress (after a restart, to
// clear tunnels left while it was down), router pods among them. A
// router's FoU ports are NewRouter's, not the client's: the zero
// configuration must leave them, and the router keeps working.
func TestGuestApplyClientZeroLeavesRouter(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatalf("ApplyClient: %v", err)
	}
	for _, dst := range []netip.Addr{ext4, ext6} {
		mustVia(t, tp, "udp", dst)
	}
	for i, r := range tp.routers {
		if err := ApplyClient(r.Path(), ClientConfig{}); err != nil {
			t.Fatalf("ApplyClient(zero) in router %d: %v", i+1, err)
		}
		h, err := openHandle(r.Path(), false)
		if err != nil {
			t.Fatal(err)
		}
		fous, err := listFoU(h)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !fous[fouPort{port: DefaultPort}] || !fous[fouPort{v6: true, port: DefaultPort}] {
			t.Errorf("router %d's FoU ports after the zero client configuration: %v, want port %d of both families", i+1, fous, DefaultPort)
		}
	}
	for _, dst := range []netip.Addr{ext4, ext6} {
		for _, proto := range []string{"tcp", "udp"} {
			mustVia(t, tp, proto, dst)
		}
	}
}

package routebench

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
)

// The node namespaces come from harness.NewTopology: one bridge, each
// node's eth0 on 172.31.0.0/24. A /24 cannot hold a thousand simulated
// nodes, so the convergence benchmark gives the same segment a second
// on-link prefix, simUnderlay, on every real node (a scope-link route on
// eth0, as a node on a larger subnet has): the simulated nodes' InternalIPs
// lie in it, directly reachable for direct mode, VXLAN peers for vxlan
// mode. No namespace holds those addresses; no traffic goes to them.
var simUnderlay = netip.MustParsePrefix("10.99.0.0/16")

// addSimUnderlay adds the on-link route of simUnderlay to n.
func addSimUnderlay(t testing.TB, n *harness.TopoNode) {
	t.Helper()
	h := n.Handle(t)
	eth0, err := h.LinkByName(harness.UnderlayDev)
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: simUnderlay.Addr().AsSlice(), Mask: net.CIDRMask(simUnderlay.Bits(), 32)}}
	if err := h.RouteAdd(r); err != nil {
		t.Fatalf("route %s dev %s in %s: %v", simUnderlay, harness.UnderlayDev, n.Name(), err)
	}
}

// simAddr is the i-th address of simUnderlay (i from 0; .0 and .255 of
// each /24 skipped).
func simAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 99, byte(i / 254), byte(i%254 + 1)})
}

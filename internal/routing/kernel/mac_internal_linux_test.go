package kernel

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/routing"
)

// TestVXLANMACCollision: MACFor is a 46-bit hash, so a node can search for
// an address whose MAC is another node's (or this node's). Two peers
// sharing a MAC would share one FDB entry, and one would draw the other's
// traffic: neither is routed, and the others are. (No two addresses are
// known to collide; the test makes two.)
func TestVXLANMACCollision(t *testing.T) {
	local, victim, attacker, bystander := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"),
		netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4")
	mimic := netip.MustParseAddr("192.0.2.5") // collides with this node
	defer func(f func(netip.Addr) net.HardwareAddr) { vxlanMAC = f }(vxlanMAC)
	vxlanMAC = func(a netip.Addr) net.HardwareAddr {
		switch a {
		case attacker:
			return MACFor(victim)
		case mimic:
			return MACFor(local)
		}
		return MACFor(a)
	}
	remote := func(block, node string, a netip.Addr) routing.Remote {
		return routing.Remote{Block: netip.MustParsePrefix(block), Name: node + "-b", Node: node, NodeAddrs: []netip.Addr{a}}
	}
	remotes := []routing.Remote{remote("10.10.2.0/24", "victim", victim), remote("10.10.3.0/24", "attacker", attacker),
		remote("10.10.4.0/24", "bystander", bystander), remote("10.10.5.0/24", "mimic", mimic)}
	k := &Kernel{cfg: KernelConfig{Table: routing.DefaultTable}}
	plan := k.planVXLAN(remotes, tableState{}, local, 7)
	for _, st := range plan.out {
		routed := plan.route[st.Block] != nil
		if want := st.Node == "bystander"; routed != want || (!want && !strings.Contains(st.Reason, "VXLAN MAC")) {
			t.Errorf("%s (%s): routed %v, reason %q", st.Node, st.Block, routed, st.Reason)
		}
	}
	if len(plan.fdb) != 1 {
		t.Errorf("fdb %v, want the bystander's entry alone", plan.fdb)
	}
}

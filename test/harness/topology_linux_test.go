package harness_test

import (
	"net/netip"
	"testing"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// TestTopologyBridge: on one bridge every node reaches every other
// directly, both families, and the kernel resolves each peer on the
// underlay link without a gateway.
func TestTopologyBridge(t *testing.T) {
	harness.RequireRoot(t)
	before := harness.HostNet(t)
	var paths []string
	t.Run("inner", func(t *testing.T) {
		topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 3})
		if len(topo.Nodes) != 3 || len(topo.Switches) != 1 || topo.Router != nil {
			t.Fatalf("%d nodes, %d switches, router %v: want 3, 1, none", len(topo.Nodes), len(topo.Switches), topo.Router)
		}
		for _, n := range append([]*harness.NS{topo.Switches[0]}, nodesNS(topo)...) {
			paths = append(paths, n.Path())
		}
		for _, from := range topo.Nodes {
			for _, to := range topo.Nodes {
				if from == to {
					continue
				}
				for _, a := range to.Addrs() {
					if err := pingRetry(t, from.NS, a); err != nil {
						t.Errorf("node %d -> node %d: %v", from.Index, to.Index, err)
					}
					if gw := gateway(t, from.NS, a); gw.IsValid() {
						t.Errorf("node %d reaches %s via %s, want directly", from.Index, a, gw)
					}
				}
			}
		}
	})
	for _, p := range paths {
		if err := netns.IsNetNS(p); err == nil {
			t.Errorf("%s still exists after the test", p)
		}
	}
	harness.AssertHostSame(t, before, "after a topology came and went")
}

// TestTopologyRouted: two subnets joined by the router; nodes of different
// subnets reach each other through it (a gateway), nodes of one subnet
// directly.
func TestTopologyRouted(t *testing.T) {
	harness.RequireRoot(t)
	topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 3, Subnets: 2})
	if topo.Router == nil || len(topo.Switches) != 2 {
		t.Fatalf("router %v, %d switches: want a router and 2", topo.Router, len(topo.Switches))
	}
	subnets := []int{topo.Nodes[0].Subnet, topo.Nodes[1].Subnet, topo.Nodes[2].Subnet}
	if subnets[0] != 0 || subnets[2] != 1 {
		t.Fatalf("subnets of the nodes %v: want the first on 0, the last on 1", subnets)
	}
	for _, from := range topo.Nodes {
		for _, to := range topo.Nodes {
			if from == to {
				continue
			}
			for fam, a := range to.Addrs() {
				if !topo.Subnets4[to.Subnet].Contains(to.Addr4) || !topo.Subnets6[to.Subnet].Contains(to.Addr6) {
					t.Errorf("node %d's addresses %v are not on subnet %d", to.Index, to.Addrs(), to.Subnet)
				}
				if err := pingRetry(t, from.NS, a); err != nil {
					t.Errorf("node %d -> node %d: %v", from.Index, to.Index, err)
				}
				gw := gateway(t, from.NS, a)
				want := netip.Addr{}
				if from.Subnet != to.Subnet {
					want = topo.RouterAddrs[from.Subnet][fam]
				}
				if gw != want {
					t.Errorf("node %d reaches %s via %v, want %v", from.Index, a, gw, want)
				}
			}
		}
	}
}

func nodesNS(topo *harness.Topology) []*harness.NS {
	var out []*harness.NS
	for _, n := range topo.Nodes {
		out = append(out, n.NS)
	}
	return out
}

// gateway is the next hop the kernel of ns picks for dst (invalid when
// dst is on a connected network).
func gateway(t *testing.T, ns *harness.NS, dst netip.Addr) netip.Addr {
	t.Helper()
	routes, err := ns.Handle(t).RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		t.Fatalf("route get %s in %s: %v", dst, ns.Name(), err)
	}
	gw, _ := netip.AddrFromSlice(routes[0].Gw)
	return gw.Unmap()
}

// pingRetry pings up to three times: a packet that finds no neighbour
// entry yet on some hop may be dropped.
func pingRetry(t *testing.T, ns *harness.NS, a netip.Addr) error {
	var err error
	for range 3 {
		if err = harness.Ping(t, ns, a); err == nil {
			return nil
		}
		t.Logf("ping %s from %s: %v (retrying)", a, ns.Name(), err)
	}
	return err
}

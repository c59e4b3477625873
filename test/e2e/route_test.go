package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// routeWait bounds the waits for routes to converge: seconds are expected,
// this is for a loaded two-core machine.
const routeWait = 30 * time.Second

// rtprotBird is the route protocol BIRD tags its kernel routes with.
const rtprotBird = 12

// routeDesc describes a route in one line for messages.
func routeDesc(r netlink.Route) string {
	gw := ""
	switch {
	case r.Gw != nil:
		gw = " via " + r.Gw.String()
	case r.Via != nil:
		gw = " via " + r.Via.String()
	}
	return fmt.Sprintf("%s%s dev#%d proto %d table %d type %d", harness.RouteDst(r), gw, r.LinkIndex, r.Protocol, r.Table, r.Type)
}

// routesByDst indexes routes by destination (the last one wins).
func routesByDst(routes []netlink.Route) map[netip.Prefix]netlink.Route {
	m := map[netip.Prefix]netlink.Route{}
	for _, r := range routes {
		m[harness.RouteDst(r)] = r
	}
	return m
}

// gwOf returns a route's next hop (gateway or RTA_VIA), invalid if none.
func gwOf(r netlink.Route) netip.Addr {
	var a netip.Addr
	switch {
	case r.Gw != nil:
		a, _ = netip.AddrFromSlice(r.Gw)
	case r.Via != nil:
		if v, ok := r.Via.(*netlink.Via); ok {
			a, _ = netip.AddrFromSlice(v.Addr)
		}
	}
	return a.Unmap()
}

// pingAll pings, from every pod, every pod of another node on both
// families, in parallel per source pod, and returns what failed.
func pingAll(t *testing.T, pods []*kubenode.Pod) []string {
	t.Helper()
	var (
		mu     sync.Mutex
		failed []string
		wg     sync.WaitGroup
	)
	for _, from := range pods {
		wg.Go(func() {
			for _, to := range pods {
				if to.Node == from.Node {
					continue
				}
				for _, v6 := range []bool{false, true} {
					a := to.Addr(v6)
					if err := ping(t, from.NS, a); err != nil {
						mu.Lock()
						failed = append(failed, fmt.Sprintf("%s on %s -> %s on %s (%s): %v", from.RT.ContainerID, from.Node.Name, to.RT.ContainerID, to.Node.Name, a, err))
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(failed)
	return failed
}

// TestRouteExportBIRD proves export mode with a real routing daemon: three
// node namespaces on one underlay bridge, each with a real skeind
// --store kubernetes (the default --routing export) against the real API
// server and a real BIRD 2 (testdata/bird.conf) that learns the node's
// blocks from table 119 and exchanges them over eBGP, both families. Pods
// on different nodes ping each other over the routes BIRD installed; a
// block claimed on one node reaches the others' kernels, and once freed
// disappears from them while the rest stays.
func TestRouteExportBIRD(t *testing.T) {
	harness.RequireRoot(t)
	skeintest.RequireTool(t, "bird")
	skeintest.RequireTool(t, "birdc")
	topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 3})
	name := func(i int) string { return fmt.Sprintf("bird-n%d", i+1) }
	cl := kubenode.StartCluster(t, kubenode.ClusterOptions{Topology: topo, NodeName: name,
		Pools: []skeinv1.AddressPool{kubenode.DefaultPool, teamPool},
		Args:  func(*harness.TopoNode) []string { return []string{"--block-min-age", "1s"} }})
	createTeamNS(t, cl)

	// BIRD on every node, each its own AS, a session per peer and family.
	self := func(i int) birdNode {
		n := topo.Nodes[i]
		b4, b6 := blockPatterns(kubenode.DefaultPool, teamPool)
		return birdNode{Name: strings.ReplaceAll(name(i), "-", "_"), AS: 65001 + i, RouterID: n.Addr4, Addr4: n.Addr4, Addr6: n.Addr6,
			Blocks4: b4, Blocks6: b6}
	}
	for i, n := range topo.Nodes {
		b := self(i)
		for j := range topo.Nodes {
			if j != i {
				b.Peers = append(b.Peers, self(j))
			}
		}
		startBird(t, n.NS, b)
	}

	// One pod per node: each node gets a dual-stack block of its own.
	var pods []*kubenode.Pod
	for i, n := range cl.Nodes {
		p := n.MustAddPod(t, "default", fmt.Sprintf("pod-%d", i+1))
		if !p.Addr(false).IsValid() || !p.Addr(true).IsValid() {
			t.Fatalf("pod on %s has addresses %v, want one of each family", n.Name, p.Addrs)
		}
		pods = append(pods, p)
	}
	blocks := map[string][]netip.Prefix{} // node name -> its block prefixes
	for _, n := range cl.Nodes {
		for _, b := range cl.Blocks(t, n.Name) {
			blocks[n.Name] = append(blocks[n.Name], kubenode.Prefixes(&b)...)
		}
		if len(blocks[n.Name]) != 2 {
			t.Fatalf("node %s's blocks %v: want one dual-stack block", n.Name, blocks[n.Name])
		}
	}

	// Every node's main table holds every other node's blocks, installed
	// by BIRD, via that node's underlay address.
	waitPeerRoutes := func(what string, want func(i, j int) []netip.Prefix, gone []netip.Prefix) {
		t.Helper()
		kubenode.Eventually(t, routeWait, what, func() string {
			var problems []string
			for i, n := range topo.Nodes {
				main := routesByDst(n.TableRoutes(t, unix.RT_TABLE_MAIN))
				for j, peer := range topo.Nodes {
					if j == i {
						continue
					}
					for _, p := range want(i, j) {
						r, ok := main[p]
						switch {
						case !ok:
							problems = append(problems, fmt.Sprintf("%s has no route to %s (of %s)", name(i), p, name(j)))
						case r.Protocol != rtprotBird:
							problems = append(problems, fmt.Sprintf("%s: %s, want proto bird", name(i), routeDesc(r)))
						case p.Addr().Is4() && gwOf(r) != peer.Addr4,
							p.Addr().Is6() && gwOf(r) != peer.Addr6 && !gwOf(r).IsLinkLocalUnicast():
							problems = append(problems, fmt.Sprintf("%s: %s, want via %s's underlay address", name(i), routeDesc(r), name(j)))
						}
					}
				}
				for _, p := range gone {
					if r, ok := main[p]; ok {
						problems = append(problems, fmt.Sprintf("%s still has %s", name(i), routeDesc(r)))
					}
				}
			}
			if len(problems) > 0 {
				return strings.Join(problems, "; ")
			}
			return ""
		})
	}
	began := time.Now()
	waitPeerRoutes("BIRD's routes to the other nodes' blocks", func(_, j int) []netip.Prefix { return blocks[name(j)] }, nil)
	t.Logf("routes to every other node's blocks on every node after %v", time.Since(began).Round(time.Millisecond))

	if failed := pingAll(t, pods); len(failed) > 0 {
		t.Fatalf("pod to pod across nodes over BIRD's routes:\n%s", strings.Join(failed, "\n"))
	}

	// A pod of pool team on the third node: its new block reaches the
	// other nodes' kernels.
	team := cl.Nodes[2].MustAddPod(t, teamNS, "team-pod")
	var freed []netip.Prefix
	for _, b := range blocksOfPool(t, cl, name(2), teamPool.Name) {
		freed = append(freed, kubenode.Prefixes(&b)...)
	}
	if len(freed) != 2 {
		t.Fatalf("node %s's blocks of pool team %v: want one dual-stack block", name(2), freed)
	}
	waitPeerRoutes("BIRD's routes to the new block", func(_, j int) []netip.Prefix {
		if j == 2 {
			return append(slices.Clone(blocks[name(j)]), freed...)
		}
		return blocks[name(j)]
	}, nil)

	// It goes; its block is freed (after --block-min-age) and withdrawn:
	// gone from the API, from its node's table 119 and from the other
	// nodes' kernels, while their routes to each other stay.
	if err := team.Del(t); err != nil {
		t.Fatal(err)
	}
	kubenode.Eventually(t, routeWait, "the emptied block of pool team given back", func() string {
		if bl := blocksOfPool(t, cl, name(2), teamPool.Name); len(bl) != 0 {
			return fmt.Sprintf("%s still owns %s after its last pod was deleted", name(2), bl[0].Name)
		}
		return ""
	})
	kubenode.Eventually(t, routeWait, "the freed block gone from its node's export table", func() string {
		for _, r := range topo.Nodes[2].TableRoutes(t, skeintest.ExportTable) {
			if slices.Contains(freed, harness.RouteDst(r)) {
				return routeDesc(r)
			}
		}
		return ""
	})
	began = time.Now()
	waitPeerRoutes("the freed block withdrawn from the other nodes", func(_, j int) []netip.Prefix { return blocks[name(j)] }, freed)
	t.Logf("the freed block left the other nodes' kernels %v after its node's export table", time.Since(began).Round(time.Millisecond))

	// skeind reports BIRD's routes: every remote block installed, the
	// freed one no longer listed. skeind looks at the kernel when it syncs
	// — on a change of the API's blocks or nodes (here: the freed block),
	// and at its periodic resync (30 s) — so this is checked after a
	// change that followed BIRD's routes.
	rc := newRouteCluster(t, cl, routing.ModeExport, false)
	var names []string
	for _, n := range cl.Nodes {
		names = append(names, n.Name)
	}
	rc.converged(t, "skeind reporting BIRD's routes", names, everyone)
	if failed := pingAll(t, pods); len(failed) > 0 {
		t.Errorf("pod to pod across nodes after a block was freed:\n%s", strings.Join(failed, "\n"))
	}
}

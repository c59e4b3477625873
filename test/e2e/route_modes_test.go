package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/skeinnet/skein/api/rpc"
	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
	"github.com/skeinnet/skein/test/cluster"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
)

// routeCluster is a kubenode.Cluster whose skeinds route between nodes in
// one mode, with what the tests need to tell wanted from actual kernel
// state.
type routeCluster struct {
	*kubenode.Cluster
	mode routing.Mode
	// underlay6: the nodes' address (--node-address) is their IPv6 one.
	underlay6 bool
	admin     map[string]rpc.AdminClient
	topo      map[string]*harness.TopoNode // by node name
}

// startRouteCluster starts a cluster on topo whose skeinds run with
// --routing mode (and --node-address <IPv6 underlay address> when
// underlay6).
func startRouteCluster(t *testing.T, topo *harness.Topology, prefix string, mode routing.Mode, underlay6 bool, extra ...string) *routeCluster {
	t.Helper()
	name := func(i int) string { return fmt.Sprintf("%s-n%d", prefix, i+1) }
	cl := kubenode.StartCluster(t, kubenode.ClusterOptions{Topology: topo, NodeName: name,
		Pools: []skeinv1.AddressPool{kubenode.DefaultPool, teamPool},
		Args: func(n *harness.TopoNode) []string {
			args := append([]string{"--routing", string(mode)}, extra...)
			if underlay6 {
				args = append(args, "--node-address", n.Addr6.String())
			}
			return args
		}})
	createTeamNS(t, cl)
	return newRouteCluster(t, cl, mode, underlay6)
}

// teamPool is a second dual-stack pool, of the pods of namespace team
// (teamNS). A node keeps a spare block of the default pool even with no
// pod of it, but gives its block of teamPool back once the last pod of it
// has gone for --block-min-age: the tests free blocks through it.
var teamPool = skeinv1.AddressPool{
	ObjectMeta: metav1.ObjectMeta{Name: "team"},
	Spec: skeinv1.AddressPoolSpec{
		Subnets:       []skeinv1.SubnetSet{{IPv4: ptr.To("10.131.0.0/24"), IPv6: ptr.To("fd00:131::/120")}},
		BlockSizeBits: 3,
	},
}

const teamNS = "team"

// createTeamNS creates namespace team, whose pods are in teamPool.
func createTeamNS(t *testing.T, cl *kubenode.Cluster) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamNS, Annotations: map[string]string{skeinv1.AnnotationPool: teamPool.Name}}}
	if err := cl.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

// blocksOfPool returns the blocks of pool that node owns.
func blocksOfPool(t *testing.T, cl *kubenode.Cluster, node, pool string) []skeinv1.AddressBlock {
	t.Helper()
	var out []skeinv1.AddressBlock
	for _, b := range cl.Blocks(t, node) {
		if b.Labels[skeinv1.LabelPool] == pool {
			out = append(out, b)
		}
	}
	return out
}

// newRouteCluster wraps a running cluster whose skeinds route in mode.
func newRouteCluster(t *testing.T, cl *kubenode.Cluster, mode routing.Mode, underlay6 bool) *routeCluster {
	t.Helper()
	rc := &routeCluster{Cluster: cl, mode: mode, underlay6: underlay6, admin: map[string]rpc.AdminClient{}, topo: map[string]*harness.TopoNode{}}
	for i, n := range cl.Nodes {
		rc.admin[n.Name] = n.D.Admin(t)
		rc.topo[n.Name] = cl.Topology.Nodes[i]
	}
	return rc
}

// remote returns the prefixes of every block of a node other than self,
// with their owner, from the API.
func (rc *routeCluster) remote(t *testing.T, self string) map[netip.Prefix]string {
	t.Helper()
	out := map[netip.Prefix]string{}
	for _, b := range rc.Blocks(t, "") {
		if owner := b.Labels["skein.dev/node"]; owner != self {
			for _, p := range kubenode.Prefixes(&b) {
				out[p] = owner
			}
		}
	}
	return out
}

// nodeAddr is the address of node owner that routes of family v6 use:
// its address of that family in direct mode, its underlay address in
// vxlan mode.
func (rc *routeCluster) nodeAddr(owner string, v6 bool) netip.Addr {
	n := rc.topo[owner]
	if rc.mode == routing.ModeVXLAN {
		return n.Addr(rc.underlay6)
	}
	return n.Addr(v6)
}

// tableProblems compares node self's table 120 (routes of protocol 32)
// with the wanted set: one route per remote block in reach(owner) (every
// other block must have none), via the owner's address (direct) or
// through the VXLAN device with a permanent neighbour entry for the block
// and an FDB entry for its node, and no other permanent neighbour or FDB
// entry on the device (vxlan); none at all in export mode.
// Routes of other protocols in the table are left out. It returns what
// differs.
func (rc *routeCluster) tableProblems(t *testing.T, self string, reach func(owner string) bool) []string {
	t.Helper()
	ns := rc.topo[self].NS
	h, closeH, err := netns.Handle(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer closeH()
	var problems []string
	have := map[netip.Prefix]netlink.Route{}
	for _, r := range ns.TableRoutes(t, routing.DefaultTable) {
		if r.Protocol != routing.DefaultProtocol {
			continue
		}
		p := harness.RouteDst(r)
		if _, dup := have[p]; dup {
			problems = append(problems, fmt.Sprintf("%s: two routes to %s", self, p))
		}
		have[p] = r
	}
	var vx netlink.Link
	var neigh map[netip.Addr]netlink.Neigh
	var fdb map[string]netip.Addr
	if rc.mode == routing.ModeVXLAN {
		if vx, err = h.LinkByName(routing.DefaultVXLANDevice); err != nil {
			return append(problems, fmt.Sprintf("%s: no %s device: %v", self, routing.DefaultVXLANDevice, err))
		}
		neigh, fdb = map[netip.Addr]netlink.Neigh{}, map[string]netip.Addr{}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			l, err := h.NeighList(vx.Attrs().Index, fam)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range l {
				a, _ := netip.AddrFromSlice(n.IP)
				neigh[a.Unmap()] = n
			}
		}
		l, err := h.NeighList(vx.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range l {
			if a, ok := netip.AddrFromSlice(n.IP); ok && !bytes.Equal(n.HardwareAddr, make(net.HardwareAddr, 6)) {
				fdb[n.HardwareAddr.String()] = a.Unmap()
			}
		}
	}
	wanted := rc.remote(t, self)
	if rc.mode == routing.ModeExport {
		wanted = nil // export mode installs nothing of its own
	}
	peers := map[string]bool{} // FDB entries wanted, by MAC
	for p, owner := range wanted {
		r, ok := have[p]
		delete(have, p)
		if !reach(owner) {
			if ok {
				problems = append(problems, fmt.Sprintf("%s routes %s of unreachable %s: %s", self, p, owner, routeDesc(r)))
			}
			continue
		}
		if !ok {
			problems = append(problems, fmt.Sprintf("%s has no route to %s (of %s)", self, p, owner))
			continue
		}
		peer := rc.nodeAddr(owner, p.Addr().Is6())
		switch rc.mode {
		case routing.ModeDirect:
			if gwOf(r) != peer {
				problems = append(problems, fmt.Sprintf("%s: %s, want via %s", self, routeDesc(r), peer))
			}
		case routing.ModeVXLAN:
			if r.LinkIndex != vx.Attrs().Index || gwOf(r) != p.Addr() {
				problems = append(problems, fmt.Sprintf("%s: %s, want via %s dev %s", self, routeDesc(r), p.Addr(), routing.DefaultVXLANDevice))
			}
			mac := kernel.MACFor(peer)
			if n, ok := neigh[p.Addr()]; !ok || !bytes.Equal(n.HardwareAddr, mac) || n.State&netlink.NUD_PERMANENT == 0 {
				problems = append(problems, fmt.Sprintf("%s: neighbour %s on %s is %+v, want %s permanent", self, p.Addr(), routing.DefaultVXLANDevice, n, mac))
			}
			delete(neigh, p.Addr())
			if dst, ok := fdb[mac.String()]; !ok || dst != peer {
				problems = append(problems, fmt.Sprintf("%s: fdb entry of %s (%s) has destination %v, want %s", self, owner, mac, dst, peer))
			}
			peers[mac.String()] = true
		}
	}
	for _, r := range have {
		problems = append(problems, fmt.Sprintf("%s holds a stale route %s", self, routeDesc(r)))
	}
	// The rule sending lookups to the table: once per family, none in
	// export mode.
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := h.RuleList(fam)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range rules {
			if r.Table == routing.DefaultTable {
				n++
				if r.Priority != routing.DefaultRulePriority {
					problems = append(problems, fmt.Sprintf("%s: rule to table %d at priority %d, want %d", self, r.Table, r.Priority, routing.DefaultRulePriority))
				}
			}
		}
		want := 1
		if rc.mode == routing.ModeExport {
			want = 0
		}
		if n != want {
			problems = append(problems, fmt.Sprintf("%s: %d rules (family %d) to table %d, want %d", self, n, fam, routing.DefaultTable, want))
		}
	}
	for a, n := range neigh {
		if n.State&netlink.NUD_PERMANENT != 0 {
			problems = append(problems, fmt.Sprintf("%s holds a stale neighbour %s lladdr %s on %s", self, a, n.HardwareAddr, routing.DefaultVXLANDevice))
		}
	}
	for mac, dst := range fdb {
		if !peers[mac] {
			problems = append(problems, fmt.Sprintf("%s holds a stale fdb entry %s dst %s on %s", self, mac, dst, routing.DefaultVXLANDevice))
		}
	}
	slices.Sort(problems)
	return problems
}

// converged waits until every live node's table matches the API (see
// tableProblems) and skeind reports every remote block as installed or
// not as reach says.
func (rc *routeCluster) converged(t *testing.T, what string, live []string, reach func(self, owner string) bool) {
	t.Helper()
	rc.convergedWithin(t, routeWait, what, live, reach)
}

func (rc *routeCluster) convergedWithin(t *testing.T, within time.Duration, what string, live []string, reach func(self, owner string) bool) {
	t.Helper()
	kubenode.Eventually(t, within, what, func() string {
		var problems []string
		for _, self := range live {
			problems = append(problems, rc.tableProblems(t, self, func(owner string) bool { return reach(self, owner) })...)
			problems = append(problems, rc.statusProblems(t, self, func(owner string) bool { return reach(self, owner) })...)
		}
		return strings.Join(problems, "; ")
	})
}

// listRoutes asks node self's skeind for its routes.
func (rc *routeCluster) listRoutes(t *testing.T, self string) *rpc.RouteList {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := rc.admin[self].ListRoutes(ctx, &rpc.Empty{})
	if err != nil {
		t.Fatalf("ListRoutes on %s: %v", self, err)
	}
	return l
}

// statusProblems compares ListRoutes of node self with the API: every
// remote block listed once, in this mode, with its node, installed (via
// the owner's address) when reach(owner), else not installed with a
// reason.
func (rc *routeCluster) statusProblems(t *testing.T, self string, reach func(owner string) bool) []string {
	t.Helper()
	l := rc.listRoutes(t, self)
	var problems []string
	if !l.Synced || l.Mode != string(rc.mode) {
		problems = append(problems, fmt.Sprintf("%s: ListRoutes mode %q synced %v, want %q synced", self, l.Mode, l.Synced, rc.mode))
	}
	want := rc.remote(t, self)
	for _, r := range l.Routes {
		p, err := netip.ParsePrefix(r.Block)
		owner, ok := want[p]
		delete(want, p)
		switch {
		case err != nil || !ok:
			problems = append(problems, fmt.Sprintf("%s lists %s of %s, which is no remote block", self, r.Block, r.Node))
		case r.Node != owner || r.Mode != string(rc.mode):
			problems = append(problems, fmt.Sprintf("%s lists %s of %s in mode %s, want of %s in %s", self, r.Block, r.Node, r.Mode, owner, rc.mode))
		case reach(owner) && rc.mode == routing.ModeExport && !r.Installed:
			problems = append(problems, fmt.Sprintf("%s: %s of %s not installed (%s), want installed by the routing daemon", self, r.Block, owner, r.Reason))
		case reach(owner) && rc.mode != routing.ModeExport && (!r.Installed || r.Via != rc.nodeAddr(owner, p.Addr().Is6()).String()):
			problems = append(problems, fmt.Sprintf("%s: %s of %s installed=%v via %q (%s), want installed via %s",
				self, r.Block, owner, r.Installed, r.Via, r.Reason, rc.nodeAddr(owner, p.Addr().Is6())))
		case !reach(owner) && (r.Installed || r.Reason == ""):
			problems = append(problems, fmt.Sprintf("%s: %s of unreachable %s installed=%v reason %q, want not installed with a reason",
				self, r.Block, owner, r.Installed, r.Reason))
		}
	}
	for p, owner := range want {
		problems = append(problems, fmt.Sprintf("%s does not list %s of %s", self, p, owner))
	}
	return problems
}

// podMTU is the MTU of a pod's eth0.
func podMTU(t *testing.T, p *kubenode.Pod) int {
	t.Helper()
	l, err := p.NS.Handle(t).LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().MTU
}

func everyone(_, _ string) bool { return true }

// TestRouteModes: on one underlay bridge, direct and vxlan (IPv4 underlay,
// and IPv6 underlay by --node-address) each carry pod to pod traffic
// between three nodes in both families, every node holding exactly one
// route per remote block and skeind reporting each as installed; in vxlan
// mode the pod MTU leaves room for the encapsulation.
func TestRouteModes(t *testing.T) {
	harness.RequireRoot(t)
	for _, tc := range []struct {
		name      string
		mode      routing.Mode
		underlay6 bool
		mtu       int
	}{
		{"direct", routing.ModeDirect, false, 1500},
		{"vxlan", routing.ModeVXLAN, false, 1500 - routing.OverheadVXLAN4},
		{"vxlan-ipv6-underlay", routing.ModeVXLAN, true, 1500 - routing.OverheadVXLAN6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 3})
			rc := startRouteCluster(t, topo, "rm", tc.mode, tc.underlay6)
			var pods []*kubenode.Pod
			var names []string
			for i, n := range rc.Nodes {
				p := n.MustAddPod(t, "default", fmt.Sprintf("pod-%d", i+1))
				if !p.Addr(false).IsValid() || !p.Addr(true).IsValid() {
					t.Fatalf("pod on %s has addresses %v, want one of each family", n.Name, p.Addrs)
				}
				if got := podMTU(t, p); got != tc.mtu {
					t.Errorf("pod on %s has MTU %d, want %d", n.Name, got, tc.mtu)
				}
				pods = append(pods, p)
				names = append(names, n.Name)
			}
			began := time.Now()
			rc.converged(t, "routes to every remote block", names, everyone)
			t.Logf("%s: every node routes every remote block %v after the last ADD", tc.name, time.Since(began).Round(time.Millisecond))
			if failed := pingAll(t, pods); len(failed) > 0 {
				t.Errorf("pod to pod across nodes in %s mode:\n%s", tc.mode, strings.Join(failed, "\n"))
			}
			if got := rc.Nodes[0].Sample(t, "skein_route_unreachable_nodes"); got != "0" {
				t.Errorf("skein_route_unreachable_nodes on %s is %q, want 0", rc.Nodes[0].Name, got)
			}
		})
	}
}

// TestRouteRouted: two L3 subnets joined by a router (n1 and n2 on one,
// n3 on the other). vxlan carries pod traffic between all of them; direct
// routes between n1 and n2 only, and reports n3 (and, on n3, the others)
// as unreachable: no route, ListRoutes not installed with a reason, the
// skein_route_unreachable_nodes metric and a Warning event on the Node.
func TestRouteRouted(t *testing.T) {
	harness.RequireRoot(t)
	t.Run("vxlan", func(t *testing.T) {
		topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 3, Subnets: 2})
		rc := startRouteCluster(t, topo, "rv", routing.ModeVXLAN, false)
		var pods []*kubenode.Pod
		var names []string
		for i, n := range rc.Nodes {
			pods = append(pods, n.MustAddPod(t, "default", fmt.Sprintf("pod-%d", i+1)))
			names = append(names, n.Name)
		}
		rc.converged(t, "vxlan routes across the router", names, everyone)
		if failed := pingAll(t, pods); len(failed) > 0 {
			t.Errorf("pod to pod across a router in vxlan mode:\n%s", strings.Join(failed, "\n"))
		}
	})
	t.Run("direct", func(t *testing.T) {
		topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 3, Subnets: 2})
		rc := startRouteCluster(t, topo, "rd", routing.ModeDirect, false)
		var pods []*kubenode.Pod
		var names []string
		for i, n := range rc.Nodes {
			pods = append(pods, n.MustAddPod(t, "default", fmt.Sprintf("pod-%d", i+1)))
			names = append(names, n.Name)
		}
		sameSubnet := func(self, owner string) bool { return rc.topo[self].Subnet == rc.topo[owner].Subnet }
		rc.converged(t, "direct routes on the same subnet only", names, sameSubnet)
		if failed := pingAll(t, pods[:2]); len(failed) > 0 {
			t.Errorf("pod to pod on one subnet in direct mode:\n%s", strings.Join(failed, "\n"))
		}
		// Not routed some other way either: the pod beyond the router
		// does not answer.
		for _, v6 := range []bool{false, true} {
			if err := harness.Ping(t, pods[0].NS, pods[2].Addr(v6)); err == nil {
				t.Errorf("%s answers a pod of %s in direct mode across a router", pods[2].Addr(v6), rc.Nodes[0].Name)
			}
		}
		for _, n := range rc.Nodes {
			want := "1"
			if rc.topo[n.Name].Subnet == 1 {
				want = "2"
			}
			if got := n.Sample(t, "skein_route_unreachable_nodes"); got != want {
				t.Errorf("skein_route_unreachable_nodes on %s is %q, want %s", n.Name, got, want)
			}
		}
		// skeinctl route list says so too, naming the node's address.
		n1, n3 := rc.Nodes[0], rc.Nodes[2]
		out, err := exec.Command(filepath.Join(n1.D.BinDir, "skeinctl"), "--socket", n1.D.Socket, "-o", "json", "route", "list").CombinedOutput()
		if err != nil {
			t.Fatalf("skeinctl route list: %v\n%s", err, out)
		}
		var rows []routeListRow
		if err := json.Unmarshal(out, &rows); err != nil {
			t.Fatalf("skeinctl route list -o json: %v\n%s", err, out)
		}
		unreachable := 0
		for _, r := range rows {
			if r.Node != n3.Name {
				continue
			}
			p, err := netip.ParsePrefix(r.Block)
			if err != nil {
				t.Fatalf("skeinctl route list: block %q: %v", r.Block, err)
			}
			addr := rc.topo[n3.Name].Addr(p.Addr().Is6()).String()
			if r.Installed || r.Via != "" || !strings.Contains(r.Reason, addr) {
				t.Errorf("skeinctl route list on %s: %+v; want not installed, with a reason naming %s", n1.Name, r, addr)
			}
			unreachable++
			t.Logf("skeinctl route list on %s: %s of %s not installed: %s", n1.Name, r.Block, r.Node, r.Reason)
		}
		if unreachable != 2 {
			t.Errorf("skeinctl route list on %s shows %d blocks of %s, want 2 (one per family):\n%s", n1.Name, unreachable, n3.Name, out)
		}
		// A Warning event on the unreachable Node, from a node that cannot
		// reach it.
		kubenode.Eventually(t, routeWait, "a Warning event on the unreachable node", func() string {
			var l corev1.EventList
			if err := rc.Client.List(context.Background(), &l); err != nil {
				return err.Error()
			}
			var seen []string
			for _, e := range l.Items {
				seen = append(seen, fmt.Sprintf("%s/%s %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message))
				if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == rc.Nodes[2].Name &&
					e.Type == corev1.EventTypeWarning && e.Reason == routing.ReasonNodeUnreachable && e.Message != "" {
					return ""
				}
			}
			return fmt.Sprintf("events %v", seen)
		})
	})
}

// TestRouteConvergence: with routes in place (direct, then vxlan), a block
// freed, a block granted while a node's skeind is down (killed, then
// started again, finding a stale route of its own tag it must remove) and
// a node deleted from the API all converge: every live node ends with
// exactly the routes the API calls for, and routes of other owners — one
// in table 120 with another protocol, one in the main table — survive.
func TestRouteConvergence(t *testing.T) {
	harness.RequireRoot(t)
	for _, mode := range []routing.Mode{routing.ModeDirect, routing.ModeVXLAN} {
		t.Run(string(mode), func(t *testing.T) {
			topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 3})
			// Empty blocks go back after a second; a node whose skeind is
			// gone loses its blocks 4 s (its Lease) + 3 s (the grace)
			// after its last renewal, by a controller that says so (the
			// cluster's own has the default grace, a minute).
			rc := startRouteCluster(t, topo, "rc", mode, false, "--block-min-age", "1s", "--lease-duration", "4s")
			rc.Controller.Kill(t)
			cluster.StartController(t, rc.Kubeconfig, "skein-controller-gc", "--node-gc-grace", "3s")
			n1, n2, n3 := rc.Nodes[0], rc.Nodes[1], rc.Nodes[2]
			all := []string{n1.Name, n2.Name, n3.Name}
			pods := map[string]*kubenode.Pod{}
			for _, n := range rc.Nodes {
				pods[n.Name] = n.MustAddPod(t, "default", "first-"+n.Name)
			}
			team := n2.MustAddPod(t, teamNS, "team-"+n2.Name)
			rc.converged(t, "the first routes", all, everyone)

			// Another owner's routes on n1: table 120 with protocol 99, and
			// the main table (static).
			h1 := topo.Nodes[0].Handle(t)
			dev, err := h1.LinkByName(harness.UnderlayDev)
			if err != nil {
				t.Fatal(err)
			}
			foreign := []*netlink.Route{
				{Dst: mustNet("198.51.100.0/24"), Gw: topo.Nodes[1].Addr4.AsSlice(), LinkIndex: dev.Attrs().Index, Table: routing.DefaultTable, Protocol: 99},
				{Dst: mustNet("198.51.101.0/24"), Gw: topo.Nodes[1].Addr4.AsSlice(), LinkIndex: dev.Attrs().Index, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_STATIC},
				{Dst: mustNet("2001:db8:99::/64"), Gw: topo.Nodes[1].Addr6.AsSlice(), LinkIndex: dev.Attrs().Index, Table: routing.DefaultTable, Protocol: 99},
			}
			for _, r := range foreign {
				if err := h1.RouteAdd(r); err != nil {
					t.Fatalf("plant %s: %v", routeDesc(*r), err)
				}
			}
			foreignLeft := func(when string) {
				t.Helper()
				for _, r := range foreign {
					found := false
					for _, have := range topo.Nodes[0].TableRoutes(t, r.Table) {
						found = found || harness.RouteDst(have) == harness.RouteDst(*r) && have.Protocol == r.Protocol
					}
					if !found {
						t.Errorf("%s: another owner's route %s was removed", when, routeDesc(*r))
					}
				}
			}

			// A block freed: n2's only pod of pool team goes, and so does
			// its block.
			if err := team.Del(t); err != nil {
				t.Fatal(err)
			}
			kubenode.Eventually(t, routeWait, n2.Name+"'s block of pool team given back", func() string {
				if bl := blocksOfPool(t, rc.Cluster, n2.Name, teamPool.Name); len(bl) != 0 {
					return fmt.Sprintf("%s still owns %s after its last pod went", n2.Name, bl[0].Name)
				}
				return ""
			})
			rc.converged(t, "a freed block withdrawn", all, everyone)
			foreignLeft("after a block was freed")

			// n1's skeind crashes; meanwhile n2 gets a new block and a stale
			// route of skein's own tag appears in n1's table (as a block
			// freed while it was down leaves). Restarted, n1 converges.
			vxIndex := func() int {
				t.Helper()
				if mode != routing.ModeVXLAN {
					return 0
				}
				l, err := h1.LinkByName(routing.DefaultVXLANDevice)
				if err != nil {
					t.Fatalf("find %s on n1: %v", routing.DefaultVXLANDevice, err)
				}
				return l.Attrs().Index
			}
			vxBefore := vxIndex()
			n1.D.Kill(t)
			stale := &netlink.Route{Dst: mustNet("10.130.0.248/29"), Gw: topo.Nodes[1].Addr4.AsSlice(), LinkIndex: dev.Attrs().Index,
				Table: routing.DefaultTable, Protocol: routing.DefaultProtocol}
			if err := h1.RouteAdd(stale); err != nil {
				t.Fatalf("plant %s: %v", routeDesc(*stale), err)
			}
			n2.MustAddPod(t, teamNS, "second-"+n2.Name)
			if len(blocksOfPool(t, rc.Cluster, n2.Name, teamPool.Name)) == 0 {
				t.Fatalf("%s claimed no block of pool team for its new pod", n2.Name)
			}
			n1.D.Start(t)
			rc.converged(t, "routes after n1's skeind restarted", all, everyone)
			foreignLeft("after skeind restarted")
			// The restart keeps the VXLAN device (its reconcile once took
			// it for a leftover pod link and deleted it).
			if after := vxIndex(); after != vxBefore {
				t.Errorf("%s was recreated across the skeind restart: ifindex %d, was %d", routing.DefaultVXLANDevice, after, vxBefore)
			}
			if failed := pingAll(t, []*kubenode.Pod{pods[n1.Name], pods[n2.Name], pods[n3.Name]}); len(failed) > 0 {
				t.Errorf("pod to pod after the restart:\n%s", strings.Join(failed, "\n"))
			}

			// n3 is gone with its host: skeind killed, Node deleted; once
			// its Lease has run out the controller's GC deletes its blocks
			// and the others drop them.
			n3.D.Kill(t)
			if err := rc.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n3.Name}}); err != nil {
				t.Fatal(err)
			}
			kubenode.Eventually(t, routeWait, "the deleted node's blocks gone", func() string {
				if bl := rc.Blocks(t, n3.Name); len(bl) != 0 {
					return fmt.Sprintf("%d blocks", len(bl))
				}
				return ""
			})
			rc.converged(t, "routes after a node was deleted", all[:2], everyone)
			foreignLeft("after a node was deleted")
			if failed := pingAll(t, []*kubenode.Pod{pods[n1.Name], pods[n2.Name]}); len(failed) > 0 {
				t.Errorf("pod to pod after a node was deleted:\n%s", strings.Join(failed, "\n"))
			}
		})
	}
}

func mustNet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

package routebench

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
)

// TestSimAddresses: simulated nodes and blocks never overlap each other
// or the probe node, or leave their subnets.
func TestSimAddresses(t *testing.T) {
	seen := map[netip.Addr]int{probeAddr: -1}
	for i := range 5000 {
		a := simNodeAddr(i)
		if prev, dup := seen[a]; dup {
			t.Fatalf("simulated node %d has address %s, as %d", i, a, prev)
		}
		if b := a.As4(); !simUnderlay.Contains(a) || b[3] == 0 || b[3] == 255 {
			t.Fatalf("simulated node %d has address %s, outside %s or a .0 or .255", i, a, simUnderlay)
		}
		seen[a] = i
	}
	last := netip.Prefix{}
	for i := range 1 << (32 - simSubnet.Bits() - simBits) {
		p := simBlockPrefix(i)
		if !simSubnet.Contains(p.Addr()) || p.Bits() != 32-simBits || p.Masked() != p {
			t.Fatalf("block %d is %s, not a /%d of %s", i, p, 32-simBits, simSubnet)
		}
		if i > 0 && p.Addr().Compare(last.Addr()) <= 0 {
			t.Fatalf("block %d is %s, not after block %d's %s", i, p, i-1, last)
		}
		last = p
	}
}

// TestCreateSims makes simulated nodes through the real API server and
// checks what a routing watcher would read: each Node's InternalIP and
// each block's node label and prefix.
func TestCreateSims(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := createSimPool(ctx, c); err != nil {
		t.Fatal(err)
	}
	const n, per = 40, 3
	if err := createSims(ctx, env, 0, n, per, 8); err != nil {
		t.Fatal(err)
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != n {
		t.Fatalf("%d nodes, want %d", len(nodes.Items), n)
	}
	for _, node := range nodes.Items {
		var ip string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		var i int
		if _, err := fmt.Sscanf(node.Name, "sim-%d", &i); err != nil || ip != simNodeAddr(i).String() {
			t.Errorf("node %s: InternalIP %q, want %s", node.Name, ip, simNodeAddr(i))
		}
	}
	var blocks skeinv1.AddressBlockList
	if err := c.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelPool: simPool}); err != nil {
		t.Fatal(err)
	}
	if len(blocks.Items) != n*per {
		t.Fatalf("%d blocks, want %d", len(blocks.Items), n*per)
	}
	for _, b := range blocks.Items {
		i := int(b.Index)
		if b.Labels[skeinv1.LabelNode] != simNodeName(i/per) || b.IPv4 == nil || *b.IPv4 != simBlockPrefix(i).String() {
			t.Errorf("block %s: node %q, ipv4 %v; want %s, %s", b.Name, b.Labels[skeinv1.LabelNode], b.IPv4, simNodeName(i/per), simBlockPrefix(i))
		}
	}
	// Creating them again fails clearly (the names are taken).
	if err := createSims(ctx, env, 0, 1, per, 2); err == nil {
		t.Error("creating simulated node 0 twice succeeded")
	}
}

// TestRouteWatch: the watcher sees a remote-block route (our table and
// protocol) appear and go, and ignores other tables' routes.
func TestRouteWatch(t *testing.T) {
	topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 2, Prefix: "rb-node"})
	n := topo.Nodes[0]
	h := n.Handle(t)
	eth0, err := h.LinkByName(harness.UnderlayDev)
	if err != nil {
		t.Fatal(err)
	}
	p, other := netip.MustParsePrefix("10.128.0.16/28"), netip.MustParsePrefix("10.128.0.32/28")
	route := func(p netip.Prefix, table int) *netlink.Route {
		return &netlink.Route{Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)},
			Gw: topo.Nodes[1].Addr4.AsSlice(), LinkIndex: eth0.Attrs().Index, Table: table, Protocol: routing.DefaultProtocol}
	}
	// A route there before the watch begins is listed.
	early := netip.MustParsePrefix("10.128.0.48/28")
	if err := h.RouteAdd(route(early, routing.DefaultTable)); err != nil {
		t.Fatal(err)
	}
	w := watchRoutes(t, n)
	if _, err := waitAll([]*routeWatch{w}, early, true, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := h.RouteAdd(route(other, 200)); err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(route(p, routing.DefaultTable)); err != nil {
		t.Fatal(err)
	}
	at, err := waitAll([]*routeWatch{w}, p, true, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if at.Before(before) || time.Since(at) > 5*time.Second {
		t.Errorf("route seen at %v, added after %v", at, before)
	}
	if err := waitCount([]*routeWatch{w}, 2, time.Second); err != nil {
		t.Errorf("a route of table 200 counted: %v", err)
	}
	if err := h.RouteDel(route(p, routing.DefaultTable)); err != nil {
		t.Fatal(err)
	}
	if _, err := waitAll([]*routeWatch{w}, p, false, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitCount([]*routeWatch{w}, 1, time.Second); err != nil {
		t.Error(err)
	}
}

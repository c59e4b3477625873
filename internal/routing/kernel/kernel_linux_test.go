package kernel_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
	"github.com/skeinnet/skein/test/harness"
)

// foreign puts routes into n that are not routing's: one in its table with
// another protocol, one in another table with its protocol. Sync and
// Uninstall must leave them (the snapshots compare them).
func foreign(t testing.TB, n *node) {
	t.Helper()
	addRoute(t, n.ns, &netlink.Route{Dst: ipNetOf(pfx("10.99.0.0/24")), Type: unix.RTN_BLACKHOLE,
		Table: routing.DefaultTable, Protocol: 99})
	addRoute(t, n.ns, &netlink.Route{Dst: ipNetOf(pfx("fd99::/64")), Type: unix.RTN_BLACKHOLE,
		Table: routing.DefaultTable + 1, Protocol: routing.DefaultProtocol})
}

// TestDirect: three nodes on one L2 segment route each other's blocks via
// their underlay addresses; both families flow between pods; statuses say
// so; a repeated Sync and a restarted Kernel change nothing; a node's
// removal deletes exactly its routes; Uninstall restores the namespace.
func TestDirect(t *testing.T) {
	nodes := lan(t, 3)
	cfg := kernel.KernelConfig{Mode: routing.ModeDirect}
	var before []harness.State
	var ks []*kernel.Kernel
	for _, n := range nodes {
		foreign(t, n)
		before = append(before, harness.Snapshot(t, n.ns))
		c := cfg
		c.LocalAddrs = n.addrs
		ks = append(ks, newKernel(t, n, c))
	}
	for i, n := range nodes {
		st := mustSync(t, ks[i], remotes(n, nodes...))
		requireInstalled(t, st)
		for _, s := range st {
			want := s.NodeAddrs[0]
			if s.Block.Addr().Is6() {
				want = s.NodeAddrs[1]
			}
			if s.Via != want {
				t.Errorf("%s: via %s, want %s", s.Block, s.Via, want)
			}
		}
	}
	got := tableRoutes(t, nodes[0].ns, routing.DefaultTable)
	want := []string{
		"10.10.2.0/24 via 192.168.50.2 dev ul0 proto 32",
		"10.10.3.0/24 via 192.168.50.3 dev ul0 proto 32",
		"10.99.0.0/24 dev  proto 99",
		"fd10:2::/64 via fd50::2 dev ul0 proto 32",
		"fd10:3::/64 via fd50::3 dev ul0 proto 32",
	}
	if !slices.Equal(got, want) {
		t.Errorf("table of node1:\n  got  %q\n  want %q", got, want)
	}
	pingAll(t, nodes...)

	t.Run("resync is a no-op", func(t *testing.T) {
		requireNoChange(t, nodes[0], cfg, func() { mustSync(t, ks[0], remotes(nodes[0], nodes...)) })
	})
	t.Run("restart is a no-op", func(t *testing.T) {
		c := cfg
		c.LocalAddrs = nodes[0].addrs
		k := newKernel(t, nodes[0], c)
		requireNoChange(t, nodes[0], cfg, func() { requireInstalled(t, mustSync(t, k, remotes(nodes[0], nodes...))) })
	})
	t.Run("stale routes go", func(t *testing.T) {
		// node3 is gone from the API; node2's IPv6 block too.
		rs := remotes(nodes[0], nodes[:2]...)[:1]
		stop := watch(t, nodes[0].ns, routing.DefaultTable, routing.DefaultProtocol, "")
		requireInstalled(t, mustSync(t, ks[0], rs))
		if ch := stop(); len(ch) != 3 { // the watcher sees deletions (and so would see any change)
			t.Errorf("want 3 route deletions, saw %q", ch)
		}
		got := tableRoutes(t, nodes[0].ns, routing.DefaultTable)
		want := []string{"10.10.2.0/24 via 192.168.50.2 dev ul0 proto 32", "10.99.0.0/24 dev  proto 99"}
		if !slices.Equal(got, want) {
			t.Errorf("table after removal:\n  got  %q\n  want %q", got, want)
		}
		noPing(t, nodes[0], nodes[2].podIPs[0])
		// And back.
		requireInstalled(t, mustSync(t, ks[0], remotes(nodes[0], nodes...)))
		pingAll(t, nodes...)
	})
	t.Run("uninstall restores", func(t *testing.T) {
		for i, n := range nodes {
			if err := ks[i].Uninstall(); err != nil {
				t.Fatal(err)
			}
			harness.AssertSame(t, before[i], harness.Snapshot(t, n.ns))
			if err := ks[i].Uninstall(); err != nil {
				t.Fatalf("second uninstall: %v", err)
			}
		}
	})
}

// TestDirectReasons: the remotes direct mode cannot route get a Reason and
// no route, the others are installed regardless.
func TestDirectReasons(t *testing.T) {
	nodes := lan(t, 2)
	n := nodes[0]
	addRoute(t, n.ns, &netlink.Route{Dst: ipNetOf(pfx("10.77.0.0/24")), Type: unix.RTN_BLACKHOLE,
		Table: routing.DefaultTable, Protocol: 99})
	defaultVia(t, n.ns, ip("192.168.50.254"))
	k := newKernel(t, n, kernel.KernelConfig{Mode: routing.ModeDirect, LocalAddrs: n.addrs})
	rs := []routing.Remote{
		{Block: pfx("10.10.2.0/24"), Node: "node2", NodeAddrs: nodes[1].addrs},
		{Block: pfx("10.20.0.0/24"), Node: "nowhere"},
		{Block: pfx("fd20::/64"), Node: "v4only", NodeAddrs: []netip.Addr{ip("192.168.50.2")}},
		{Block: pfx("10.21.0.0/24"), Node: "far", NodeAddrs: []netip.Addr{ip("172.16.0.9")}},
		{Block: pfx("10.22.0.0/24"), Node: "self", NodeAddrs: []netip.Addr{ip("192.168.50.1")}},
		{Block: pfx("10.10.2.0/24"), Node: "dup", NodeAddrs: nodes[1].addrs},
		{Block: pfx("10.77.0.0/24"), Node: "taken", NodeAddrs: nodes[1].addrs},
		{Block: pfx("10.23.0.1/24"), Node: "bad"},
		// An IPv4 block of a node with only an IPv6 address: via inet6.
		{Block: pfx("10.24.0.0/24"), Node: "v6only", NodeAddrs: []netip.Addr{ip("fd50::2")}},
	}
	st := mustSync(t, k, rs)
	reasons := []string{"", "node has no address", "no IPv6 address", "not on a directly connected network",
		"an address of this node", "also claimed", "did not make", "not a canonical prefix", ""}
	for i, s := range st {
		if s.Installed != (reasons[i] == "") || !strings.Contains(s.Reason, reasons[i]) || s.Installed != s.Via.IsValid() {
			t.Errorf("%s (%s): installed=%t via=%v reason=%q; want reason containing %q",
				s.Block, s.Node, s.Installed, s.Via, s.Reason, reasons[i])
		}
	}
	got := tableRoutes(t, n.ns, routing.DefaultTable)
	want := []string{
		"10.10.2.0/24 via 192.168.50.2 dev ul0 proto 32",
		"10.24.0.0/24 via inet6 fd50::2 dev ul0 proto 32",
		"10.77.0.0/24 dev  proto 99",
	}
	if !slices.Equal(got, want) {
		t.Errorf("table:\n  got  %q\n  want %q", got, want)
	}
}

// TestBadConfig: every malformed KernelConfig is refused with ErrInvalid
// before anything is touched.
func TestBadConfig(t *testing.T) {
	nodes := lan(t, 1)
	n := nodes[0]
	before := harness.Snapshot(t, n.ns)
	v4 := ip("192.168.50.1")
	for name, c := range map[string]kernel.KernelConfig{
		"mode":          {Mode: "bgp"},
		"main table":    {Table: 254},
		"local table":   {Table: 255},
		"default table": {Table: 253},
		"pod table":     {Table: 116},
		"neg table":     {Table: -1},
		"proto static":  {Protocol: 4},
		"proto 256":     {Protocol: 256},
		"pod proto":     {Protocol: 31},
		"prio":          {RulePriority: 32766},
		"vni":           {VXLAN: kernel.VXLANConfig{VNI: 1 << 24}},
		"neg vni":       {VXLAN: kernel.VXLANConfig{VNI: -1}},
		"port":          {VXLAN: kernel.VXLANConfig{Port: 65536}},
		"mtu":           {VXLAN: kernel.VXLANConfig{MTU: 67}},
		"device slash":  {VXLAN: kernel.VXLANConfig{Device: "a/b"}},
		"device long":   {VXLAN: kernel.VXLANConfig{Device: "abcdefghijklmnop"}},
		"two v4":        {Mode: routing.ModeVXLAN, LocalAddrs: []netip.Addr{v4, ip("192.168.50.9")}},
		"loopback":      {Mode: routing.ModeVXLAN, LocalAddrs: []netip.Addr{ip("127.0.0.1")}},
		"vxlan no addr": {Mode: routing.ModeVXLAN},
	} {
		c.NodeNetNS = n.ns.Path()
		if k, err := kernel.NewKernel(c); !errors.Is(err, routing.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
			if k != nil {
				k.Close()
			}
		}
	}
	if _, err := kernel.NewKernel(kernel.KernelConfig{NodeNetNS: "/nonexistent/ns"}); err == nil {
		t.Error("missing namespace accepted")
	}
	// Only vxlan uses the local addresses: an odd one (a Node's
	// InternalIP, say) must not stop the other modes.
	for _, mode := range []routing.Mode{routing.ModeExport, routing.ModeDirect} {
		k, err := kernel.NewKernel(kernel.KernelConfig{Mode: mode, NodeNetNS: n.ns.Path(), LocalAddrs: []netip.Addr{ip("127.0.0.1"), v4, ip("192.168.50.9")}})
		if err != nil {
			t.Errorf("%s mode with odd local addresses: %v", mode, err)
			continue
		}
		k.Close()
	}
	harness.AssertSame(t, before, harness.Snapshot(t, n.ns))
}

// TestDirectIPv4ViaIPv6: nodes known only by their IPv6 addresses still
// carry IPv4 pod traffic in direct mode (RFC 5549 next hops).
func TestDirectIPv4ViaIPv6(t *testing.T) {
	nodes := lan(t, 2)
	for _, n := range nodes {
		n.addrs = n.addrs[1:] // IPv6 only
	}
	for _, n := range nodes {
		k := newKernel(t, n, kernel.KernelConfig{Mode: routing.ModeDirect, LocalAddrs: n.addrs})
		requireInstalled(t, mustSync(t, k, remotes(n, nodes...)))
	}
	if got := tableRoutes(t, nodes[0].ns, routing.DefaultTable); !contains(got, "10.10.2.0/24 via inet6 fd50::2 dev ul0") {
		t.Errorf("table: %q", got)
	}
	pingAll(t, nodes...)
}

// TestCancelledSync: a Sync whose context is already done changes nothing.
func TestCancelledSync(t *testing.T) {
	nodes := lan(t, 2)
	before := harness.Snapshot(t, nodes[0].ns)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for _, mode := range []routing.Mode{routing.ModeDirect, routing.ModeVXLAN} {
		k := newKernel(t, nodes[0], kernel.KernelConfig{Mode: mode, LocalAddrs: nodes[0].addrs})
		if _, err := k.Sync(ctx, remotes(nodes[0], nodes...)); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: got %v, want context.Canceled", mode, err)
		}
	}
	harness.AssertSame(t, before, harness.Snapshot(t, nodes[0].ns))
}

// TestRuleTag: the rule "from all lookup 120" carries the route protocol;
// an administrator's identical rule with another protocol survives every
// mode (export mode once deleted it as skein's), and the untagged rule of
// an older skeind is replaced by the tagged one.
func TestRuleTag(t *testing.T) {
	n := lan(t, 1)[0]
	h := n.ns.Handle(t)
	plant := func(proto uint8) {
		t.Helper()
		r := netlink.NewRule()
		r.Family, r.Priority, r.Table, r.Protocol = netlink.FAMILY_V4, routing.DefaultRulePriority, routing.DefaultTable, proto
		if err := h.RuleAdd(r); err != nil {
			t.Fatalf("plant rule proto %d: %v", proto, err)
		}
	}
	plant(0)                  // an older skeind's
	plant(unix.RTPROT_STATIC) // an administrator's
	protos := func(family int) []uint8 {
		t.Helper()
		rules, err := h.RuleList(family)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint8
		for _, r := range rules {
			if r.Priority == routing.DefaultRulePriority && r.Table == routing.DefaultTable {
				out = append(out, r.Protocol)
			}
		}
		slices.Sort(out)
		return out
	}
	mustSync(t, newKernel(t, n, kernel.KernelConfig{Mode: routing.ModeDirect}), nil)
	if got, want := protos(netlink.FAMILY_V4), []uint8{unix.RTPROT_STATIC, routing.DefaultProtocol}; !slices.Equal(got, want) {
		t.Errorf("IPv4 rules at %d after a direct sync: protocols %v, want %v", routing.DefaultRulePriority, got, want)
	}
	if got, want := protos(netlink.FAMILY_V6), []uint8{routing.DefaultProtocol}; !slices.Equal(got, want) {
		t.Errorf("IPv6 rules at %d after a direct sync: protocols %v, want %v", routing.DefaultRulePriority, got, want)
	}
	mustSync(t, newKernel(t, n, kernel.KernelConfig{Mode: routing.ModeExport}), nil)
	if got, want := protos(netlink.FAMILY_V4), []uint8{unix.RTPROT_STATIC}; !slices.Equal(got, want) {
		t.Errorf("IPv4 rules at %d after an export sync: protocols %v, want %v (the administrator's)", routing.DefaultRulePriority, got, want)
	}
	if got := protos(netlink.FAMILY_V6); len(got) != 0 {
		t.Errorf("IPv6 rules at %d after an export sync: protocols %v, want none", routing.DefaultRulePriority, got)
	}
}

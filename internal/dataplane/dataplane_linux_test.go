package dataplane_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

var (
	nodeV4 = netip.MustParseAddr("10.200.0.1") // on the node's lo
	nodeV6 = netip.MustParseAddr("fd00:200::1")
)

// newNode makes a node namespace with an address of each family on lo and an
// initialised Dataplane for it.
func newNode(t testing.TB, cfg dataplane.Config) (*harness.NS, *dataplane.Dataplane) {
	t.Helper()
	node := harness.NewNS(t, "node")
	h := node.Handle(t)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{nodeV4, nodeV6} {
		if err := h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}); err != nil {
			t.Fatal(err)
		}
	}
	cfg.NodeNetNS = node.Path()
	d, err := dataplane.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	return node, d
}

func podLink(pod *harness.NS, n int, addrs ...string) dataplane.Link {
	l := dataplane.Link{
		HostName: fmt.Sprintf("skv%d", n),
		Alias:    fmt.Sprintf("skein:test:%s:eth0", pod.Name()),
		NetNS:    pod.Path(),
		IfName:   "eth0",
	}
	for _, a := range addrs {
		l.Addrs = append(l.Addrs, netip.MustParseAddr(a))
	}
	return l
}

func mustPing(t *testing.T, from *harness.NS, to netip.Addr) {
	t.Helper()
	// The first IPv6 echo may race the pod's own link-local DAD; one retry.
	if err := harness.Ping(t, from, to); err != nil {
		if err := harness.Ping(t, from, to); err != nil {
			t.Errorf("ping %s from %s: %v", to, from.Name(), err)
		}
	}
}

// TestTwoPodsDualStack is the main end-to-end case: two dual-stack pods on
// one node reach each other and the node in both families, Check agrees
// with the kernel, and Teardown restores the node exactly.
func TestTwoPodsDualStack(t *testing.T) {
	harness.RequireRoot(t)
	for _, nodeFwd := range []bool{true, false} {
		t.Run(fmt.Sprintf("NodeForwarding=%t", nodeFwd), func(t *testing.T) {
			if !nodeFwd {
				if _, err := os.Stat("/proc/sys/net/ipv6/conf/all/force_forwarding"); err != nil {
					t.Skip("kernel < 6.17: IPv6 pod forwarding needs NodeForwarding")
				}
			}
			node, d := newNode(t, dataplane.Config{NodeForwarding: nodeFwd})
			before := harness.Snapshot(t, node)
			podA, podB := harness.NewNS(t, "poda"), harness.NewNS(t, "podb")
			la := podLink(podA, 1, "10.100.0.5", "fd00:100::5")
			lb := podLink(podB, 2, "10.100.0.6", "fd00:100::6")
			la.ContainerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x05}
			for _, l := range []dataplane.Link{la, lb} {
				app, err := d.Setup(l)
				if err != nil {
					t.Fatalf("Setup %s: %v", l.HostName, err)
				}
				if app.HostIndex == 0 || app.ContainerIndex == 0 || len(app.HostMAC) != 6 || app.MTU != 1500 {
					t.Errorf("Applied = %+v", app)
				}
				if l.ContainerMAC != nil && app.ContainerMAC.String() != l.ContainerMAC.String() {
					t.Errorf("container MAC %s, want %s", app.ContainerMAC, l.ContainerMAC)
				}
				if err := d.Check(l); err != nil {
					t.Errorf("Check after Setup: %v", err)
				}
			}

			for _, c := range []struct {
				from *harness.NS
				to   string
			}{
				{podA, "10.100.0.6"}, {podB, "10.100.0.5"},
				{podA, "fd00:100::6"}, {podB, "fd00:100::5"},
				{podA, nodeV4.String()}, {podA, nodeV6.String()},
				{podB, "169.254.1.1"},
				{node, "10.100.0.5"}, {node, "fd00:100::6"},
			} {
				mustPing(t, c.from, netip.MustParseAddr(c.to))
			}

			if err := harness.Ping(t, podA, netip.MustParseAddr("10.100.0.99")); err == nil {
				t.Error("ping to an address no pod has succeeded")
			}

			// Remove one pod address: Check names it.
			h := podA.Handle(t)
			eth0, err := h.LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			if err := h.AddrDel(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd00:100::5"), Mask: net.CIDRMask(128, 128)}}); err != nil {
				t.Fatal(err)
			}
			err = d.Check(la)
			if !errors.Is(err, dataplane.ErrMismatch) || !strings.Contains(err.Error(), "fd00:100::5/128") {
				t.Errorf("Check after removing an address = %v, want ErrMismatch naming fd00:100::5/128", err)
			}

			for _, l := range []dataplane.Link{la, lb} {
				for i := 0; i < 2; i++ { // DEL twice
					if err := d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs); err != nil {
						t.Errorf("Teardown #%d %s: %v", i+1, l.HostName, err)
					}
				}
				if err := d.Check(l); !errors.Is(err, dataplane.ErrMismatch) {
					t.Errorf("Check after Teardown = %v, want ErrMismatch", err)
				}
			}
			harness.AssertSame(t, before, harness.Snapshot(t, node))
		})
	}
}

func TestTeardownAfterNetNSGone(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{})
	before := harness.Snapshot(t, node)
	pod := harness.NewNS(t, "gone")
	l := podLink(pod, 1, "10.100.0.7")
	if _, err := d.Setup(l); err != nil {
		t.Fatal(err)
	}
	// Remove the pod namespace as a runtime would before DEL.
	if err := netns.Remove(pod.Path()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := d.Teardown(l.HostName, pod.Path(), l.IfName, l.Addrs); err != nil {
			t.Errorf("Teardown #%d: %v", i+1, err)
		}
	}
	harness.AssertSame(t, before, harness.Snapshot(t, node))
}

// TestTeardownFindsHostEndFromPod: a caller that lost the host name still
// removes the pair through the pod side; a foreign link is never deleted.
func TestTeardownFindsHostEndFromPod(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{})
	before := harness.Snapshot(t, node)
	pod := harness.NewNS(t, "pod")
	l := podLink(pod, 1, "10.100.0.8")
	if _, err := d.Setup(l); err != nil {
		t.Fatal(err)
	}
	if err := d.Teardown("skvwrong", l.NetNS, l.IfName, nil); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, node))

	if err := d.Teardown("skvnone", "/etc/hostname", "eth0", nil); err != nil {
		t.Errorf("Teardown with nothing left and a bogus netns path: %v", err)
	}

	foreign := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "notours", Alias: "someone-else", TxQLen: -1}, PeerName: "notours-p"}
	if err := node.Handle(t).LinkAdd(foreign); err != nil {
		t.Fatal(err)
	}
	if err := d.Teardown("notours", "", "", nil); !errors.Is(err, dataplane.ErrNotOwned) {
		t.Errorf("Teardown of a foreign link = %v, want ErrNotOwned", err)
	}
	if _, err := node.Handle(t).LinkByName("notours"); err != nil {
		t.Errorf("foreign link was touched: %v", err)
	}
}

// TestSetupFailuresLeaveNothing: each failing Setup returns the right
// sentinel and leaves node and pod namespaces exactly as they were.
func TestSetupFailuresLeaveNothing(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{NodeForwarding: true})
	pod := harness.NewNS(t, "pod")
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	// Pre-existing links: eth0 in the pod, skvtaken on the node, and a pod
	// already owning 10.100.0.9 (so its PodTable route exists).
	ph, nh := pod.Handle(t), node.Handle(t)
	if err := ph.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", TxQLen: -1}, PeerName: "eth0peer"}); err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "skvtaken", Alias: "skein:x", TxQLen: -1}, PeerName: "skvtakenp"}); err != nil {
		t.Fatal(err)
	}
	other := harness.NewNS(t, "other")
	if _, err := d.Setup(podLink(other, 9, "10.100.0.9")); err != nil {
		t.Fatal(err)
	}

	mod := func(f func(*dataplane.Link)) dataplane.Link {
		l := podLink(pod, 1, "10.100.0.5", "fd00:100::5")
		l.IfName = "eth1"
		f(&l)
		return l
	}
	for _, c := range []struct {
		name string
		link dataplane.Link
		want error
	}{
		{"ifname taken in pod", mod(func(l *dataplane.Link) { l.IfName = "eth0" }), dataplane.ErrLinkExists},
		{"host name taken", mod(func(l *dataplane.Link) { l.HostName = "skvtaken" }), dataplane.ErrLinkExists},
		{"netns missing", mod(func(l *dataplane.Link) { l.NetNS = filepath.Join(t.TempDir(), "none") }), dataplane.ErrNetNSNotExist},
		{"netns is a regular file", mod(func(l *dataplane.Link) { l.NetNS = plain }), dataplane.ErrNotNetNS},
		{"4in6 address", mod(func(l *dataplane.Link) { l.Addrs = []netip.Addr{netip.MustParseAddr("::ffff:10.1.1.1")} }), dataplane.ErrInvalid},
		{"zero address", mod(func(l *dataplane.Link) { l.Addrs = append(l.Addrs, netip.Addr{}) }), dataplane.ErrInvalid},
		{"zoned address", mod(func(l *dataplane.Link) { l.Addrs = []netip.Addr{netip.MustParseAddr("fd00::1%eth0")} }), dataplane.ErrInvalid},
		{"link-local address", mod(func(l *dataplane.Link) { l.Addrs = []netip.Addr{netip.MustParseAddr("fe80::5")} }), dataplane.ErrInvalid},
		{"gateway as address", mod(func(l *dataplane.Link) { l.Addrs = []netip.Addr{netip.MustParseAddr("169.254.1.1")} }), dataplane.ErrInvalid},
		{"duplicate address", mod(func(l *dataplane.Link) { l.Addrs = append(l.Addrs, l.Addrs[0]) }), dataplane.ErrInvalid},
		{"no address", mod(func(l *dataplane.Link) { l.Addrs = nil }), dataplane.ErrInvalid},
		{"v6 with tiny mtu", mod(func(l *dataplane.Link) { l.MTU = 1000 }), dataplane.ErrInvalid},
		{"alias without prefix", mod(func(l *dataplane.Link) { l.Alias = "mine" }), dataplane.ErrInvalid},
		{"host name too long", mod(func(l *dataplane.Link) { l.HostName = "skvabcdefghijklmn" }), dataplane.ErrInvalid},
		{"multicast mac", mod(func(l *dataplane.Link) { l.ContainerMAC = net.HardwareAddr{1, 0, 0, 0, 0, 1} }), dataplane.ErrInvalid},
		// Fails late, after the veth pair exists: rollback must remove it.
		{"address already routed", mod(func(l *dataplane.Link) {
			l.Addrs = []netip.Addr{netip.MustParseAddr("fd00:100::5"), netip.MustParseAddr("10.100.0.9")}
		}), unix.EEXIST},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodeBefore, podBefore := harness.Snapshot(t, node), harness.Snapshot(t, pod)
			_, err := d.Setup(c.link)
			var de *dataplane.Error
			if !errors.Is(err, c.want) || !errors.As(err, &de) || de.Op != "setup" {
				t.Errorf("Setup = %v, want *Error wrapping %v", err, c.want)
			}
			harness.AssertSame(t, nodeBefore, harness.Snapshot(t, node))
			harness.AssertSame(t, podBefore, harness.Snapshot(t, pod))
		})
	}
}

func TestScan(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{})
	pods := []*harness.NS{harness.NewNS(t, "p1"), harness.NewNS(t, "p2"), harness.NewNS(t, "p3")}
	want := map[string][]string{
		"skv1": {"10.100.0.1", "fd00:100::1"},
		"skv2": {"10.100.0.2"},
		"skv3": {"fd00:100::3", "fd00:100::33"},
	}
	for i, p := range pods {
		l := podLink(p, i+1, want[fmt.Sprintf("skv%d", i+1)]...)
		if _, err := d.Setup(l); err != nil {
			t.Fatal(err)
		}
	}
	// Noise: an untagged veth and a foreign route in PodTable.
	nh := node.Handle(t)
	noise := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "noise", Alias: "other:x", TxQLen: -1, Flags: net.FlagUp}, PeerName: "noisep"}
	if err := nh.LinkAdd(noise); err != nil {
		t.Fatal(err)
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: noise.Index, Dst: &net.IPNet{IP: net.ParseIP("10.9.9.9").To4(), Mask: net.CIDRMask(32, 32)}, Table: 116, Protocol: 4}); err != nil {
		t.Fatal(err)
	}

	found, err := d.Scan()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, f := range found {
		if !strings.HasPrefix(f.Alias, "skein:test:") || f.HostIndex == 0 {
			t.Errorf("found %+v", f)
		}
		for _, a := range f.Addrs {
			got[f.HostName] = append(got[f.HostName], a.String())
		}
		slices.Sort(got[f.HostName])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Scan = %v, want %v", got, want)
	}
}

func TestExportedBlocks(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{})
	nh := node.Handle(t)
	// Foreign routes in the export table and in main must survive.
	foreign := &netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("10.77.0.0").To4(), Mask: net.CIDRMask(16, 32)}, Table: 119, Protocol: 12, Type: unix.RTN_BLACKHOLE}
	if err := nh.RouteAdd(foreign); err != nil {
		t.Fatal(err)
	}
	start := harness.Snapshot(t, node)

	exported := func() []string {
		t.Helper()
		rs, err := nh.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 119}, netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			if r.Protocol == 30 && r.Type == unix.RTN_BLACKHOLE {
				out = append(out, r.Dst.String())
			}
		}
		slices.Sort(out)
		return out
	}
	pfx := func(ss ...string) (ps []netip.Prefix) {
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	for _, step := range []struct{ set, want []string }{
		{[]string{"10.100.0.0/26", "fd00:100::/120"}, []string{"10.100.0.0/26", "fd00:100::/120"}},
		{[]string{"10.100.0.0/26", "fd00:100::/120"}, []string{"10.100.0.0/26", "fd00:100::/120"}}, // repeat
		{[]string{"10.100.0.64/26", "10.100.0.0/26", "10.100.0.0/26"}, []string{"10.100.0.0/26", "10.100.0.64/26"}},
		{nil, nil},
		{[]string{"fd00:100::100/120"}, []string{"fd00:100::100/120"}},
	} {
		if err := d.SetExportedBlocks(pfx(step.set...)); err != nil {
			t.Fatalf("SetExportedBlocks(%v): %v", step.set, err)
		}
		if got := exported(); fmt.Sprint(got) != fmt.Sprint(step.want) {
			t.Errorf("after SetExportedBlocks(%v): %v, want %v", step.set, got, step.want)
		}
	}
	if err := d.SetExportedBlocks(pfx("10.100.0.1/26")); !errors.Is(err, dataplane.ErrInvalid) {
		t.Errorf("non-canonical block: %v, want ErrInvalid", err)
	}

	// Init twice is idempotent; Uninstall removes the rules and exports but
	// not the foreign route.
	if err := d.Init(); err != nil {
		t.Fatal(err)
	}
	rules, err := nh.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range rules {
		if r.Priority == 2000 && r.Table == 116 {
			n++
		}
	}
	if n != 2 {
		t.Errorf("after Init twice: %d rules prio 2000 -> 116, want 2 (v4, v6)", n)
	}
	for i := 0; i < 2; i++ {
		if err := d.Uninstall(); err != nil {
			t.Fatal(err)
		}
	}
	after := harness.Snapshot(t, node)
	var gone []string
	for _, r := range start.Rules {
		if !slices.Contains(after.Rules, r) {
			gone = append(gone, r)
		}
	}
	if len(gone) != 2 || len(after.Rules) != len(start.Rules)-2 {
		t.Errorf("Uninstall removed rules %v, want just the two skein rules", gone)
	}
	// Uninstall takes away exactly the rules and the gateway's local route
	// that Init put there; routes of others (proto 12 here) stay.
	gw := slices.DeleteFunc(slices.Clone(start.Routes), func(r string) bool { return strings.Contains(r, "169.254.1.1/32") })
	if len(gw) != len(start.Routes)-1 {
		t.Errorf("Init did not install the gateway's local route: %v", start.Routes)
	}
	if !slices.Equal(gw, after.Routes) {
		t.Errorf("routes changed by Uninstall beyond the gateway route:\n%v\n%v", gw, after.Routes)
	}
}

func TestNewValidates(t *testing.T) {
	harness.RequireRoot(t)
	node := harness.NewNS(t, "node")
	for _, cfg := range []dataplane.Config{
		{PodTable: 254},
		{PodTable: 119},
		{GatewayV4: netip.MustParseAddr("fe80::2")},
		{GatewayV6: netip.MustParseAddr("fd00::1")},
		{ExportProto: 31},
		{MTU: 10},
	} {
		cfg.NodeNetNS = node.Path()
		if _, err := dataplane.New(cfg); !errors.Is(err, dataplane.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
	if _, err := dataplane.New(dataplane.Config{NodeNetNS: "/nonexistent/ns"}); !errors.Is(err, dataplane.ErrNetNSNotExist) {
		t.Errorf("New with missing netns = %v", err)
	}
}

// TestUplinkMTU: MTU 0 follows the link of the node's default route.
func TestUplinkMTU(t *testing.T) {
	harness.RequireRoot(t)
	node := harness.NewNS(t, "node")
	nh := node.Handle(t)
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink", MTU: 9000, TxQLen: -1, Flags: net.FlagUp}, PeerName: "uplinkp", PeerMTU: 9000}
	if err := nh.LinkAdd(up); err != nil {
		t.Fatal(err)
	}
	if err := nh.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("192.0.2.2").To4(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: up.Index, Gw: net.ParseIP("192.0.2.1").To4()}); err != nil {
		t.Fatal(err)
	}
	d, err := dataplane.New(dataplane.Config{NodeNetNS: node.Path()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pod := harness.NewNS(t, "pod")
	app, err := d.Setup(podLink(pod, 1, "10.100.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	if app.MTU != 9000 {
		t.Errorf("MTU = %d, want the uplink's 9000", app.MTU)
	}
}

// TestConcurrentSetup plumbs pods from several goroutines at once; run with
// -race it also checks the Dataplane shares no unsynchronised state.
func TestConcurrentSetup(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{NodeForwarding: true})
	before := harness.Snapshot(t, node)
	const n = 6
	links := make([]dataplane.Link, n)
	for i := range links {
		links[i] = podLink(harness.NewNS(t, "cpod"), i+1, fmt.Sprintf("10.100.1.%d", i+1), fmt.Sprintf("fd00:101::%d", i+1))
	}
	errs := make(chan error, n)
	for _, l := range links {
		go func() { _, err := d.Setup(l); errs <- err }()
	}
	for range links {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	found, err := d.Scan()
	if err != nil || len(found) != n {
		t.Errorf("Scan after concurrent Setup: %d links, %v", len(found), err)
	}
	for _, l := range links {
		if err := d.Check(l); err != nil {
			t.Error(err)
		}
		go func() { errs <- d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs) }()
	}
	for range links {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	harness.AssertSame(t, before, harness.Snapshot(t, node))
}

// TestGatewayPerLink: a dual-stack pod's IPv6 gateway is its own host
// veth's link-local address (no address is shared between host veths, so a
// new veth costs the kernel no more on a full node), the pod routes and
// pings through it; an IPv4-only host veth has no IPv6 at all; and a link
// made the old way, with the shared GatewayV6, still passes Check.
func TestGatewayPerLink(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{NodeForwarding: true})
	before := harness.Snapshot(t, node)
	pods := []*harness.NS{harness.NewNS(t, "gwa"), harness.NewNS(t, "gwb"), harness.NewNS(t, "gwc")}
	links := []dataplane.Link{
		podLink(pods[0], 1, "10.100.0.5", "fd00:100::5"),
		podLink(pods[1], 2, "10.100.0.6", "fd00:100::6"),
		podLink(pods[2], 3, "10.100.0.7"),
	}
	nh := node.Handle(t)
	gws := map[netip.Addr]bool{}
	for i, l := range links {
		ap, err := d.Setup(l)
		if err != nil {
			t.Fatalf("Setup %s: %v", l.HostName, err)
		}
		t.Cleanup(func() { _ = d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs) })
		host, err := nh.LinkByName(l.HostName)
		if err != nil {
			t.Fatal(err)
		}
		addrs6, err := nh.AddrList(host, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 { // IPv4 only
			if ap.GatewayV6.IsValid() || len(addrs6) != 0 {
				t.Errorf("IPv4-only host veth: gateway %v and IPv6 addresses %v, want none", ap.GatewayV6, addrs6)
			}
			if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6"); err == nil && len(b) > 0 {
				var v string
				_ = node.Do(func() error {
					b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + l.HostName + "/disable_ipv6")
					v = strings.TrimSpace(string(b))
					return err
				})
				if v != "1" {
					t.Errorf("IPv4-only host veth: disable_ipv6 = %q, want 1", v)
				}
			}
			continue
		}
		want := dataplane.LinkLocal(host.Attrs().HardwareAddr)
		if ap.GatewayV6 != want || !want.IsLinkLocalUnicast() || gws[want] {
			t.Errorf("Applied.GatewayV6 = %v, want the host veth's own link-local %v, distinct per link", ap.GatewayV6, want)
		}
		gws[want] = true
		if len(addrs6) != 1 || addrs6[0].IP.String() != want.String() {
			t.Errorf("host veth %s IPv6 addresses %v, want only %v/64", l.HostName, addrs6, want)
		}
		routes, err := pods[i].Handle(t).RouteList(nil, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range routes {
			found = found || (r.Dst == nil || r.Dst.String() == "::/0") && r.Gw.String() == want.String()
		}
		if !found {
			t.Errorf("pod %s has no default route via %v: %v", pods[i].Name(), want, routes)
		}
		if out, err := pods[i].Exec(t, "ping", "-6", "-c1", "-W2", want.String()+"%eth0"); err != nil {
			t.Errorf("pod %s should reach its gateway %v: %v\n%s", pods[i].Name(), want, err, out)
		}
	}
	mustPing(t, pods[0], netip.MustParseAddr("fd00:100::6"))
	mustPing(t, pods[2], netip.MustParseAddr("10.100.0.5"))
	mustPing(t, pods[2], dataplane.DefaultGatewayV4)

	// A link as earlier versions made it: the shared GatewayV6 on the host
	// veth and the pod's default route via it.
	l := links[1]
	host, _ := nh.LinkByName(l.HostName)
	own := dataplane.LinkLocal(host.Attrs().HardwareAddr)
	if err := nh.AddrDel(host, &netlink.Addr{IPNet: &net.IPNet{IP: own.AsSlice(), Mask: net.CIDRMask(64, 128)}}); err != nil {
		t.Fatal(err)
	}
	legacy := dataplane.DefaultGatewayV6
	if err := nh.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: legacy.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	ph := pods[1].Handle(t)
	eth0, err := ph.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ph.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: legacy.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	if err := d.Check(l); err != nil {
		t.Errorf("Check of a link with the legacy shared gateway: %v", err)
	}
	mustPing(t, pods[1], netip.MustParseAddr("fd00:100::5"))
	if err := ph.RouteDel(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: legacy.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	if err := d.Check(l); !errors.Is(err, dataplane.ErrMismatch) || !strings.Contains(err.Error(), "no pod default route via fe80::1") {
		t.Errorf("Check without the pod's default route = %v, want ErrMismatch naming the route", err)
	}

	for _, l := range links {
		if err := d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs); err != nil {
			t.Errorf("Teardown %s: %v", l.HostName, err)
		}
	}
	harness.AssertSame(t, before, harness.Snapshot(t, node))
}

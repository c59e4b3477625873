package egress

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/harness"
)

// BenchmarkHostClientSteps times, on this host's own kernel (no qemu), the
// steps ApplyClient takes for a new dual-stack pod with one gateway, next
// to the pod's raw-netlink attachment (veth pair, addresses, routes): the
// native side of the estimate in docs/benchmarks/egress.md. The host has
// no fou, ipip or ip6tnl, so the two tunnel devices are stood in for by a
// veth pair made inside the pod (two devices, up), the two flow-based
// devices by a second pair, and the FoU ports are left out; everything else is ApplyClient's own code. One pass of 40
// pods (-benchtime 1x); root.
func BenchmarkHostClientSteps(b *testing.B) {
	harness.RequireRoot(b)
	node := harness.NewNS(b, "nnode")
	nh, err := openHandle(node.Path(), false)
	if err != nil {
		b.Fatal(err)
	}
	defer nh.Close()
	cfg := gateway(false, "0.0.0.0/0", "::/0")
	steps := map[string][]time.Duration{}
	var order []string
	tm := func(name string, fn func()) {
		s := time.Now()
		fn()
		if _, ok := steps[name]; !ok {
			order = append(order, name)
		}
		steps[name] = append(steps[name], time.Since(s))
	}
	ck := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 40*b.N; i++ {
		pod := harness.NewNS(b, "np")
		a4 := ip(fmt.Sprintf("10.100.1.%d", i+1))
		a6 := ip(fmt.Sprintf("fd00:100::1:%x", i+1))
		tm("attach", func() {
			f, err := os.Open(pod.Path())
			ck(err)
			defer f.Close()
			ph, err := openHandle(pod.Path(), false)
			ck(err)
			defer ph.Close()
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("vn%d", i), Flags: net.FlagUp}, PeerName: "eth0", PeerNamespace: netlink.NsFd(f.Fd())}
			ck(nh.LinkAdd(veth))
			eth0, err := ph.LinkByName("eth0")
			ck(err)
			ck(ph.LinkSetUp(eth0))
			for _, a := range []netip.Addr{a4, a6} {
				ck(ph.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD}))
			}
			ck(ph.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(pfx("0.0.0.0/0")), Scope: netlink.SCOPE_LINK}))
			ck(ph.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(pfx("::/0"))}))
			l, err := nh.LinkByName(veth.Name)
			ck(err)
			ck(nh.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(netip.PrefixFrom(a4, 32)), Scope: netlink.SCOPE_LINK}))
		})
		total := time.Now()
		var h *netlink.Handle
		var rs *routeSocket
		tm("open (switch, sockets, sysctls)", func() {
			h, rs, _, err = openHandles(pod.Path(), false, [][2]string{{"net/ipv4/conf/all/rp_filter", "0"}, {"net/ipv4/conf/default/rp_filter", "0"}}, true)
			ck(err)
		})
		tm("dumps (addr, link, rule)", func() {
			_, err := globalFamilies(h)
			ck(err)
			_, err = listTunnels(h, clientPrefix4, clientPrefix6)
			ck(err)
			_, err = findRules(h, append(clientRules(false), clientRules(true)...))
			ck(err)
		})
		plan, _ := planClient(cfg)
		tm("sourceFor x2", func() {
			for _, t := range plan.tunnels {
				if t.flow {
					continue // no remote, no lookup
				}
				_, err := sourceFor(h, t.remote)
				ck(err)
			}
		})
		var l netlink.Link
		tm("2 devices (veth pair, up)", func() {
			l = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "egr4-x", Flags: net.FlagUp}, PeerName: "egr6-x"}
			ck(h.LinkAdd(l))
		})
		var l6 netlink.Link
		tm("alias x2 (+1 lookup)", func() {
			ck(h.LinkSetAlias(l, "skein-egress:x"))
			l6, err = h.LinkByName("egr6-x")
			ck(err)
			ck(h.LinkSetAlias(l6, "skein-egress:y"))
		})
		ck(h.LinkSetUp(l6))
		// The flow-based devices (egr4-flow, egr6-flow), made for
		// every gateway: two more devices, tagged.
		tm("2 flow devices (veth pair, up, alias x2)", func() {
			f := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "egr4-flow", Flags: net.FlagUp}, PeerName: "egr6-flow"}
			ck(h.LinkAdd(f))
			ck(h.LinkSetAlias(f, aliasFlow))
			f6, err := h.LinkByName("egr6-flow")
			ck(err)
			ck(h.LinkSetAlias(f6, aliasFlow))
			ck(h.LinkSetUp(f6))
		})
		tm("routes x2", func() {
			ck(h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Table: 118, Dst: ipNet(pfx("0.0.0.0/0")), Scope: netlink.SCOPE_LINK}))
			ck(h.RouteReplace(&netlink.Route{LinkIndex: l6.Attrs().Index, Table: 118, Dst: ipNet(pfx("::/0")), Scope: netlink.SCOPE_LINK, Family: netlink.FAMILY_V6}))
		})
		tm("rules x10 batched", func() { _, err := addRules(rs, plan.rules); ck(err) })
		steps["steps-total"] = append(steps["steps-total"], time.Since(total))
		// What the code before the batching and the skipped dumps did,
		// for comparison (not part of the total).
		for _, r := range plan.rules {
			ck(h.RuleDel(r.nl()))
		}
		tm("(before) rules x10 one by one", func() {
			for _, r := range plan.rules {
				ck(h.RuleAdd(r.nl()))
			}
		})
		tm("(before) route dump + 2nd addr dump", func() {
			_, err := listRoutes(h, []int{TableNarrow, TableWide}, map[int]string{l.Attrs().Index: "egr4-x"})
			ck(err)
			_, err = h.AddrList(nil, netlink.FAMILY_V6)
			ck(err)
		})
		tm("(before) 2 more link lookups", func() {
			for _, n := range []string{"egr4-x", "egr6-x"} {
				_, err := h.LinkByName(n)
				ck(err)
			}
		})
		h.Close()
		rs.Close()
	}
	order = append(order, "steps-total")
	// n is 40 per b.N; figures are per pod.
	for _, n := range order {
		d := steps[n]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		fmt.Printf("CLIENT-STEPS %-34s p50 %8v  min %8v (n=%d)\n", n, d[len(d)/2], d[0], len(d))
	}
}

package dataplane_test

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/test/harness"
)

// BenchmarkSetupTeardown times Setup of one dual-stack attachment in a node
// namespace; the Teardown between iterations is not timed. It reports the
// median and p99 of the Setup latency, and of the Teardown's.
func BenchmarkSetupTeardown(b *testing.B) {
	harness.RequireRoot(b)
	_, d := newNode(b, dataplane.Config{NodeForwarding: true})
	pod := harness.NewNS(b, "bpod")
	l := podLink(pod, 1, "10.100.0.5", "fd00:100::5")
	lat := make([]time.Duration, 0, b.N)
	down := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := d.Setup(l); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		start = time.Now()
		if err := d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs); err != nil {
			b.Fatal(err)
		}
		down = append(down, time.Since(start))
		b.StartTimer()
	}
	reportQuantiles(b, "setup", lat)
	reportQuantiles(b, "teardown", down)
}

// BenchmarkScan5000 times Scan over 5,000 tagged host veths, each with a
// tagged PodTable route (made with raw netlink, both ends on the node, to
// keep the bed small). Before timing, it reports Setup latency on the empty
// node and again with the 5,000 links present, to show whether ADD stays
// flat as the node fills up.
func BenchmarkScan5000(b *testing.B) {
	harness.RequireRoot(b)
	const n = 5000
	node, d := newNode(b, dataplane.Config{NodeForwarding: true})
	pod := harness.NewNS(b, "bpod")
	var metrics []func()
	setupLatency := func(name string) {
		l := podLink(pod, 1, "10.100.0.5", "fd00:100::5")
		lat := make([]time.Duration, 0, 100)
		for i := 0; i < cap(lat); i++ {
			start := time.Now()
			if _, err := d.Setup(l); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
			if err := d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs); err != nil {
				b.Fatal(err)
			}
		}
		metrics = append(metrics, func() { reportQuantiles(b, name, lat) })
	}
	setupLatency("setup-empty")

	nh := node.Handle(b)
	for i := 0; i < n; i++ {
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.Flags = fmt.Sprintf("skb%d", i), net.FlagUp
		v := &netlink.Veth{LinkAttrs: attrs, PeerName: fmt.Sprintf("skb%dp", i), PeerTxQLen: -1}
		if err := nh.LinkAdd(v); err != nil {
			b.Fatal(err)
		}
		if err := nh.LinkSetAlias(v, fmt.Sprintf("skein:bench:%d:eth0", i)); err != nil {
			b.Fatal(err)
		}
		dst := &net.IPNet{IP: net.IPv4(10, 101, byte(i>>8), byte(i)).To4(), Mask: net.CIDRMask(32, 32)}
		if err := nh.RouteAdd(&netlink.Route{LinkIndex: v.Index, Dst: dst, Table: 116, Protocol: 31, Scope: netlink.SCOPE_LINK}); err != nil {
			b.Fatal(err)
		}
	}
	setupLatency("setup-5000")

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		found, err := d.Scan()
		if err != nil {
			b.Fatal(err)
		}
		if len(found) != n || len(found[n-1].Addrs) != 1 {
			b.Fatalf("Scan found %d links", len(found))
		}
	}
	b.StopTimer()
	for _, m := range metrics { // after the loop: ResetTimer drops metrics
		m()
	}
}

func reportQuantiles(b *testing.B, name string, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Microseconds()), name+"-p50-µs")
	b.ReportMetric(float64(s[len(s)*99/100].Microseconds()), name+"-p99-µs")
}

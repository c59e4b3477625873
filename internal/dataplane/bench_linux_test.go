package dataplane_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/test/harness"
)

// BenchmarkSetupTeardown times Setup of one dual-stack attachment in a node
// namespace; the Teardown between iterations is not timed. It reports the
// median and p99 of the Setup latency.
func BenchmarkSetupTeardown(b *testing.B) {
	harness.RequireRoot(b)
	_, d := newNode(b, dataplane.Config{NodeForwarding: true})
	pod := harness.NewNS(b, "bpod")
	l := podLink(pod, 1, "10.100.0.5", "fd00:100::5")
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := d.Setup(l); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		if err := d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportQuantiles(b, "setup", lat)
}

// BenchmarkScan5000 plumbs 5,000 attachments into one node (pods share a
// namespace to keep the bed small), reports how Setup latency moved from the
// first to the last hundred, and times Scan over them.
func BenchmarkScan5000(b *testing.B) {
	harness.RequireRoot(b)
	const n = 5000
	_, d := newNode(b, dataplane.Config{NodeForwarding: true})
	pod := harness.NewNS(b, "bpods")
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		l := dataplane.Link{
			HostName: fmt.Sprintf("skb%d", i),
			Alias:    fmt.Sprintf("skein:bench:%d:e%d", i, i),
			NetNS:    pod.Path(),
			IfName:   fmt.Sprintf("e%d", i),
			Addrs:    []netip.Addr{netip.AddrFrom4([4]byte{10, 101, byte(i >> 8), byte(i)})},
		}
		start := time.Now()
		if _, err := d.Setup(l); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	reportQuantiles(b, "setup-first100", lat[:100])
	reportQuantiles(b, "setup-last100", lat[n-100:])
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

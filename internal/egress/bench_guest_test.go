package egress

import (
	"fmt"
	"io"
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

// BenchmarkGuestEgress measures, in one run inside the guest, the client
// -> external path through the FoU gateway (192.0.2.10, SNAT'd by a
// router pod) against the same client -> external host by direct routing
// without NAT (10.200.0.10, a private destination: main table): TCP
// throughput and 1-byte request/response latency; and the time
// ApplyClient takes for a fresh pod with one gateway (both families),
// the tunnel set-up added to a pod's ADD. Run it with -test.benchtime=1x:
// each figure is measured over a fixed time or count, not b.N.
func BenchmarkGuestEgress(b *testing.B) {
	requireGuest(b)
	tp := newTopo(b, false)
	if err := ApplyClient(tp.client.Path(), gateway(false, "192.0.2.10/32", "2001:db8:ff::10/128")); err != nil {
		b.Fatal(err)
	}
	sinkPort, echoPort := benchServers(b, tp)
	for range b.N {
		// The two paths alternate, three rounds each, and the medians
		// are reported: the machine's load moves single figures a lot.
		paths := []struct {
			name string
			dst  netip.Addr
		}{{"gateway", ext4}, {"direct", privDst4}}
		tput := map[string][]float64{}
		p50s := map[string][]time.Duration{}
		p99s := map[string][]time.Duration{}
		for round := 0; round < 3; round++ {
			for _, path := range paths {
				tput[path.name] = append(tput[path.name], throughput(b, tp.client, netip.AddrPortFrom(path.dst, sinkPort), 2*time.Second))
				p50, p99 := latency(b, tp.client, netip.AddrPortFrom(path.dst, echoPort), 1000)
				p50s[path.name] = append(p50s[path.name], p50)
				p99s[path.name] = append(p99s[path.name], p99)
			}
		}
		for _, path := range paths {
			sort.Float64s(tput[path.name])
			mbps, p50, p99 := tput[path.name][1], pct(p50s[path.name], 50), pct(p99s[path.name], 50)
			b.ReportMetric(mbps, "Mbit/s-"+path.name)
			b.ReportMetric(float64(p50.Microseconds()), "us-p50-rr-"+path.name)
			b.ReportMetric(float64(p99.Microseconds()), "us-p99-rr-"+path.name)
			fmt.Printf("EGRESS-BENCH %s throughput %.1f Mbit/s, rr p50 %v p99 %v (medians of 3 rounds)\n", path.name, mbps, p50, p99)
		}
		// Make sure the gateway figures were the gateway's.
		if got, err := seenFrom(tp.client, "tcp", ext4); err != nil || routerOf(got) < 0 {
			b.Fatalf("the gateway path is not SNAT'd: %q, %v", got, err)
		}
		if got, err := seenFrom(tp.client, "tcp", privDst4); err != nil || got != client4.String() {
			b.Fatalf("the direct path is not direct: %q, %v", got, err)
		}
		p50, p99, rm50, at50 := applyTimes(b, tp, 40)
		b.ReportMetric(float64(p50.Microseconds()), "us-p50-apply")
		b.ReportMetric(float64(p99.Microseconds()), "us-p99-apply")
		b.ReportMetric(float64(rm50.Microseconds()), "us-p50-remove")
		b.ReportMetric(float64(at50.Microseconds()), "us-p50-attach")
		fmt.Printf("EGRESS-BENCH ApplyClient (one gateway, v4+v6) p50 %v p99 %v; removal p50 %v; veth attach floor p50 %v\n", p50, p99, rm50, at50)
	}
}

// benchServers starts a TCP sink and a TCP 1-byte echo in the external
// namespace.
func benchServers(b *testing.B, tp *topo) (sink, echo uint16) {
	var ls, le net.Listener
	err := tp.ext.Do(func() error {
		var err error
		if ls, err = net.Listen("tcp", ":7002"); err != nil {
			return err
		}
		le, err = net.Listen("tcp", ":7003")
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ls.Close(); le.Close() })
	serve := func(l net.Listener, fn func(net.Conn)) {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); fn(c) }()
			}
		}()
	}
	serve(ls, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	serve(le, func(c net.Conn) {
		p := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, p); err != nil {
				return
			}
			if _, err := c.Write(p); err != nil {
				return
			}
		}
	})
	return 7002, 7003
}

// dial opens a TCP connection from inside the client namespace.
func dial(b *testing.B, client *harness.NS, to netip.AddrPort) net.Conn {
	var c net.Conn
	err := client.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", to.String(), 5*time.Second)
		return err
	})
	if err != nil {
		b.Fatalf("dial %s: %v", to, err)
	}
	return c
}

// throughput sends for d and returns Mbit/s as the sender saw it after
// the close (the sink drains all).
func throughput(b *testing.B, client *harness.NS, to netip.AddrPort, d time.Duration) float64 {
	c := dial(b, client, to)
	buf := make([]byte, 128<<10)
	var n int64
	start := time.Now()
	for time.Since(start) < d {
		k, err := c.Write(buf)
		n += int64(k)
		if err != nil {
			b.Fatalf("send to %s: %v", to, err)
		}
	}
	c.Close()
	return float64(n*8) / time.Since(start).Seconds() / 1e6
}

// latency runs n 1-byte round trips on one connection and returns p50
// and p99.
func latency(b *testing.B, client *harness.NS, to netip.AddrPort, n int) (p50, p99 time.Duration) {
	c := dial(b, client, to)
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	p := []byte{1}
	ds := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := c.Write(p); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, p); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	return pct(ds, 50), pct(ds, 99)
}

func pct(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

// applyTimes times ApplyClient with one gateway on n fresh pods and the
// removal (zero config). For scale it also times, on the same pods, the
// raw-netlink floor of a pod's attachment (veth pair into the pod,
// address, routes, both ends up: what a routed-veth ADD does), so the
// tunnel set-up can be read as a ratio of it.
func applyTimes(b *testing.B, tp *topo, n int) (p50, p99, rm50, attach50 time.Duration) {
	cfg := gateway(false, "0.0.0.0/0", "::/0")
	nh, err := openHandle(tp.node.Path(), false)
	if err != nil {
		b.Fatal(err)
	}
	defer nh.Close()
	var ds, rms, ats []time.Duration
	for i := 0; i < n; i++ {
		pod := harness.NewNS(b, "egbench")
		a4 := netip.AddrFrom4([4]byte{10, 100, 1, byte(i + 1)})
		a6 := netip.MustParseAddr(fmt.Sprintf("fd00:100::1:%x", i+1))
		start := time.Now()
		attach(b, nh, pod, fmt.Sprintf("vb%d", i), a4, a6)
		ats = append(ats, time.Since(start))
		start = time.Now()
		if err := ApplyClient(pod.Path(), cfg); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
		start = time.Now()
		if err := ApplyClient(pod.Path(), ClientConfig{}); err != nil {
			b.Fatal(err)
		}
		rms = append(rms, time.Since(start))
	}
	return pct(ds, 50), pct(ds, 99), pct(rms, 50), pct(ats, 50)
}

// attach plugs pod into the node with one netlink socket per side, the
// way a routed-veth ADD does.
func attach(b *testing.B, nh *netlink.Handle, pod *harness.NS, dev string, a4, a6 netip.Addr) {
	f, err := os.Open(pod.Path())
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	ph, err := openHandle(pod.Path(), false)
	if err != nil {
		b.Fatal(err)
	}
	defer ph.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev, Flags: net.FlagUp}, PeerName: "eth0", PeerNamespace: netlink.NsFd(f.Fd())}
	if err := nh.LinkAdd(veth); err != nil {
		b.Fatal(err)
	}
	eth0, err := ph.LinkByName("eth0")
	if err == nil {
		err = ph.LinkSetUp(eth0)
	}
	for _, a := range []netip.Addr{a4, a6} {
		if err == nil {
			err = ph.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD})
		}
	}
	if err == nil {
		err = ph.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(netip.PrefixFrom(gw4, 32)), Scope: netlink.SCOPE_LINK})
	}
	if err == nil {
		err = ph.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: ipOf(gw4)})
	}
	if err == nil {
		err = ph.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: ipOf(gw6), Dst: ipNet(pfx("::/0"))})
	}
	if err == nil {
		var l netlink.Link
		if l, err = nh.LinkByName(dev); err == nil {
			err = nh.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(netip.PrefixFrom(a4, 32)), Scope: netlink.SCOPE_LINK})
		}
	}
	if err != nil {
		b.Fatalf("attach %s: %v", dev, err)
	}
}

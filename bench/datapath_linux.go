package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
)

// measureDataPath compares two pods on one skein node with a bare veth
// pair between two namespaces, in the same run, alternating: TCP
// throughput with iperf3 (one stream) and TCP request/response RTT.
func measureDataPath(ctx context.Context, sc *scope, cfg Config, prog *progress) *DataPath {
	prog.setPhase("data path: setting up two skein pods and a bare veth pair")
	if _, err := exec.LookPath("iperf3"); err != nil {
		sc.Fatalf("iperf3 is not installed (make deps installs it)")
	}
	s := newSkeinContender(cSkein, false)
	s.start(sc)
	pa, pb := harness.NewNS(sc, "bdp"), harness.NewNS(sc, "bdp")
	for _, p := range []struct {
		id string
		ns *harness.NS
	}{{"dp-a", pa}, {"dp-b", pb}} {
		if err := s.add(p.id, p.ns); err != nil {
			sc.Fatalf("attach %s: %v", p.id, err)
		}
	}
	skeinAddr := podAddr4(sc, pa)
	va, vb := harness.NewNS(sc, "bveth"), harness.NewNS(sc, "bveth")
	vethAddr := bareVeth(sc, va, vb)

	dp := &DataPath{}
	for r := 0; r < cfg.IperfRounds && ctx.Err() == nil; r++ {
		prog.setPhase("data path: iperf3 round %d of %d", r+1, cfg.IperfRounds)
		dp.VethGbps = append(dp.VethGbps, iperf(sc, va, vb, vethAddr, cfg.IperfSeconds))
		prog.add(float64(cfg.IperfSeconds) * 10)
		dp.SkeinGbps = append(dp.SkeinGbps, iperf(sc, pa, pb, skeinAddr, cfg.IperfSeconds))
		prog.add(float64(cfg.IperfSeconds) * 10)
	}
	prog.setPhase("data path: TCP request/response")
	dp.VethRTT = tcpRR(sc, va, vb, vethAddr, cfg.RRCount)
	dp.SkeinRTT = tcpRR(sc, pa, pb, skeinAddr, cfg.RRCount)
	prog.add(20)
	for _, p := range []struct {
		id string
		ns *harness.NS
	}{{"dp-a", pa}, {"dp-b", pb}} {
		if err := s.del(p.id, p.ns); err != nil {
			sc.Errorf("detach %s: %v", p.id, err)
		}
	}
	return dp
}

func podAddr4(sc *scope, ns *harness.NS) netip.Addr {
	h := ns.Handle(sc)
	l, err := h.LinkByName("eth0")
	if err != nil {
		sc.Fatalf("eth0 in %s: %v", ns.Name(), err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		sc.Fatalf("no IPv4 address on eth0 in %s: %v", ns.Name(), err)
	}
	a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	return a
}

// bareVeth joins a and b with a veth pair, 10.99.0.1/24 in a and .2 in b
// (MTU 1500, as skein's pods have on a node without uplink), and returns
// a's address.
func bareVeth(sc *scope, a, b *harness.NS) netip.Addr {
	ha, hb := a.Handle(sc), b.Handle(sc)
	bf, err := openNS(b)
	if err != nil {
		sc.Fatal(err)
	}
	defer bf.Close()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0", MTU: 1500, TxQLen: -1}, PeerName: "veth0", PeerTxQLen: -1, PeerNamespace: netlink.NsFd(bf.Fd())}
	if err := ha.LinkAdd(v); err != nil {
		sc.Fatalf("bare veth: %v", err)
	}
	for i, h := range []*netlink.Handle{ha, hb} {
		l, err := h.LinkByName("veth0")
		if err == nil {
			err = h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 99, 0, byte(i+1)), Mask: net.CIDRMask(24, 32)}})
		}
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			sc.Fatalf("bare veth side %d: %v", i, err)
		}
	}
	return netip.MustParseAddr("10.99.0.1")
}

// iperf runs an iperf3 server in srv bound to addr and a client in cli for
// secs seconds; it returns the received throughput in Gbit/s.
func iperf(sc *scope, srv, cli *harness.NS, addr netip.Addr, secs int) float64 {
	server := exec.Command("iperf3", "-s", "-1", "--forceflush", "-B", addr.String(), "-p", "5201")
	stdout, err := server.StdoutPipe()
	if err != nil {
		sc.Fatal(err)
	}
	if err := srv.Do(func() error { return server.Start() }); err != nil {
		sc.Fatalf("iperf3 server: %v", err)
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening") {
				close(ready)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		sc.Fatalf("iperf3 server did not start listening on %s", addr)
	}
	var out []byte
	if err := cli.Do(func() error {
		var err error
		out, err = exec.Command("iperf3", "-c", addr.String(), "-p", "5201", "-t", fmt.Sprint(secs), "-J").Output()
		return err
	}); err != nil {
		sc.Fatalf("iperf3 client to %s: %v\n%s", addr, err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil || res.End.SumReceived.BitsPerSecond == 0 {
		sc.Fatalf("iperf3 result: %v\n%s", err, out)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9
}

// tcpRR measures n one-byte request/response round trips over one TCP
// connection from cli to a server in srv (sockets made inside each
// namespace; the loop itself is ordinary Go).
func tcpRR(sc *scope, srv, cli *harness.NS, addr netip.Addr, n int) Dist {
	var ln net.Listener
	if err := srv.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 5202).String())
		return err
	}); err != nil {
		sc.Fatalf("rr server: %v", err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	var c net.Conn
	if err := cli.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(addr, 5202).String(), 5*time.Second)
		return err
	}); err != nil {
		sc.Fatalf("rr client: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	b := []byte{'x'}
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n+n/10; i++ { // the first tenth warms up
		t0 := time.Now()
		if _, err := c.Write(b); err != nil {
			sc.Fatalf("rr: %v", err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			sc.Fatalf("rr: %v", err)
		}
		if i >= n/10 {
			lat = append(lat, time.Since(t0))
		}
	}
	return distOf(lat)
}

func openNS(ns *harness.NS) (*os.File, error) { return os.Open(ns.Path()) }

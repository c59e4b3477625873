package vm

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"
)

var brMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}

func TestFrameRoundTrip(t *testing.T) {
	for _, c := range []struct{ src, dst string }{
		{"169.254.1.1", "10.64.0.5"},
		{"0.0.0.0", "255.255.255.255"},
		{"fe80::1", "fe80::11:22ff:fe33:4455"},
	} {
		src, dst := netip.MustParseAddr(c.src), netip.MustParseAddr(c.dst)
		b := BuildUDP(brMAC, vmMAC, src, dst, 67, 68, []byte("payload"))
		f, err := ParseFrame(b, false)
		if err != nil {
			t.Fatalf("%s→%s: %v", src, dst, err)
		}
		if f.Src != src || f.Dst != dst || f.SrcPort != 67 || f.DstPort != 68 || string(f.Payload) != "payload" ||
			f.SrcMAC.String() != brMAC.String() || f.DstMAC.String() != vmMAC.String() {
			t.Errorf("%s→%s: parsed %+v", src, dst, f)
		}
	}
	ra := BuildICMP6(brMAC, vmMAC, netip.MustParseAddr("fe80::1"), allNodes, skeinLease().RouterAdvert(LinkLocal(brMAC)))
	f, err := ParseFrame(ra, false)
	if err != nil || f.Proto != protoICMPv6 || f.HopLimit != 255 || f.Payload[0] != 134 {
		t.Errorf("RA: %+v %v", f, err)
	}
}

// TestParseFrameRejects: malformed input is an error, never a panic;
// random garbage included.
func TestParseFrameRejects(t *testing.T) {
	good := BuildUDP(brMAC, vmMAC, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), 68, 67, []byte("x"))
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"empty":          nil,
		"short":          good[:20],
		"vlan":           mut(func(b []byte) []byte { b[12], b[13] = 0x81, 0; return b }),
		"bad ip sum":     mut(func(b []byte) []byte { b[14+10] ^= 0xff; return b }),
		"bad udp sum":    mut(func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b }),
		"fragment":       mut(func(b []byte) []byte { b[14+6] = 0x20; return b }),
		"long total len": mut(func(b []byte) []byte { b[14+2] = 0xff; return b }),
		"oversized":      make([]byte, MaxFrame+1),
	} {
		if _, err := ParseFrame(b, false); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: want ErrMalformed, got %v", name, err)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		b := make([]byte, r.IntN(600))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		if len(b) > 14 && i%2 == 0 {
			copy(b[12:], []byte{0x08, 0x00, 0x45})
		}
		_, _ = ParseFrame(b, false)
	}
}

// TestDHCPFilter runs the socket's BPF program on frames it must keep and
// frames it must leave in the kernel.
func TestDHCPFilter(t *testing.T) {
	vm, err := bpf.NewVM(dhcpFilter)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("fe80::2")
	rs := BuildICMP6(vmMAC, brMAC, v6, netip.MustParseAddr("ff02::2"), []byte{133, 0, 0, 0, 0, 0, 0, 0})
	na := BuildICMP6(vmMAC, brMAC, v6, netip.MustParseAddr("ff02::1"), []byte{136, 0, 0, 0, 0, 0, 0, 0})
	frag := BuildUDP(vmMAC, brMAC, v4, broadcast4, 68, 67, []byte("x"))
	frag[14+6] = 0x20
	withOpts := BuildUDP(vmMAC, brMAC, v4, broadcast4, 68, 67, []byte("x"))
	// An IPv4 header with 4 bytes of options: the filter must follow IHL.
	withOpts = append(withOpts[:14+20], append([]byte{1, 1, 1, 0}, withOpts[14+20:]...)...)
	withOpts[14] = 0x46
	for name, c := range map[string]struct {
		frame []byte
		keep  bool
	}{
		"dhcpv4 to server":  {BuildUDP(vmMAC, brMAC, v4, broadcast4, 68, 67, []byte("x")), true},
		"dhcpv4 ihl 24":     {withOpts, true},
		"dhcpv4 to client":  {BuildUDP(vmMAC, brMAC, v4, broadcast4, 67, 68, []byte("x")), false},
		"other udp":         {BuildUDP(vmMAC, brMAC, v4, broadcast4, 68, 53, []byte("x")), false},
		"ipv4 fragment":     {frag, false},
		"dhcpv6 to server":  {BuildUDP(vmMAC, brMAC, v6, netip.MustParseAddr("ff02::1:2"), 546, 547, []byte("x")), true},
		"dhcpv6 to client":  {BuildUDP(vmMAC, brMAC, v6, v6, 547, 546, []byte("x")), false},
		"router solicit":    {rs, true},
		"neighbour advert":  {na, false},
		"arp":               {append(append(append([]byte{}, brMAC...), vmMAC...), 0x08, 0x06, 0, 1), false},
		"truncated garbage": {[]byte{1, 2, 3}, false},
	} {
		n, err := vm.Run(c.frame)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if (n > 0) != c.keep {
			t.Errorf("%s: filter kept=%v, want %v", name, n > 0, c.keep)
		}
	}
}

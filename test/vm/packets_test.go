package vm

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/vm"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// rawPort is a packet socket on the VM stand-in's interface: the test
// writes frames as the VM and reads what comes back.
type rawPort struct {
	fd      int
	ifindex int
}

func openRaw(t *testing.T, ns *harness.NS, ifName string) *rawPort {
	return openRawProto(t, ns, ifName, unix.ETH_P_IP)
}

// openRawProto is openRaw for another ethertype (unix.ETH_P_IPV6).
func openRawProto(t *testing.T, ns *harness.NS, ifName string, proto uint16) *rawPort {
	t.Helper()
	r := &rawPort{}
	err := ns.Do(func() error {
		ifc, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		r.ifindex = ifc.Index
		r.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	if err := unix.Bind(r.fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: r.ifindex}); err != nil {
		t.Fatal(err)
	}
	// Copies of the frames the test sends would only fill the buffer.
	if err := unix.SetsockoptInt(r.fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		t.Fatal(err)
	}
	_ = unix.SetsockoptInt(r.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	return r
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (r *rawPort) send(t *testing.T, frame []byte) {
	t.Helper()
	to := &unix.SockaddrLinklayer{Ifindex: r.ifindex, Halen: 6}
	copy(to.Addr[:], frame[:6])
	if err := unix.Sendto(r.fd, frame, 0, to); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// replies collects DHCP replies (UDP to port 68) for xid until d passes.
func (r *rawPort) replies(t *testing.T, xid dhcpv4.TransactionID, d time.Duration) []*dhcpv4.DHCPv4 {
	t.Helper()
	var out []*dhcpv4.DHCPv4
	r.frames(d, func(f vm.Frame) {
		if f.DstPort != 68 {
			return
		}
		if m, err := dhcpv4.FromBytes(f.Payload); err == nil && m.TransactionID == xid {
			out = append(out, m)
		}
	})
	return out
}

// frames hands each well-formed frame received until d passes to fn.
func (r *rawPort) frames(d time.Duration, fn func(vm.Frame)) {
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		tv := unix.NsecToTimeval(int64(time.Until(deadline)) + 1)
		_ = unix.SetsockoptTimeval(r.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			continue
		}
		if f, err := vm.ParseFrame(buf[:n], true); err == nil {
			fn(f)
		}
	}
}

// TestHostilePackets: malformed, truncated, foreign-MAC and relayed DHCP
// packets from the VM's port are dropped without an answer and without
// harming skeind; a proper DISCOVER right after is answered.
func TestHostilePackets(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-hostile", "1.1.0", nil)
	p := e.mustAddVM(t, l, "hostile")
	vmNS, ifName := p.vmSide(t)
	raw := openRaw(t, vmNS, ifName)
	mac, _ := net.ParseMAC(p.vmMAC)
	foreign := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	zero, all := netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255")

	discover := func(chaddr net.HardwareAddr, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
		m, err := dhcpv4.NewDiscovery(chaddr, mods...)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	udp := func(src net.HardwareAddr, payload []byte) []byte {
		return vm.BuildUDP(src, bcast, zero, all, 68, 67, payload)
	}
	for _, c := range []struct {
		name  string
		msg   *dhcpv4.DHCPv4
		frame func(m *dhcpv4.DHCPv4) []byte
	}{
		{"foreign MAC", discover(foreign), func(m *dhcpv4.DHCPv4) []byte { return udp(foreign, m.ToBytes()) }},
		{"foreign chaddr from the VM's MAC", discover(foreign), func(m *dhcpv4.DHCPv4) []byte { return udp(mac, m.ToBytes()) }},
		{"relayed", discover(mac, dhcpv4.WithGatewayIP(net.IPv4(10, 1, 1, 1))), func(m *dhcpv4.DHCPv4) []byte { return udp(mac, m.ToBytes()) }},
		{"truncated DHCP", discover(mac), func(m *dhcpv4.DHCPv4) []byte { return udp(mac, m.ToBytes()[:100]) }},
		{"bad magic cookie", discover(mac), func(m *dhcpv4.DHCPv4) []byte {
			b := m.ToBytes()
			b[236] ^= 0xff
			return udp(mac, b)
		}},
		{"option overruns the packet", discover(mac), func(m *dhcpv4.DHCPv4) []byte {
			b := m.ToBytes()[:240]
			return udp(mac, append(b, 53, 200, 1))
		}},
		{"bad UDP checksum", discover(mac), func(m *dhcpv4.DHCPv4) []byte {
			f := udp(mac, m.ToBytes())
			f[14+20+6] ^= 0x55
			return f
		}},
		{"UDP length beyond the packet", discover(mac), func(m *dhcpv4.DHCPv4) []byte {
			f := udp(mac, m.ToBytes())
			f[14+20+4], f[14+20+5] = 0xff, 0xff
			return f
		}},
		{"IP total length beyond the frame", discover(mac), func(m *dhcpv4.DHCPv4) []byte {
			f := udp(mac, m.ToBytes())
			f[14+2], f[14+3] = 0x0f, 0xff
			return f
		}},
	} {
		raw.send(t, c.frame(c.msg))
		if got := raw.replies(t, c.msg.TransactionID, 300*time.Millisecond); len(got) != 0 {
			t.Errorf("%s: the server should drop it, it answered %s", c.name, got[0].MessageType())
		}
	}
	// Still alive, still serving.
	good := discover(mac)
	raw.send(t, udp(mac, good.ToBytes()))
	got := raw.replies(t, good.TransactionID, 2*time.Second)
	if len(got) != 1 || got[0].MessageType() != dhcpv4.MessageTypeOffer || !got[0].YourIPAddr.Equal(p.addr4.Addr().AsSlice()) {
		t.Fatalf("a proper DISCOVER after the garbage should get one OFFER of %s, got %v", p.addr4.Addr(), got)
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.d.Admin(t).Status(c, &rpc.Empty{}); err != nil {
		t.Errorf("skeind should still answer: %v", err)
	}
}

// TestNoDHCPLeak: while a client takes a lease, renews (unicast towards
// the gateway's MAC) and releases, no DHCP frame leaves the pod through
// the main plugin's veth: the node side of it sees none.
func TestNoDHCPLeak(t *testing.T) {
	skeintest.RequireTool(t, "udhcpc")
	e := newEnv(t)
	l := e.skeinChain(t, "vm-leak", "1.1.0", nil)
	p := e.mustAddVM(t, l, "leak")
	hostVeth := p.res.Interfaces[0].Name // skein's host side, in the node namespace
	var fd int
	err := e.d.Node.Do(func() error {
		ifc, err := net.InterfaceByName(hostVeth)
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index})
		}
		return err
	})
	if err != nil {
		t.Fatalf("capture on the node's side of the pod veth %s: %v", hostVeth, err)
	}
	defer unix.Close(fd)

	vmNS, ifName := p.vmSide(t)
	dir, script := clientScript(t, udhcpcScript)
	cmd := startIn(t, vmNS, "udhcpc", "-f", "-R", "-i", ifName, "-s", script, "-t", "10", "-T", "1")
	if !waitEvent(t, dir, "bound", 15*time.Second) {
		t.Fatal("no lease")
	}
	_ = cmd.Process.Signal(syscall.SIGUSR1)
	if !waitEvent(t, dir, "renew", 10*time.Second) {
		t.Error("no renewal")
	}
	// Traffic that must cross the veth does: the gateway answers a ping
	// (while the lease holds: the release below takes the address away).
	if err := harness.Ping(t, vmNS, p.gw4); err != nil {
		t.Errorf("ping the gateway through the veth: %v", err)
	}
	// The release; udhcpc's events already hold the "deconfig" of its
	// start, so wait for the second one.
	_ = cmd.Process.Signal(syscall.SIGUSR2)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && countEvent(dir, "deconfig") < 2; {
		time.Sleep(50 * time.Millisecond)
	}

	var dhcp, frames int
	buf := make([]byte, 2048)
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	for {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			break
		}
		frames++
		if f, err := vm.ParseFrame(buf[:n], true); err == nil && f.Proto == 17 &&
			(f.DstPort == 67 || f.DstPort == 68 || f.DstPort == 546 || f.DstPort == 547) {
			dhcp++
		}
	}
	if dhcp != 0 {
		t.Errorf("%d DHCP frames crossed the pod's veth to the node; the bridge filter should drop them all", dhcp)
	}
	if frames == 0 {
		t.Error("the capture saw nothing at all on the veth (not even the ping): it proves nothing")
	}
}

// countEvent is how many times a client script recorded event in dir.
func countEvent(dir, event string) int {
	b, _ := os.ReadFile(filepath.Join(dir, "events"))
	n := 0
	for _, e := range strings.Fields(string(b)) {
		if e == event {
			n++
		}
	}
	return n
}

// TestFloodIsRateLimited: a guest that floods its port with requests that
// only earn a NAK, or with router solicitations, gets a bounded number of
// answers (a token bucket per port: a small burst, then one per period),
// while a proper request is still answered at once.
func TestFloodIsRateLimited(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-flood", "1.1.0", nil)
	p := e.mustAddVM(t, l, "flood")
	if !p.addr6.IsValid() {
		t.Fatal("the default test pool is dual-stack: the pod should have an IPv6 address")
	}
	vmNS, ifName := p.vmSide(t)
	mac, _ := net.ParseMAC(p.vmMAC)
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	zero, all := netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255")
	const flood = 200

	// DHCPv4: REQUESTs for an address that is not the VM's, each worth a NAK.
	raw := openRaw(t, vmNS, ifName)
	wrong := p.addr4.Addr().Next()
	bad, err := dhcpv4.NewDiscovery(mac, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(wrong.AsSlice())))
	if err != nil {
		t.Fatal(err)
	}
	frame := vm.BuildUDP(mac, bcast, zero, all, 68, 67, bad.ToBytes())
	got := make(chan []*dhcpv4.DHCPv4)
	go func() { got <- raw.replies(t, bad.TransactionID, 1500*time.Millisecond) }()
	for range flood {
		raw.send(t, frame)
	}
	naks := 0
	for _, m := range <-got {
		if m.MessageType() == dhcpv4.MessageTypeNak {
			naks++
		}
	}
	// Burst 4, one a second; the flood takes well under a second.
	if naks < 1 || naks > 6 {
		t.Errorf("%d REQUESTs for %s (not the lease) got %d NAKs; want at least 1 and at most 6 (burst 4, then one a second)", flood, wrong, naks)
	}
	good, err := dhcpv4.NewDiscovery(mac)
	if err != nil {
		t.Fatal(err)
	}
	raw.send(t, vm.BuildUDP(mac, bcast, zero, all, 68, 67, good.ToBytes()))
	if got := raw.replies(t, good.TransactionID, 2*time.Second); len(got) != 1 || got[0].MessageType() != dhcpv4.MessageTypeOffer {
		t.Errorf("a proper DISCOVER right after the NAK flood should get one OFFER, got %v", got)
	}

	// IPv6: router solicitations from a link-local address; the answers
	// are addressed to it (the periodic advertisements go to ff02::1).
	raw6 := openRawProto(t, vmNS, ifName, unix.ETH_P_IPV6)
	src := netip.MustParseAddr("fe80::5c:1:2:3")
	allRouters := netip.MustParseAddr("ff02::2")
	rs := vm.BuildICMP6(mac, net.HardwareAddr{0x33, 0x33, 0, 0, 0, 2}, src, allRouters, []byte{133, 0, 0, 0, 0, 0, 0, 0})
	counted := make(chan int)
	go func() {
		n := 0
		raw6.frames(1500*time.Millisecond, func(f vm.Frame) {
			if f.Proto == 58 && len(f.Payload) > 0 && f.Payload[0] == 134 && f.Dst == src {
				n++
			}
		})
		counted <- n
	}()
	for range flood {
		raw6.send(t, rs)
	}
	ras := <-counted
	// Burst 3, one per 3 s.
	if ras < 1 || ras > 4 {
		t.Errorf("%d router solicitations got %d solicited advertisements; want at least 1 and at most 4 (burst 3, then one per 3 s)", flood, ras)
	}

	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.d.Admin(t).Status(c, &rpc.Empty{}); err != nil {
		t.Errorf("skeind should still answer: %v", err)
	}
}

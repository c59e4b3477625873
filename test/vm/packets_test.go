package vm

import (
	"context"
	"net"
	"net/netip"
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
	t.Helper()
	r := &rawPort{}
	err := ns.Do(func() error {
		ifc, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		r.ifindex = ifc.Index
		r.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	if err := unix.Bind(r.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: r.ifindex}); err != nil {
		t.Fatal(err)
	}
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
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		tv := unix.NsecToTimeval(int64(time.Until(deadline)) + 1)
		_ = unix.SetsockoptTimeval(r.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			continue
		}
		f, err := vm.ParseFrame(buf[:n], true)
		if err != nil || f.DstPort != 68 {
			continue
		}
		if m, err := dhcpv4.FromBytes(f.Payload); err == nil && m.TransactionID == xid {
			out = append(out, m)
		}
	}
	return out
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
	// (while the lease is configured: the release below flushes it, and
	// waiting for "deconfig" cannot tell, udhcpc runs it at start too).
	if err := harness.Ping(t, vmNS, p.gw4); err != nil {
		t.Errorf("ping the gateway through the veth: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGUSR2)
	waitEvent(t, dir, "deconfig", 5*time.Second)

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

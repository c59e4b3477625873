package vm

import (
	"crypto/rand"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/vm"
)

// TestGuestOwnMACOnly: the guest is not trusted. Frames it sends from ever
// new source MACs do not grow the pod bridge's forwarding table (the tap
// port learns nothing: before, 20,000 such frames made 20,000 entries,
// kept for 300 s each), and a frame from any source MAC but the VM's goes
// nowhere; the same frame from the VM's MAC does.
func TestGuestOwnMACOnly(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-ownmac", "1.1.0", nil)
	p := e.mustAddVM(t, l, "ownmac")
	tap, err := vm.OpenTap(p.ns.Path(), p.tap)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	h := p.ns.Handle(t)
	br, err := h.LinkByName(p.bridge)
	if err != nil {
		t.Fatal(err)
	}
	entries := func() int {
		ns, err := h.NeighList(0, unix.AF_BRIDGE)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, x := range ns {
			if x.MasterIndex == br.Attrs().Index {
				n++
			}
		}
		return n
	}
	// What reaches the bridge itself (broadcasts are delivered to it as
	// to every port).
	seen := openRawProto(t, p.ns, p.bridge, 0x88b5)
	vmMAC, _ := net.ParseMAC(p.vmMAC)
	frame := func(src net.HardwareAddr, tag byte) []byte {
		f := make([]byte, 60)
		copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(f[6:], src)
		f[12], f[13], f[14] = 0x88, 0xb5, tag
		return f
	}
	// The port learns nothing, the filter notwithstanding (which drops
	// those frames before the bridge would learn from them).
	tl, err := h.LinkByName(p.tap)
	if err != nil {
		t.Fatal(err)
	}
	if pi, err := h.LinkGetProtinfo(tl); err != nil || pi.Learning {
		t.Errorf("the tap port learns source MACs (%+v, %v)", pi, err)
	}
	before := entries()
	src := make(net.HardwareAddr, 6)
	for range 2000 {
		rand.Read(src)
		src[0] = src[0]&^1 | 2 // unicast, locally administered
		if _, err := tap.Write(frame(src, 1)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if after := entries(); after > before+2 {
		t.Errorf("2000 frames from random source MACs grew the bridge's table from %d to %d entries", before, after)
	}
	got := func(tag byte) bool {
		found := false
		deadline := time.Now().Add(300 * time.Millisecond)
		buf := make([]byte, 128)
		for time.Now().Before(deadline) {
			tv := unix.NsecToTimeval(int64(time.Until(deadline)) + 1)
			_ = unix.SetsockoptTimeval(seen.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			n, _, err := unix.Recvfrom(seen.fd, buf, 0)
			if err == nil && n > 14 && buf[14] == tag {
				found = true
			}
		}
		return found
	}
	got(1) // drain what came through before
	rand.Read(src)
	src[0] = src[0]&^1 | 2
	if _, err := tap.Write(frame(src, 2)); err != nil {
		t.Fatal(err)
	}
	if got(2) {
		t.Error("a frame from the guest with another source MAC reached the bridge")
	}
	if _, err := tap.Write(frame(vmMAC, 3)); err != nil {
		t.Fatal(err)
	}
	if !got(3) {
		t.Fatal("a frame from the VM's own MAC did not reach the bridge: the test cannot see frames")
	}
}

// TestBridgeDownAndUp: the pod's bridge going down and up (anything in the
// pod with CAP_NET_ADMIN, or an operator) does not end the DHCP server:
// its socket reports the link going down once, and it serves again once
// the link is up. Before, that one error ended it for good, and the VM
// lost its address at its lease's end.
func TestBridgeDownAndUp(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-bounce", "1.1.0", nil)
	p := e.mustAddVM(t, l, "bounce")
	vmNS, ifName := p.vmSide(t)
	raw := openRaw(t, vmNS, ifName)
	mac, _ := net.ParseMAC(p.vmMAC)
	answers := func() int {
		d, err := dhcpv4.NewDiscovery(mac)
		if err != nil {
			t.Fatal(err)
		}
		raw.send(t, vm.BuildUDP(mac, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
			netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"), 68, 67, d.ToBytes()))
		return len(raw.replies(t, d.TransactionID, 2*time.Second))
	}
	if n := answers(); n != 1 {
		t.Fatalf("%d answers to a DISCOVER before", n)
	}
	h := p.ns.Handle(t)
	br, err := h.LinkByName(p.bridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetDown(br); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := h.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	// The ports forward again once the bridge is up; a client retries.
	var n int
	for try := 0; try < 5 && n == 0; try++ {
		n = answers()
	}
	if n != 1 {
		t.Errorf("%d answers to a DISCOVER after the bridge went down and up", n)
	}
}

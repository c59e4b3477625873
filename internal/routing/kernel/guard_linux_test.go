package kernel_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
)

// TestVXLANGuard: in vxlan mode a node takes VXLAN packets from its peers
// only. A host on the underlay that is not a node (and so not a peer)
// sends node1 a packet carrying node2's pod as the inner source, to
// node1's pod: it must not arrive. The same packet from node2 does (the
// test can see one arrive). skeind --uninstall removes the guard with the
// rest (cmd/skeind TestUninstall).
func TestVXLANGuard(t *testing.T) {
	u := newUnderlay(t)
	n1, n2, stranger := newNode(t, 1), newNode(t, 2), newNode(t, 9)
	for i, n := range []*node{n1, n2, stranger} {
		u.attach(t, n, 0, pfx(fmt.Sprintf("192.168.50.%d/24", []int{1, 2, 9}[i])))
	}
	settle(t, n1, n2, stranger)
	nodes := []*node{n1, n2}
	var ks []*kernel.Kernel
	for _, n := range nodes {
		k := newKernel(t, n, vxlanCfg(n, false))
		requireInstalled(t, mustSync(t, k, remotes(n, nodes...)))
		ks = append(ks, k)
	}

	// A UDP socket of node1's pod, for what gets through.
	var conn *net.UDPConn
	if err := n1.pod.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: n1.podIPs[0].AsSlice(), Port: 7777})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	frame := vxlanFrame(kernel.MACFor(n1.addrs[0]), n2.podIPs[0], n1.podIPs[0], 7777, "spoofed")
	send := func(from *node) {
		t.Helper()
		if err := from.ns.Do(func() error {
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(n1.addrs[0], uint16(routing.DefaultVXLANPort))))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write(frame)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	got := func() string {
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		b := make([]byte, 64)
		n, _, err := conn.ReadFromUDP(b)
		if err != nil {
			return ""
		}
		return string(b[:n])
	}
	send(stranger)
	if s := got(); s != "" {
		t.Errorf("a packet from a host that is no peer reached node1's pod: %q", s)
	}
	send(n2)
	if s := got(); s != "spoofed" {
		t.Fatalf("the same packet from node2 did not arrive (got %q): the test cannot see delivery", s)
	}
	// node2's blocks go (an incremental update, not a full Sync): its
	// packets are refused too.
	if _, err := ks[0].Update(t.Context(), n2.blocks, nil); err != nil {
		t.Fatal(err)
	}
	send(n2)
	if s := got(); s != "" {
		t.Errorf("a packet from a node that is no peer any more reached node1's pod: %q", s)
	}
	// And back, the same way: admitted again.
	if _, err := ks[0].Update(t.Context(), n2.blocks, remotes(n1, nodes...)); err != nil {
		t.Fatal(err)
	}
	send(n2)
	if s := got(); s != "spoofed" {
		t.Errorf("a packet from node2, a peer again, did not arrive (got %q)", s)
	}
}

// vxlanFrame is a VXLAN payload (VNI routing.DefaultVXLANVNI) holding an
// Ethernet frame to dstMAC with an IPv4 UDP packet src → dst:port.
func vxlanFrame(dstMAC net.HardwareAddr, src, dst netip.Addr, port int, payload string) []byte {
	b := make([]byte, 8, 8+14+20+8+len(payload))
	b[0] = 0x08 // I flag: the VNI is valid
	binary.BigEndian.PutUint32(b[4:], uint32(routing.DefaultVXLANVNI)<<8)
	b = append(b, dstMAC...)
	b = append(b, 0x02, 0, 0, 0, 0, 0x99) // source MAC
	b = append(b, 0x08, 0x00)
	ipStart := len(b)
	b = append(b, 0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0)
	b = append(b, src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	binary.BigEndian.PutUint16(b[ipStart+2:], uint16(20+8+len(payload)))
	var sum uint32
	for i := ipStart; i < ipStart+20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(b[ipStart+10:], ^uint16(sum))
	b = binary.BigEndian.AppendUint16(b, 40000)
	b = binary.BigEndian.AppendUint16(b, uint16(port))
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(payload)))
	b = append(b, 0, 0) // no UDP checksum (IPv4)
	return append(b, payload...)
}

package harness

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Ping sends one ICMP (v4 or v6, chosen by addr) echo request from inside
// ns and waits up to a second for the matching reply, like `ping -c1 -W1`.
//
// It is implemented in-process over a raw socket created inside the
// namespace, so the tests need no ping binary (the test machines have none).
func Ping(t testing.TB, from *NS, addr netip.Addr) error {
	t.Helper()
	addr = addr.Unmap()
	family, proto, echoReq, echoRep := unix.AF_INET, unix.IPPROTO_ICMP, byte(8), byte(0)
	if addr.Is6() {
		family, proto, echoReq, echoRep = unix.AF_INET6, unix.IPPROTO_ICMPV6, 128, 129
	}
	var fd int
	if err := from.Do(func() error {
		var err error
		fd, err = unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		return err
	}); err != nil {
		return fmt.Errorf("ping %s from %s: socket: %w", addr, from.name, err)
	}
	defer unix.Close(fd)

	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id, seq := binary.BigEndian.Uint16(idb[:]), uint16(1)
	msg := make([]byte, 8+32)
	msg[0] = echoReq
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], seq)
	copy(msg[8:], "skein harness ping payload......")
	var sa unix.Sockaddr
	if addr.Is4() {
		binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
		sa = &unix.SockaddrInet4{Addr: addr.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: addr.As16()} // kernel fills the ICMPv6 checksum
	}
	if err := unix.Sendto(fd, msg, 0, sa); err != nil {
		return fmt.Errorf("ping %s from %s: send: %w", addr, from.name, err)
	}

	deadline := time.Now().Add(time.Second)
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("ping %s from %s: no reply within 1s", addr, from.name)
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("ping %s: set timeout: %w", addr, err)
		}
		n, peer, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("ping %s from %s: receive: %w", addr, from.name, err)
		}
		var src netip.Addr
		switch p := peer.(type) {
		case *unix.SockaddrInet4:
			src = netip.AddrFrom4(p.Addr)
		case *unix.SockaddrInet6:
			src = netip.AddrFrom16(p.Addr)
		}
		b := buf[:n]
		if addr.Is4() && n >= 20 { // raw IPv4 sockets deliver the IP header too
			b = b[int(b[0]&0x0f)*4:]
		}
		if src != addr || len(b) < 8 || b[0] != echoRep ||
			binary.BigEndian.Uint16(b[4:]) != id || binary.BigEndian.Uint16(b[6:]) != seq {
			continue
		}
		return nil
	}
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

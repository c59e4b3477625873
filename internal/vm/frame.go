package vm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// The DHCP server reads and writes whole Ethernet frames on the pod's
// bridge (see server_linux.go), so it builds and checks the IPv4/IPv6 and
// UDP/ICMPv6 headers itself. Everything here is pure.

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	protoUDP      = 17
	protoICMPv6   = 58
	ethHeaderLen  = 14
	ip4HeaderLen  = 20
	ip6HeaderLen  = 40
	udpHeaderLen  = 8
	// MaxFrame is the largest frame the server accepts: a 1500-byte
	// payload and the Ethernet header. DHCP messages are far smaller.
	MaxFrame = 1514
)

// Frame is a parsed IPv4/IPv6 packet carrying UDP or ICMPv6.
type Frame struct {
	SrcMAC, DstMAC   net.HardwareAddr
	Src, Dst         netip.Addr
	Proto            uint8 // protoUDP or protoICMPv6
	HopLimit         uint8 // IPv6 only
	SrcPort, DstPort uint16
	Payload          []byte // UDP payload or the whole ICMPv6 message
}

// ErrMalformed wraps every reason ParseFrame rejects a frame.
var ErrMalformed = errors.New("malformed frame")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// ParseFrame checks and decodes an Ethernet frame holding IPv4+UDP,
// IPv6+UDP or IPv6+ICMPv6 (no VLAN tags, IP options are skipped, no IPv6
// extension headers, no fragments). Checksums are verified, but for the
// UDP/ICMPv6 one when partialL4 says the sender left it to offload (a
// packet socket learns so from PACKET_AUXDATA: the frame was sent by a
// local stack and its checksum field holds only the pseudo-header sum).
func ParseFrame(b []byte, partialL4 bool) (Frame, error) {
	var f Frame
	if len(b) < ethHeaderLen {
		return f, malformed("%d bytes: shorter than an Ethernet header", len(b))
	}
	if len(b) > MaxFrame {
		return f, malformed("%d bytes: larger than %d", len(b), MaxFrame)
	}
	f.DstMAC, f.SrcMAC = net.HardwareAddr(b[0:6]), net.HardwareAddr(b[6:12])
	p := b[ethHeaderLen:]
	switch et := binary.BigEndian.Uint16(b[12:]); et {
	case etherTypeIPv4:
		return f, parse4(&f, p, partialL4)
	case etherTypeIPv6:
		return f, parse6(&f, p, partialL4)
	default:
		return f, malformed("ethertype %#04x", et)
	}
}

func parse4(f *Frame, p []byte, partialL4 bool) error {
	if len(p) < ip4HeaderLen || p[0]>>4 != 4 {
		return malformed("not an IPv4 header")
	}
	ihl := int(p[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(p[2:]))
	if ihl < ip4HeaderLen || total < ihl || total > len(p) {
		return malformed("IPv4 lengths: header %d, total %d, have %d", ihl, total, len(p))
	}
	if binary.BigEndian.Uint16(p[6:])&0x3fff != 0 {
		return malformed("IPv4 fragment")
	}
	if checksum(p[:ihl], 0) != 0 {
		return malformed("IPv4 header checksum")
	}
	f.Proto = p[9]
	f.Src = netip.AddrFrom4([4]byte(p[12:16]))
	f.Dst = netip.AddrFrom4([4]byte(p[16:20]))
	if f.Proto != protoUDP {
		return malformed("IPv4 protocol %d", f.Proto)
	}
	return parseUDP(f, p[ihl:total], pseudo4(f.Src, f.Dst, protoUDP, total-ihl), partialL4)
}

func parse6(f *Frame, p []byte, partialL4 bool) error {
	if len(p) < ip6HeaderLen || p[0]>>4 != 6 {
		return malformed("not an IPv6 header")
	}
	plen := int(binary.BigEndian.Uint16(p[4:]))
	if ip6HeaderLen+plen > len(p) {
		return malformed("IPv6 payload length %d, have %d", plen, len(p)-ip6HeaderLen)
	}
	f.Proto, f.HopLimit = p[6], p[7]
	f.Src = netip.AddrFrom16([16]byte(p[8:24]))
	f.Dst = netip.AddrFrom16([16]byte(p[24:40]))
	body := p[ip6HeaderLen : ip6HeaderLen+plen]
	ps := pseudo6(f.Src, f.Dst, f.Proto, plen)
	switch f.Proto {
	case protoUDP:
		return parseUDP(f, body, ps, partialL4)
	case protoICMPv6:
		if len(body) < 4 {
			return malformed("short ICMPv6 message")
		}
		if !partialL4 && checksum(body, ps) != 0 {
			return malformed("ICMPv6 checksum")
		}
		f.Payload = body
		return nil
	default:
		return malformed("IPv6 next header %d", f.Proto)
	}
}

func parseUDP(f *Frame, u []byte, ps uint32, partialL4 bool) error {
	if len(u) < udpHeaderLen {
		return malformed("short UDP header")
	}
	ulen := int(binary.BigEndian.Uint16(u[4:]))
	if ulen < udpHeaderLen || ulen > len(u) {
		return malformed("UDP length %d, have %d", ulen, len(u))
	}
	if sum := binary.BigEndian.Uint16(u[6:]); !partialL4 && (sum != 0 || f.Src.Is6()) {
		// A zero UDP checksum means "none" in IPv4 only.
		if checksum(u[:ulen], ps) != 0 {
			return malformed("UDP checksum")
		}
	}
	f.SrcPort = binary.BigEndian.Uint16(u[0:])
	f.DstPort = binary.BigEndian.Uint16(u[2:])
	f.Payload = u[udpHeaderLen:ulen]
	return nil
}

// BuildUDP returns an Ethernet frame carrying payload in UDP over IPv4 or
// IPv6 (chosen by src), checksums filled in.
func BuildUDP(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	u := make([]byte, udpHeaderLen+len(payload))
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[udpHeaderLen:], payload)
	var ps uint32
	if src.Is4() {
		ps = pseudo4(src, dst, protoUDP, len(u))
	} else {
		ps = pseudo6(src, dst, protoUDP, len(u))
	}
	sum := checksum(u, ps)
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	return ipFrame(srcMAC, dstMAC, src, dst, protoUDP, 64, u)
}

// BuildICMP6 returns an Ethernet frame carrying the ICMPv6 message msg
// (its checksum field is filled in) with hop limit 255, as neighbour
// discovery requires.
func BuildICMP6(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, msg []byte) []byte {
	m := append([]byte(nil), msg...)
	m[2], m[3] = 0, 0
	binary.BigEndian.PutUint16(m[2:], checksum(m, pseudo6(src, dst, protoICMPv6, len(m))))
	return ipFrame(srcMAC, dstMAC, src, dst, protoICMPv6, 255, m)
}

func ipFrame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, proto, ttl uint8, body []byte) []byte {
	var b []byte
	b = append(b, dstMAC[:6]...)
	b = append(b, srcMAC[:6]...)
	if src.Is4() {
		b = binary.BigEndian.AppendUint16(b, etherTypeIPv4)
		h := make([]byte, ip4HeaderLen)
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(ip4HeaderLen+len(body)))
		h[8], h[9] = ttl, proto
		s, d := src.As4(), dst.As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		binary.BigEndian.PutUint16(h[10:], checksum(h, 0))
		b = append(b, h...)
	} else {
		b = binary.BigEndian.AppendUint16(b, etherTypeIPv6)
		h := make([]byte, ip6HeaderLen)
		h[0] = 0x60
		binary.BigEndian.PutUint16(h[4:], uint16(len(body)))
		h[6], h[7] = proto, ttl
		s, d := src.As16(), dst.As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
		b = append(b, h...)
	}
	return append(b, body...)
}

func pseudo4(src, dst netip.Addr, proto uint8, length int) uint32 {
	s, d := src.As4(), dst.As4()
	return sum16(s[:]) + sum16(d[:]) + uint32(proto) + uint32(length)
}

func pseudo6(src, dst netip.Addr, proto uint8, length int) uint32 {
	s, d := src.As16(), dst.As16()
	return sum16(s[:]) + sum16(d[:]) + uint32(length>>16) + uint32(length&0xffff) + uint32(proto)
}

func sum16(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

// checksum is the Internet checksum of b plus the partial sum initial; a
// buffer holding a correct checksum sums to 0.
func checksum(b []byte, initial uint32) uint16 {
	s := initial + sum16(b)
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

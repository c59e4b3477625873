package vm

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv6"
)

// The seed corpora under testdata/fuzz are real packets: udhcpc (busybox
// 1.35), ISC dhclient 4.4 (-4 and -6) and dhcpcd 9.4 getting, renewing and
// releasing a lease, recorded on the far end of a veth, most of them
// against skein's own server (StartServer on a bridge, the lease of
// fuzzLease); the dnsmasq-named ones against dnsmasq. Frames whose UDP
// checksum the sending kernel left to offload are marked partial, as the
// server learns from PACKET_AUXDATA. The DHCPv4 DECLINE and INFORM and the
// DHCPv6 REBIND, RELEASE, CONFIRM, DECLINE and rapid-commit SOLICIT are
// dhclient's captured REQUEST and RENEW with the message type changed (and
// the server identifier dropped where RFC 8415 says to), built with
// github.com/insomniacslk/dhcp.

// fuzzLease is the lease the captures were served: dual stack, skein's
// gateways, a short lease time so the clients renewed.
func fuzzLease() *Lease {
	l := v6Lease()
	l.DNS6 = []netip.Addr{netip.MustParseAddr("fd00:96::a")}
	return l
}

// FuzzParseFrame: ParseFrame never panics, refuses with ErrMalformed, and
// what it accepts is built again by BuildUDP or BuildICMP6 into a frame
// that parses to the same fields.
func FuzzParseFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte, partialL4 bool) {
		fr, err := ParseFrame(b, partialL4)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseFrame error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(b) > MaxFrame {
			t.Fatalf("accepted a frame of %d bytes (max %d)", len(b), MaxFrame)
		}
		if fr.Src.Is4() != (fr.Dst.Is4()) || fr.Src.Is4() != (b[12] == 0x08 && b[13] == 0x00) {
			t.Fatalf("address families %v→%v do not match ethertype %#x%02x", fr.Src, fr.Dst, b[12], b[13])
		}
		var again []byte
		switch fr.Proto {
		case protoUDP:
			again = BuildUDP(fr.SrcMAC, fr.DstMAC, fr.Src, fr.Dst, fr.SrcPort, fr.DstPort, fr.Payload)
		case protoICMPv6:
			again = BuildICMP6(fr.SrcMAC, fr.DstMAC, fr.Src, fr.Dst, fr.Payload)
		default:
			t.Fatalf("accepted protocol %d", fr.Proto)
		}
		back, err := ParseFrame(again, false)
		if err != nil {
			t.Fatalf("frame built from an accepted one does not parse: %v", err)
		}
		same := bytes.Equal(back.SrcMAC, fr.SrcMAC) && bytes.Equal(back.DstMAC, fr.DstMAC) &&
			back.Src == fr.Src && back.Dst == fr.Dst && back.Proto == fr.Proto &&
			back.SrcPort == fr.SrcPort && back.DstPort == fr.DstPort
		if fr.Proto == protoICMPv6 {
			// The checksum is written anew (offloaded or ±0 may differ).
			same = same && len(back.Payload) == len(fr.Payload) && back.HopLimit == 255 &&
				bytes.Equal(back.Payload[:2], fr.Payload[:2]) && bytes.Equal(back.Payload[4:], fr.Payload[4:])
		} else {
			same = same && bytes.Equal(back.Payload, fr.Payload)
		}
		if !same {
			t.Fatalf("re-serialized frame parses differently:\n%+v\n%+v", fr, back)
		}
	})
}

// FuzzDHCP4: the payload of a UDP datagram from the VM to port 67, taken
// the way Server.handle takes it (frame, decoder, Answer4, reply frame).
// A reply, when there is one, is for the VM's MAC only, offers no address
// but the lease's, goes to the VM's MAC, and decodes again.
func FuzzDHCP4(f *testing.F) {
	l := fuzzLease()
	mac := l.HWAddr()
	addr := l.Addr4.Addr()
	v6only := fuzzLease()
	v6only.Addr4 = netip.Prefix{}
	f.Fuzz(func(t *testing.T, payload []byte) {
		in := BuildUDP(mac, bcastMAC, netip.IPv4Unspecified(), broadcast4, 68, 67, payload)
		fr, err := ParseFrame(in, false)
		if err != nil {
			if len(in) <= MaxFrame {
				t.Fatalf("a well-formed frame was refused: %v", err)
			}
			return
		}
		req, err := dhcpv4.FromBytes(fr.Payload)
		if err != nil {
			return // counted as malformed and dropped
		}
		if rep, why := Answer4(v6only, req); rep != nil {
			t.Fatalf("a lease without IPv4 answered %s: %v", req.MessageType(), rep.Msg)
		} else if why == "" {
			t.Fatal("a dropped request without a reason")
		}
		rep, why := Answer4(l, req)
		if rep == nil {
			if why == "" {
				t.Fatal("a dropped request without a reason")
			}
			return
		}
		m := rep.Msg
		switch {
		case !bytes.Equal(req.ClientHWAddr, mac):
			t.Fatalf("answered a request for chaddr %s (the VM is %s)", req.ClientHWAddr, mac)
		case !bytes.Equal(m.ClientHWAddr, mac):
			t.Fatalf("reply for chaddr %s", m.ClientHWAddr)
		case m.TransactionID != req.TransactionID:
			t.Fatalf("reply xid %v to request xid %v", m.TransactionID, req.TransactionID)
		case m.OpCode != dhcpv4.OpcodeBootReply:
			t.Fatalf("reply opcode %v", m.OpCode)
		}
		yi, _ := netip.AddrFromSlice(m.YourIPAddr.To4())
		switch mt := m.MessageType(); mt {
		case dhcpv4.MessageTypeOffer:
			if yi != addr {
				t.Fatalf("OFFER of %v, the lease is %s", m.YourIPAddr, addr)
			}
		case dhcpv4.MessageTypeAck:
			inform := req.MessageType() == dhcpv4.MessageTypeInform
			if inform && !zero4(m.YourIPAddr) || !inform && yi != addr {
				t.Fatalf("ACK to %s with yiaddr %v, the lease is %s", req.MessageType(), m.YourIPAddr, addr)
			}
		case dhcpv4.MessageTypeNak:
			if !zero4(m.YourIPAddr) || m.Options.Has(dhcpv4.OptionIPAddressLeaseTime) {
				t.Fatalf("NAK offering %v", m)
			}
		default:
			t.Fatalf("reply of type %v to %v", mt, req.MessageType())
		}
		if ra := m.RequestedIPAddress(); ra != nil {
			t.Fatalf("reply names requested address %v", ra)
		}
		ciaddr, _ := netip.AddrFromSlice(req.ClientIPAddr.To4())
		if rep.Dst != broadcast4 && rep.Dst != addr && rep.Dst != ciaddr {
			t.Fatalf("reply sent to %s: neither broadcast, the lease nor ciaddr", rep.Dst)
		}

		// The frame the server sends, and what the VM's client reads.
		out, err := ParseFrame(BuildUDP(brMAC, mac, l.ServerID4(), rep.Dst, 67, 68, m.ToBytes()), false)
		if err != nil {
			t.Fatalf("reply frame does not parse: %v", err)
		}
		if !bytes.Equal(out.DstMAC, mac) {
			t.Fatalf("reply frame to %s", out.DstMAC)
		}
		got, err := dhcpv4.FromBytes(out.Payload)
		if err != nil {
			t.Fatalf("reply does not decode: %v", err)
		}
		if got.MessageType() != m.MessageType() || !got.YourIPAddr.Equal(m.YourIPAddr) || !bytes.Equal(got.ClientHWAddr, mac) {
			t.Fatalf("reply decodes as %v, sent %v", got, m)
		}
	})
}

// FuzzDHCP6: the payload of a UDP datagram from the VM to port 547, taken
// the way Server.handle takes it. A reply goes to the client that asked
// (its transaction and client identifier), from this server only, and
// assigns no address but the lease's.
func FuzzDHCP6(f *testing.F) {
	l := fuzzLease()
	mac := l.HWAddr()
	sid := ServerDUID(brMAC)
	src := LinkLocal(mac)
	v4only := fuzzLease()
	v4only.Addr6 = netip.Prefix{}
	f.Fuzz(func(t *testing.T, payload []byte) {
		in := BuildUDP(mac, net.HardwareAddr{0x33, 0x33, 0, 1, 0, 2}, src, allDHCP, 546, 547, payload)
		fr, err := ParseFrame(in, false)
		if err != nil {
			if len(in) <= MaxFrame {
				t.Fatalf("a well-formed frame was refused: %v", err)
			}
			return
		}
		req, err := dhcpv6.MessageFromBytes(fr.Payload)
		if err != nil {
			return
		}
		if rep, _ := Answer6(v4only, sid, req); rep != nil {
			t.Fatalf("a lease without IPv6 answered %s", req.Type())
		}
		rep, why := Answer6(l, sid, req)
		if rep == nil {
			if why == "" {
				t.Fatal("a dropped request without a reason")
			}
			return
		}
		switch {
		case rep.TransactionID != req.TransactionID:
			t.Fatalf("reply xid %v to %v", rep.TransactionID, req.TransactionID)
		case rep.Options.ClientID() == nil || req.Options.ClientID() == nil ||
			!bytes.Equal(rep.Options.ClientID().ToBytes(), req.Options.ClientID().ToBytes()):
			t.Fatalf("reply for client %v, request from %v", rep.Options.ClientID(), req.Options.ClientID())
		case rep.Options.ServerID() == nil || !bytes.Equal(rep.Options.ServerID().ToBytes(), sid.ToBytes()):
			t.Fatalf("reply with server id %v", rep.Options.ServerID())
		case req.Options.ServerID() != nil && !bytes.Equal(req.Options.ServerID().ToBytes(), sid.ToBytes()):
			t.Fatalf("answered a message for server %v", req.Options.ServerID())
		}
		want := dhcpv6.MessageTypeReply
		if req.Type() == dhcpv6.MessageTypeSolicit && req.GetOneOption(dhcpv6.OptionRapidCommit) == nil {
			want = dhcpv6.MessageTypeAdvertise
		}
		if rep.Type() != want {
			t.Fatalf("%s answered with %s", req.Type(), rep.Type())
		}
		checkAddrs6(t, rep, l.Addr6.Addr())

		out, err := ParseFrame(BuildUDP(brMAC, mac, LinkLocal(brMAC), fr.Src, 547, 546, rep.ToBytes()), false)
		if err != nil {
			t.Fatalf("reply frame does not parse: %v", err)
		}
		if !bytes.Equal(out.DstMAC, mac) || out.Dst != src {
			t.Fatalf("reply frame to %s %s", out.DstMAC, out.Dst)
		}
		got, err := dhcpv6.MessageFromBytes(out.Payload)
		if err != nil {
			t.Fatalf("reply does not decode: %v", err)
		}
		if got.Type() != rep.Type() {
			t.Fatalf("reply decodes as %s, sent %s", got.Type(), rep.Type())
		}
		checkAddrs6(t, got, l.Addr6.Addr())
	})
}

// allDHCP is All_DHCP_Relay_Agents_and_Servers (RFC 8415 7.1).
var allDHCP = netip.MustParseAddr("ff02::1:2")

var bcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// checkAddrs6: every address the reply assigns is the lease's, and only in
// an IA_NA; no temporary addresses or prefixes are handed out.
func checkAddrs6(t *testing.T, m *dhcpv6.Message, lease netip.Addr) {
	t.Helper()
	for _, ia := range m.Options.IANA() {
		for _, a := range ia.Options.Addresses() {
			if got, ok := netip.AddrFromSlice(a.IPv6Addr); !ok || got != lease {
				t.Fatalf("%s assigns %v, the lease is %s", m.Type(), a.IPv6Addr, lease)
			}
		}
	}
	for _, code := range []dhcpv6.OptionCode{dhcpv6.OptionIATA, dhcpv6.OptionIAPD, dhcpv6.OptionIAAddr} {
		if slices.ContainsFunc(m.Options.Options, func(o dhcpv6.Option) bool { return o.Code() == code }) {
			t.Fatalf("%s carries option %v", m.Type(), code)
		}
	}
}

package vm

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// ServerID4 is the server identifier (option 54) and the source address of
// every reply: the lease's IPv4 gateway (169.254.1.1 for skein), else
// FallbackServerID. A client renews by unicast to it; that packet goes to
// the gateway's MAC through the pod's bridge, where the server (listening
// on the bridge in promiscuous mode) takes it and the bridge's nftables
// rule stops it from leaving through the veth. So the server needs no
// address of its own and the VM no route to one.
func (l *Lease) ServerID4() netip.Addr {
	if l.Gateway4.IsValid() {
		return l.Gateway4
	}
	if r := l.Router4(); r.IsValid() {
		return r
	}
	return FallbackServerID
}

// FallbackServerID is the server identifier when the result has no IPv4
// gateway (a link-local address nobody else uses).
var FallbackServerID = netip.MustParseAddr("169.254.255.254")

// Reply4 is an answer to send: the message and its IPv4 destination
// (the Ethernet destination is always the VM's MAC).
type Reply4 struct {
	Msg *dhcpv4.DHCPv4
	Dst netip.Addr
}

var broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// Answer4 decides what the server says to req, a request from the VM of
// l. It returns a nil Reply4 and the reason when the request is to be
// dropped (not for this VM, malformed, or one that gets no answer such as
// RELEASE). It is pure: no sockets, no clock.
//
// The server hands out exactly one address, the lease's, so it is
// authoritative: REQUESTs for any other address get a NAK (RFC 2131
// 4.3.2), REQUESTs naming another server are ignored, RELEASE and DECLINE
// are logged and change nothing (the address belongs to the CNI
// attachment, not to the DHCP exchange).
func Answer4(l *Lease, req *dhcpv4.DHCPv4) (*Reply4, string) {
	mac := l.HWAddr()
	switch {
	case req.OpCode != dhcpv4.OpcodeBootRequest:
		return nil, "not a BOOTREQUEST"
	case req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6:
		return nil, "not an Ethernet client"
	case !bytes.Equal(req.ClientHWAddr, mac):
		return nil, fmt.Sprintf("chaddr %s is not this VM's %s", req.ClientHWAddr, mac)
	case !zero4(req.GatewayIPAddr):
		return nil, "relayed request (giaddr set): this server serves one link"
	case !l.Addr4.IsValid():
		return nil, "no IPv4 address to serve"
	}
	addr := l.Addr4.Addr()
	sid := l.ServerID4()
	requested, _ := netip.AddrFromSlice(req.RequestedIPAddress().To4())
	ciaddr, _ := netip.AddrFromSlice(req.ClientIPAddr.To4())
	serverID, _ := netip.AddrFromSlice(req.ServerIdentifier().To4())

	switch mt := req.MessageType(); mt {
	case dhcpv4.MessageTypeDiscover:
		return l.reply(req, dhcpv4.MessageTypeOffer, addr, sid), ""
	case dhcpv4.MessageTypeRequest:
		switch {
		case serverID.IsValid() && serverID != sid:
			return nil, fmt.Sprintf("REQUEST for server %s, not this one", serverID)
		case serverID.IsValid() || requested.IsValid(): // SELECTING or INIT-REBOOT
			if requested != addr {
				return l.nak(req, sid, fmt.Sprintf("requested %v, the lease is %s", requested, addr)), ""
			}
		default: // RENEWING or REBINDING: ciaddr names the address
			if ciaddr != addr {
				return l.nak(req, sid, fmt.Sprintf("renewing %v, the lease is %s", ciaddr, addr)), ""
			}
		}
		return l.reply(req, dhcpv4.MessageTypeAck, addr, sid), ""
	case dhcpv4.MessageTypeInform:
		return l.reply(req, dhcpv4.MessageTypeAck, netip.Addr{}, sid), ""
	case dhcpv4.MessageTypeRelease:
		return nil, "RELEASE (the address stays with the attachment)"
	case dhcpv4.MessageTypeDecline:
		return nil, fmt.Sprintf("DECLINE of %v: another host claims the address", requested)
	default:
		return nil, fmt.Sprintf("message type %v is not served", mt)
	}
}

func zero4(ip net.IP) bool { return ip == nil || ip.IsUnspecified() }

// reply builds an OFFER or an ACK. yiaddr invalid: an ACK to INFORM,
// which carries configuration but no lease (RFC 2131 3.4).
func (l *Lease) reply(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType, yiaddr, sid netip.Addr) *Reply4 {
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(mt),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sid.AsSlice())),
		dhcpv4.WithNetmask(net.CIDRMask(l.Addr4.Bits(), 32)),
	}
	if yiaddr.IsValid() {
		mods = append(mods,
			dhcpv4.WithYourIP(yiaddr.AsSlice()),
			dhcpv4.WithLeaseTime(uint32(l.Time.Seconds())),
			dhcpv4.WithOption(dhcpv4.OptRenewTimeValue(l.T1())),
			dhcpv4.WithOption(dhcpv4.OptRebindingTimeValue(l.T2())))
	}
	if r := l.Router4(); r.IsValid() {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRouter(r.AsSlice())))
	}
	if routes := l.Classless4(); routes != nil {
		var rs []*dhcpv4.Route
		for _, r := range routes {
			via := net.IPv4zero.To4()
			if r.Via.IsValid() {
				via = r.Via.AsSlice()
			}
			rs = append(rs, &dhcpv4.Route{Dest: &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), 32)}, Router: via})
		}
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptClasslessStaticRoute(rs...)))
	}
	if len(l.DNS4) > 0 {
		var ips []net.IP
		for _, a := range l.DNS4 {
			ips = append(ips, a.AsSlice())
		}
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptDNS(ips...)))
	}
	if l.Domain != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptDomainName(l.Domain)))
	}
	if len(l.Search) > 0 {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionDNSDomainSearchList, EncodeSearch(l.Search)))
	}
	if l.Hostname != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(l.Hostname)))
	}
	if l.MTU >= 68 && l.MTU <= 0xffff {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionInterfaceMTU, []byte{byte(l.MTU >> 8), byte(l.MTU)}))
	}
	m, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil { // only when the system's random source fails
		return nil
	}
	return &Reply4{Msg: m, Dst: replyDst4(req, yiaddr)}
}

// nak refuses a REQUEST. A NAK is broadcast (RFC 2131 4.1): the client
// may believe it has an address it does not.
func (l *Lease) nak(req *dhcpv4.DHCPv4, sid netip.Addr, why string) *Reply4 {
	m, err := dhcpv4.NewReplyFromRequest(req,
		dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sid.AsSlice())),
		dhcpv4.WithOption(dhcpv4.OptMessage(why)))
	if err != nil {
		return nil
	}
	return &Reply4{Msg: m, Dst: broadcast4}
}

// replyDst4 follows RFC 2131 4.1: a client with an address (ciaddr) gets
// unicast to it; one that asked for broadcast gets broadcast; otherwise
// the reply goes to yiaddr. The Ethernet frame is always unicast to the
// VM's MAC, so nothing floods the bridge and the client needs no ARP.
func replyDst4(req *dhcpv4.DHCPv4, yiaddr netip.Addr) netip.Addr {
	if c, ok := netip.AddrFromSlice(req.ClientIPAddr.To4()); ok && !c.IsUnspecified() {
		return c
	}
	if req.IsBroadcast() || !yiaddr.IsValid() {
		return broadcast4
	}
	return yiaddr
}

// EncodeSearch encodes a domain search list as option 119 (RFC 3397):
// RFC 1035 names, later ones compressed with pointers to suffixes already
// written (offsets from the start of the option data). The names must be
// normalized (normalizeDomain). Options longer than 255 bytes are split
// into several by the message encoder (RFC 3396).
func EncodeSearch(domains []string) []byte {
	var out []byte
	at := map[string]int{}
	for _, d := range domains {
		labels := strings.Split(d, ".")
		for i := range labels {
			suffix := strings.Join(labels[i:], ".")
			if off, ok := at[strings.ToLower(suffix)]; ok {
				out = append(out, 0xc0|byte(off>>8), byte(off))
				goto next
			}
			if len(out) < 0x3fff {
				at[strings.ToLower(suffix)] = len(out)
			}
			out = append(out, byte(len(labels[i])))
			out = append(out, labels[i]...)
		}
		out = append(out, 0)
	next:
	}
	return out
}

package vm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/insomniacslk/dhcp/rfc1035label"
)

// IPv6 for a VM takes two parts, both served from the pod's bridge:
//
//   - DHCPv6 (RFC 8415, stateful): the lease's address in an IA_NA, DNS
//     servers (23) and the search list (24). DHCPv6 carries no prefix
//     length and no routes, so
//   - router advertisements carry the rest: M and O set (use DHCPv6, no
//     SLAAC), the MTU, the address's prefix as on-link when it is shorter
//     than /128, and — when the result's IPv6 gateway is link-local, as
//     skein's is (its host veth's own link-local address) — a default
//     route: the RA is sent with the gateway as its source address, so the
//     VM's default route points at the real gateway (the main plugin's
//     host side answers neighbour discovery for it). Non-default routes via that gateway go in route
//     information options (RFC 4191). The RA carries no source link-layer
//     option, which would bind the gateway to the bridge's MAC.
//
// A global (not link-local) IPv6 gateway cannot be the source of an RA,
// so then the VM gets its address and the on-link prefix but no IPv6
// default route (router lifetime 0).

// ServerDUID is the server's DUID: DUID-LL of the bridge's MAC.
func ServerDUID(bridgeMAC net.HardwareAddr) dhcpv6.DUID {
	return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: bridgeMAC}
}

// LinkLocal returns the modified EUI-64 link-local address of mac.
func LinkLocal(mac net.HardwareAddr) netip.Addr {
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8], a[9], a[10] = mac[0]^0x02, mac[1], mac[2]
	a[11], a[12] = 0xff, 0xfe
	a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(a)
}

// Answer6 decides the server's answer to a DHCPv6 message from the VM of
// l, or returns nil and why it is dropped. Pure, like Answer4.
func Answer6(l *Lease, sid dhcpv6.DUID, req *dhcpv6.Message) (*dhcpv6.Message, string) {
	if !l.Addr6.IsValid() {
		return nil, "no IPv6 address to serve"
	}
	cid := req.Options.ClientID()
	if cid == nil {
		return nil, "no client identifier"
	}
	if s := req.Options.ServerID(); s != nil && !bytes.Equal(s.ToBytes(), sid.ToBytes()) {
		return nil, "message for another server"
	}
	base := []dhcpv6.Modifier{dhcpv6.WithServerID(sid)}
	if len(l.DNS6) > 0 {
		var ips []net.IP
		for _, a := range l.DNS6 {
			ips = append(ips, a.AsSlice())
		}
		base = append(base, dhcpv6.WithDNS(ips...))
	}
	if len(l.Search) > 0 {
		// DHCPv6 forbids compression (RFC 8415 10): plain labels.
		base = append(base, dhcpv6.WithOption(dhcpv6.OptDomainSearchList(&rfc1035label.Labels{Labels: l.Search})))
	}
	withIA := append(base, l.iaNA(req))

	var rep *dhcpv6.Message
	var err error
	switch t := req.Type(); t {
	case dhcpv6.MessageTypeSolicit:
		if req.GetOneOption(dhcpv6.OptionRapidCommit) != nil {
			rep, err = dhcpv6.NewReplyFromMessage(req, withIA...)
		} else {
			rep, err = dhcpv6.NewAdvertiseFromSolicit(req, withIA...)
		}
	case dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew:
		if req.Options.ServerID() == nil {
			return nil, fmt.Sprintf("%s without a server identifier", t)
		}
		rep, err = dhcpv6.NewReplyFromMessage(req, withIA...)
	case dhcpv6.MessageTypeRebind:
		rep, err = dhcpv6.NewReplyFromMessage(req, withIA...)
	case dhcpv6.MessageTypeConfirm:
		code := iana.StatusSuccess
		for _, ia := range req.Options.IANA() {
			for _, a := range ia.Options.Addresses() {
				if got, _ := netip.AddrFromSlice(a.IPv6Addr); got != l.Addr6.Addr() {
					code = iana.StatusNotOnLink
				}
			}
		}
		rep, err = dhcpv6.NewReplyFromMessage(req, append(base, status(code, "confirm"))...)
	case dhcpv6.MessageTypeRelease:
		rep, err = dhcpv6.NewReplyFromMessage(req, append(base, status(iana.StatusSuccess, "the address stays with the attachment"))...)
	case dhcpv6.MessageTypeDecline:
		// NewReplyFromMessage refuses DECLINE; the answer is the same
		// kind of REPLY (RFC 8415 18.3.8).
		rep = &dhcpv6.Message{MessageType: dhcpv6.MessageTypeReply, TransactionID: req.TransactionID}
		rep.AddOption(dhcpv6.OptClientID(cid))
		for _, m := range append(base, status(iana.StatusSuccess, "noted")) {
			m(rep)
		}
	case dhcpv6.MessageTypeInformationRequest:
		rep, err = dhcpv6.NewReplyFromMessage(req, base...)
	default:
		return nil, fmt.Sprintf("message type %s is not served", t)
	}
	if err != nil {
		return nil, err.Error()
	}
	return rep, ""
}

func status(code iana.StatusCode, msg string) dhcpv6.Modifier {
	return dhcpv6.WithOption(&dhcpv6.OptStatusCode{StatusCode: code, StatusMessage: msg})
}

// iaNA is the lease's address in the IA the client asked for (its IAID;
// zero if it sent none).
func (l *Lease) iaNA(req *dhcpv6.Message) dhcpv6.Modifier {
	ia := &dhcpv6.OptIANA{T1: l.T1(), T2: l.T2()}
	if c := req.Options.OneIANA(); c != nil {
		ia.IaId = c.IaId
	}
	ia.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: l.Addr6.Addr().AsSlice(), PreferredLifetime: l.Time, ValidLifetime: l.Time})
	return dhcpv6.WithOption(ia)
}

// RouterLifetime is the default-route lifetime announced when the VM
// has a link-local IPv6 gateway.
const RouterLifetime = 30 * time.Minute

// Router6 is the source of the lease's router advertisements and whether
// it is a router the VM may route through (a link-local gateway of the
// result). When it is not, ownLL (the server's own link-local address) is
// the source and the RA announces no default route.
func (l *Lease) Router6(ownLL netip.Addr) (netip.Addr, bool) {
	for _, r := range l.Routes6 {
		if r.Dst.Bits() == 0 && r.Via.IsLinkLocalUnicast() {
			return r.Via, true
		}
	}
	if l.Gateway6.IsLinkLocalUnicast() {
		return l.Gateway6, true
	}
	return ownLL, false
}

// RouterAdvert builds the ICMPv6 router advertisement (RFC 4861 4.2) for
// the lease; its checksum is left for BuildICMP6.
func (l *Lease) RouterAdvert(ownLL netip.Addr) []byte {
	_, isRouter := l.Router6(ownLL)
	m := make([]byte, 16)
	m[0] = 134 // router advertisement
	m[4] = 64  // current hop limit
	m[5] = 0xc0
	if isRouter && l.hasDefault6() {
		binary.BigEndian.PutUint16(m[6:], uint16(RouterLifetime.Seconds()))
	}
	if l.MTU >= 1280 {
		m = append(m, 5, 1, 0, 0)
		m = binary.BigEndian.AppendUint32(m, uint32(l.MTU))
	}
	if l.Addr6.Bits() < 128 {
		p := l.Addr6.Masked().Addr().As16()
		m = append(m, 3, 4, byte(l.Addr6.Bits()), 0x80) // on-link, not autonomous
		m = binary.BigEndian.AppendUint32(m, uint32(l.Time.Seconds()))
		m = binary.BigEndian.AppendUint32(m, uint32(l.Time.Seconds()))
		m = append(m, 0, 0, 0, 0)
		m = append(m, p[:]...)
	}
	if isRouter {
		for _, r := range l.Routes6 {
			if r.Dst.Bits() == 0 {
				continue
			}
			p := r.Dst.Addr().As16()
			m = append(m, 24, 3, byte(r.Dst.Bits()), 0)
			m = binary.BigEndian.AppendUint32(m, uint32(RouterLifetime.Seconds()))
			m = append(m, p[:]...)
		}
	}
	return m
}

func (l *Lease) hasDefault6() bool {
	for _, r := range l.Routes6 {
		if r.Dst.Bits() == 0 {
			return true
		}
	}
	return false
}

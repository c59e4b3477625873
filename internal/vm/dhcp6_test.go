package vm

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
)

func v6Lease() *Lease {
	l := skeinLease()
	l.Addr6 = netip.MustParsePrefix("fd00:64::5/128")
	l.Gateway6 = netip.MustParseAddr("fe80::1")
	l.Routes6 = []Route{{Dst: netip.MustParsePrefix("::/0"), Via: netip.MustParseAddr("fe80::1")}}
	l.DNS6 = []netip.Addr{netip.MustParseAddr("fd00::53")}
	return l
}

func TestAnswer6(t *testing.T) {
	l := v6Lease()
	sid := ServerDUID(brMAC)
	sol, err := dhcpv6.NewSolicit(vmMAC)
	if err != nil {
		t.Fatal(err)
	}
	adv, why := Answer6(l, sid, sol)
	if adv == nil || adv.Type() != dhcpv6.MessageTypeAdvertise {
		t.Fatalf("SOLICIT: %v %s", adv, why)
	}
	ia := adv.Options.OneIANA()
	if ia == nil || ia.Options.OneAddress() == nil || ia.Options.OneAddress().IPv6Addr.String() != "fd00:64::5" {
		t.Fatalf("ADVERTISE IA_NA: %v", ia)
	}
	if ia.IaId != sol.Options.OneIANA().IaId {
		t.Errorf("the IAID must be the client's")
	}
	if d := adv.Options.DNS(); len(d) != 1 || d[0].String() != "fd00::53" {
		t.Errorf("DNS %v", d)
	}
	req, err := dhcpv6.NewRequestFromAdvertise(adv)
	if err != nil {
		t.Fatal(err)
	}
	rep, why := Answer6(l, sid, req)
	if rep == nil || rep.Type() != dhcpv6.MessageTypeReply || rep.Options.OneIANA() == nil {
		t.Fatalf("REQUEST: %v %s", rep, why)
	}
	req.UpdateOption(dhcpv6.OptServerID(ServerDUID(vmMAC)))
	if rep, _ := Answer6(l, sid, req); rep != nil {
		t.Error("a REQUEST for another server must be dropped")
	}
	rel := &dhcpv6.Message{MessageType: dhcpv6.MessageTypeRelease, TransactionID: req.TransactionID}
	rel.AddOption(dhcpv6.OptClientID(sol.Options.ClientID()))
	rel.AddOption(dhcpv6.OptServerID(sid))
	rep, _ = Answer6(l, sid, rel)
	if rep == nil || rep.Options.Status() == nil || rep.Options.Status().StatusCode != iana.StatusSuccess {
		t.Errorf("RELEASE: %v", rep)
	}
	noCID := &dhcpv6.Message{MessageType: dhcpv6.MessageTypeSolicit}
	if rep, _ := Answer6(l, sid, noCID); rep != nil {
		t.Error("a message without client identifier must be dropped")
	}
	l.Addr6 = netip.Prefix{}
	if rep, _ := Answer6(l, sid, sol); rep != nil {
		t.Error("no IPv6 address: nothing to serve")
	}
}

func TestRouterAdvert(t *testing.T) {
	own := LinkLocal(brMAC)
	l := v6Lease()
	src, ok := l.Router6(own)
	if !ok || src != netip.MustParseAddr("fe80::1") {
		t.Errorf("RA source %v %v, want the gateway", src, ok)
	}
	ra := l.RouterAdvert(own)
	if ra[0] != 134 || ra[5] != 0xc0 || binary.BigEndian.Uint16(ra[6:]) != 1800 {
		t.Errorf("RA header % x: want type 134, M+O, lifetime 1800", ra[:16])
	}
	// MTU option present, no prefix information for a /128.
	if len(ra) != 16+8 || ra[16] != 5 || binary.BigEndian.Uint32(ra[20:]) != 1450 {
		t.Errorf("RA options % x", ra[16:])
	}
	// A global gateway cannot be an RA source: own address, no default route.
	l.Gateway6 = netip.MustParseAddr("fd00:64::1")
	l.Routes6 = []Route{{Dst: netip.MustParsePrefix("::/0"), Via: l.Gateway6}}
	l.Addr6 = netip.MustParsePrefix("fd00:64::5/64")
	if src, ok := l.Router6(own); ok || src != own {
		t.Errorf("RA source %v %v, want own link-local", src, ok)
	}
	ra = l.RouterAdvert(own)
	if binary.BigEndian.Uint16(ra[6:]) != 0 {
		t.Error("no link-local gateway: router lifetime must be 0")
	}
	if len(ra) != 16+8+32 || ra[24] != 3 || ra[26] != 64 || ra[27] != 0x80 {
		t.Errorf("want an on-link, non-autonomous /64 prefix option: % x", ra[24:])
	}
}

package vm

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/rfc1035label"
)

func skeinLease() *Lease {
	return &Lease{
		IfName: "eth0", MAC: "02:11:22:33:44:55",
		Addr4:    netip.MustParsePrefix("10.64.0.5/32"),
		Gateway4: netip.MustParseAddr("169.254.1.1"),
		Routes4:  []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("169.254.1.1")}},
		DNS4:     []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Search:   []string{"default.svc.cluster.local", "svc.cluster.local", "cluster.local", "example.org"},
		Domain:   "cluster.local", Hostname: "web-0", MTU: 1450, Time: time.Hour,
	}
}

var vmMAC = net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}

func msg(t *testing.T, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(vmMAC), dhcpv4.WithMessageType(mt)}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	// Through the wire and back, as the server sees it.
	m, err = dhcpv4.FromBytes(m.ToBytes())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestAnswer4Exchange(t *testing.T) {
	l := skeinLease()
	sid := net.IPv4(169, 254, 1, 1).To4()
	addr := net.IPv4(10, 64, 0, 5).To4()
	reqIP := dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(addr))
	for _, c := range []struct {
		name    string
		req     *dhcpv4.DHCPv4
		want    dhcpv4.MessageType // 0: dropped
		dst     string
		yiaddr  bool
		dropped string
	}{
		{"discover", msg(t, dhcpv4.MessageTypeDiscover), dhcpv4.MessageTypeOffer, "10.64.0.5", true, ""},
		{"discover broadcast flag", msg(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithBroadcast(true)), dhcpv4.MessageTypeOffer, "255.255.255.255", true, ""},
		{"request selecting", msg(t, dhcpv4.MessageTypeRequest, reqIP, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sid))), dhcpv4.MessageTypeAck, "10.64.0.5", true, ""},
		{"request init-reboot", msg(t, dhcpv4.MessageTypeRequest, reqIP), dhcpv4.MessageTypeAck, "10.64.0.5", true, ""},
		{"renew", msg(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(addr)), dhcpv4.MessageTypeAck, "10.64.0.5", true, ""},
		{"wrong address", msg(t, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 64, 0, 9)))), dhcpv4.MessageTypeNak, "255.255.255.255", false, ""},
		{"renew wrong address", msg(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(net.IPv4(10, 1, 1, 1))), dhcpv4.MessageTypeNak, "255.255.255.255", false, ""},
		{"other server", msg(t, dhcpv4.MessageTypeRequest, reqIP, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 1)))), 0, "", false, "not this one"},
		{"inform", msg(t, dhcpv4.MessageTypeInform, dhcpv4.WithClientIP(addr)), dhcpv4.MessageTypeAck, "10.64.0.5", false, ""},
		{"release", msg(t, dhcpv4.MessageTypeRelease, dhcpv4.WithClientIP(addr)), 0, "", false, "RELEASE"},
		{"decline", msg(t, dhcpv4.MessageTypeDecline, reqIP), 0, "", false, "DECLINE"},
		{"foreign mac", msg(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(net.HardwareAddr{2, 0, 0, 0, 0, 9})), 0, "", false, "not this VM's"},
		{"relayed", msg(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithGatewayIP(net.IPv4(10, 0, 0, 1))), 0, "", false, "relayed"},
		{"a reply", msg(t, dhcpv4.MessageTypeOffer, dhcpv4.WithReply(msg(t, dhcpv4.MessageTypeDiscover))), 0, "", false, "BOOTREQUEST"},
	} {
		rep, why := Answer4(l, c.req)
		if c.want == 0 {
			if rep != nil || !strings.Contains(why, c.dropped) {
				t.Errorf("%s: want dropped (%q), got %v %q", c.name, c.dropped, rep, why)
			}
			continue
		}
		if rep == nil {
			t.Errorf("%s: dropped: %s", c.name, why)
			continue
		}
		m, err := dhcpv4.FromBytes(rep.Msg.ToBytes())
		if err != nil {
			t.Fatalf("%s: reply does not decode: %v", c.name, err)
		}
		if m.MessageType() != c.want || rep.Dst.String() != c.dst || m.TransactionID != c.req.TransactionID {
			t.Errorf("%s: got %s to %s xid %v, want %s to %s", c.name, m.MessageType(), rep.Dst, m.TransactionID, c.want, c.dst)
		}
		if !m.ServerIdentifier().Equal(sid) {
			t.Errorf("%s: server identifier %v", c.name, m.ServerIdentifier())
		}
		if got := m.YourIPAddr.Equal(addr); got != c.yiaddr {
			t.Errorf("%s: yiaddr %v", c.name, m.YourIPAddr)
		}
		if c.want == dhcpv4.MessageTypeNak {
			if m.Options.Has(dhcpv4.OptionSubnetMask) || m.Options.Has(dhcpv4.OptionIPAddressLeaseTime) {
				t.Errorf("%s: a NAK carries no configuration", c.name)
			}
			continue
		}
		if c.yiaddr != m.Options.Has(dhcpv4.OptionIPAddressLeaseTime) {
			t.Errorf("%s: lease time present %v (INFORM's ACK has none)", c.name, m.Options.Has(dhcpv4.OptionIPAddressLeaseTime))
		}
	}
}

// TestAnswer4Options: every option carries the lease, decoded the way a
// client decodes it.
func TestAnswer4Options(t *testing.T) {
	l := skeinLease()
	rep, why := Answer4(l, msg(t, dhcpv4.MessageTypeDiscover))
	if rep == nil {
		t.Fatal(why)
	}
	m, err := dhcpv4.FromBytes(rep.Msg.ToBytes())
	if err != nil {
		t.Fatal(err)
	}
	if ones, _ := m.SubnetMask().Size(); ones != 32 {
		t.Errorf("mask /%d", ones)
	}
	if r := m.Router(); len(r) != 1 || !r[0].Equal(net.IPv4(169, 254, 1, 1)) {
		t.Errorf("router %v", r)
	}
	var routes []string
	for _, r := range m.ClasslessStaticRoute() {
		routes = append(routes, r.String())
	}
	if want := []string{"route to 169.254.1.1/32 via 0.0.0.0", "route to 0.0.0.0/0 via 169.254.1.1"}; !slices.Equal(routes, want) {
		t.Errorf("option 121 %v, want %v", routes, want)
	}
	if d := m.DNS(); len(d) != 1 || !d[0].Equal(net.IPv4(10, 96, 0, 10)) {
		t.Errorf("dns %v", d)
	}
	if m.DomainName() != "cluster.local" || m.HostName() != "web-0" {
		t.Errorf("domain %q host %q", m.DomainName(), m.HostName())
	}
	if s := m.DomainSearch(); s == nil || !slices.Equal(s.Labels, l.Search) {
		t.Errorf("search %v, want %v", s, l.Search)
	}
	if mtu := m.GetOneOption(dhcpv4.OptionInterfaceMTU); len(mtu) != 2 || int(mtu[0])<<8|int(mtu[1]) != 1450 {
		t.Errorf("mtu %v", mtu)
	}
	if m.IPAddressLeaseTime(0) != time.Hour || m.IPAddressRenewalTime(0) != 30*time.Minute || m.IPAddressRebindingTime(0) != 52*time.Minute+30*time.Second {
		t.Errorf("times %v %v %v", m.IPAddressLeaseTime(0), m.IPAddressRenewalTime(0), m.IPAddressRebindingTime(0))
	}
}

func TestEncodeSearch(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []byte
	}{
		{[]string{"example.org"}, []byte("\x07example\x03org\x00")},
		// RFC 3397's own example: the second name points at "example.org"'s… suffix.
		{[]string{"eng.apple.com", "marketing.apple.com"}, []byte("\x03eng\x05apple\x03com\x00\x09marketing\xc0\x04")},
		{[]string{"a.b", "a.b"}, []byte("\x01a\x01b\x00\xc0\x00")},
	} {
		got := EncodeSearch(c.in)
		if string(got) != string(c.want) {
			t.Errorf("%v: got %q, want %q", c.in, got, c.want)
		}
		dec, err := rfc1035label.FromBytes(got)
		if err != nil || !slices.Equal(dec.Labels, c.in) {
			t.Errorf("%v: decodes to %v (%v)", c.in, dec, err)
		}
	}
}

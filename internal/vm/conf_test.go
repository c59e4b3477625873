package vm

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/internal/cni"
)

const skeinPrev = `{"cniVersion":"1.0.0","interfaces":[{"name":"skabc","mac":"aa:00:00:00:00:01"},{"name":"eth0","mac":"02:11:22:33:44:55","sandbox":"/run/netns/p"}],
"ips":[{"interface":1,"address":"10.64.0.5/32","gateway":"169.254.1.1"},{"interface":1,"address":"fd00:64::5/128","gateway":"fe80::1"}],
"routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"},{"dst":"::/0","gw":"fe80::1"}],
"dns":{"nameservers":["10.96.0.10","fd00::53"],"search":["default.svc.cluster.local","svc.cluster.local."],"domain":"cluster.local"}}`

const bridgePrev = `{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"aa:00:00:00:00:02"},{"name":"vethx","mac":"aa:00:00:00:00:03"},{"name":"eth0","mac":"02:aa:bb:cc:dd:ee","sandbox":"/run/netns/p"}],
"ips":[{"interface":2,"address":"10.22.0.7/16","gateway":"10.22.0.1"}],
"routes":[{"dst":"0.0.0.0/0"}]}`

func conf(t *testing.T, version, prev string, extra string) *NetConf {
	t.Helper()
	c, err := ParseConf([]byte(fmt.Sprintf(`{"cniVersion":%q,"name":"n","type":"skein-vm"%s,"prevResult":%s}`, version, extra, prev)), true)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLeasesFromSkein(t *testing.T) {
	ls, err := Leases(conf(t, "1.0.0", skeinPrev, ""), "web-0")
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 {
		t.Fatalf("want one lease (eth0, the only sandbox interface), got %d", len(ls))
	}
	l := ls[0]
	want := Lease{
		IfName: "eth0", MAC: "02:11:22:33:44:55",
		Addr4: netip.MustParsePrefix("10.64.0.5/32"), Addr6: netip.MustParsePrefix("fd00:64::5/128"),
		Gateway4: netip.MustParseAddr("169.254.1.1"), Gateway6: netip.MustParseAddr("fe80::1"),
		Routes4:  []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("169.254.1.1")}},
		Routes6:  []Route{{Dst: netip.MustParsePrefix("::/0"), Via: netip.MustParseAddr("fe80::1")}},
		DNS4:     []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		DNS6:     []netip.Addr{netip.MustParseAddr("fd00::53")},
		Search:   []string{"default.svc.cluster.local", "svc.cluster.local"},
		Domain:   "cluster.local",
		Hostname: "web-0",
		Time:     DefaultLease,
	}
	if fmt.Sprintf("%+v", l) != fmt.Sprintf("%+v", want) {
		t.Errorf("lease:\n got  %+v\n want %+v", l, want)
	}
	// The /32 cannot reach 169.254.1.1 without a host route: option 121
	// leads with it and keeps the default route (RFC 3442: 3 is ignored).
	got := l.Classless4()
	wantRoutes := []Route{{Dst: netip.MustParsePrefix("169.254.1.1/32")}, {Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("169.254.1.1")}}
	if !slices.Equal(got, wantRoutes) {
		t.Errorf("classless routes %v, want %v", got, wantRoutes)
	}
	if r := l.Router4(); r != netip.MustParseAddr("169.254.1.1") {
		t.Errorf("router %v", r)
	}
	if l.ServerID4() != netip.MustParseAddr("169.254.1.1") {
		t.Errorf("server id %v, want the gateway", l.ServerID4())
	}
}

func TestLeasesFromBridge(t *testing.T) {
	ls, err := Leases(conf(t, "0.4.0", strings.Replace(bridgePrev, `"1.0.0"`, `"0.4.0"`, 1), `,"leaseSeconds":120`), "")
	if err != nil {
		t.Fatal(err)
	}
	l := ls[0]
	if l.Addr4 != netip.MustParsePrefix("10.22.0.7/16") || l.MAC != "02:aa:bb:cc:dd:ee" || l.Time != 2*time.Minute {
		t.Errorf("lease %+v", l)
	}
	// A route without gw uses the interface gateway; one default route via
	// an on-link router needs no option 121.
	if !slices.Equal(l.Routes4, []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("10.22.0.1")}}) {
		t.Errorf("routes %v", l.Routes4)
	}
	if c := l.Classless4(); c != nil {
		t.Errorf("no option 121 expected, got %v", c)
	}
	if l.Addr6.IsValid() || l.Hostname != "" {
		t.Errorf("lease %+v", l)
	}
}

func TestClassless4(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	for _, c := range []struct {
		name   string
		addr   string
		routes []Route
		want   []Route
	}{
		{"no routes", "10.0.0.2/24", nil, nil},
		{"default on-link router", "10.0.0.2/24", []Route{{p("0.0.0.0/0"), a("10.0.0.1")}}, nil},
		{"extra route keeps the default in 121", "10.0.0.2/24",
			[]Route{{p("0.0.0.0/0"), a("10.0.0.1")}, {p("192.168.0.0/16"), a("10.0.0.254")}},
			[]Route{{p("0.0.0.0/0"), a("10.0.0.1")}, {p("192.168.0.0/16"), a("10.0.0.254")}}},
		{"off-prefix gateway once", "10.64.0.5/32",
			[]Route{{p("0.0.0.0/0"), a("169.254.1.1")}, {p("10.0.0.0/8"), a("169.254.1.1")}},
			[]Route{{p("169.254.1.1/32"), netip.Addr{}}, {p("0.0.0.0/0"), a("169.254.1.1")}, {p("10.0.0.0/8"), a("169.254.1.1")}}},
		{"on-link route without router", "10.0.0.2/24", []Route{{p("10.9.0.0/16"), netip.Addr{}}}, []Route{{p("10.9.0.0/16"), netip.Addr{}}}},
	} {
		l := Lease{Addr4: p(c.addr), Routes4: c.routes}
		if got := l.Classless4(); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestParseConfErrors(t *testing.T) {
	for _, c := range []struct {
		name, conf string
		code       uint
	}{
		{"undecodable", `{`, types.ErrDecodingFailure},
		{"bad version", `{"cniVersion":"9.9.9","name":"n"}`, types.ErrIncompatibleCNIVersion},
		{"no name", `{"cniVersion":"1.0.0"}`, types.ErrInvalidNetworkConfig},
		{"no prevResult", `{"cniVersion":"1.0.0","name":"n"}`, types.ErrInvalidNetworkConfig},
		{"short lease", `{"cniVersion":"1.0.0","name":"n","leaseSeconds":3,"prevResult":` + skeinPrev + `}`, types.ErrInvalidNetworkConfig},
		{"bad prevResult", `{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0","ips":"x"}}`, types.ErrDecodingFailure},
	} {
		_, err := ParseConf([]byte(c.conf), true)
		if e, ok := err.(*types.Error); !ok || e.Code != c.code {
			t.Errorf("%s: want code %d, got %v", c.name, c.code, err)
		}
	}
}

func TestLeasesErrors(t *testing.T) {
	for _, c := range []struct {
		name, prev, want string
	}{
		{"no sandbox interface", `{"cniVersion":"1.0.0","interfaces":[{"name":"h"}],"ips":[{"interface":0,"address":"10.0.0.1/24"}]}`, "no interface inside the sandbox"},
		{"no addresses", `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}]}`, "no interface inside the sandbox"},
		{"two IPv4", `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"interface":0,"address":"10.0.0.1/24"},{"interface":0,"address":"10.0.0.2/24"}]}`, "two addresses of one family"},
		{"bad MAC", `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"zz","sandbox":"/x"}],"ips":[{"interface":0,"address":"10.0.0.1/24"}]}`, "not an Ethernet address"},
		{"bad search", `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"interface":0,"address":"10.0.0.1/24"}],"dns":{"search":["a..b"]}}`, "empty label"},
		{"bad ifname", `{"cniVersion":"1.0.0","interfaces":[{"name":"a/b","sandbox":"/x"}],"ips":[{"interface":0,"address":"10.0.0.1/24"}]}`, "contains '/'"},
	} {
		_, err := Leases(conf(t, "1.0.0", c.prev, ""), "")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error containing %q, got %v", c.name, c.want, err)
		}
	}
}

func TestHostnameFromArgs(t *testing.T) {
	for in, want := range map[string]string{
		"K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=x": "web-0",
		"K8S_POD_NAME=a.b":                       "a.b",
		"K8S_POD_NAME=-bad":                      "",
		"K8S_POD_NAME=has space":                 "",
		"IP=1.2.3.4":                             "",
		"garbage":                                "",
	} {
		if got := HostnameFromArgs(in); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}

// TestParseConfNetworkName: skein-vm refuses the network names skein
// refuses (the name becomes part of store keys and kernel tags), with the
// same validator, for every verb.
func TestParseConfNetworkName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"n", true},
		{"vm-net_1.a", true},
		{strings.Repeat("a", 128), true},
		{"a/b", false},
		{"../x", false},
		{"-lead", false},
		{"has space", false},
		{"tab\there", false},
		{"a:b", false},
		{"nul\x00", false},
		{strings.Repeat("a", 129), false},
	} {
		name, _ := json.Marshal(c.name)
		raw := fmt.Sprintf(`{"cniVersion":"1.0.0","name":%s,"type":"skein-vm","prevResult":%s}`, name, skeinPrev)
		_, cniErr := cni.Parse([]byte(raw))
		if (cniErr == nil) != c.ok {
			t.Fatalf("test table disagrees with cni.Parse for %q: %v", c.name, cniErr)
		}
		for _, requirePrev := range []bool{true, false} {
			_, err := ParseConf([]byte(raw), requirePrev)
			switch e, _ := err.(*types.Error); {
			case c.ok && err != nil:
				t.Errorf("name %q (requirePrev %v): want it accepted as cni.Parse does, got %v", c.name, requirePrev, err)
			case !c.ok && (e == nil || e.Code != types.ErrInvalidNetworkConfig):
				t.Errorf("name %q (requirePrev %v): want code %d as cni.Parse gives, got %v", c.name, requirePrev, types.ErrInvalidNetworkConfig, err)
			}
		}
	}
}

// TestLeasesFromLegacyPrev: a main plugin speaking 0.1.0 or 0.2.0 gives
// {"ip4", "ip6", "dns"} and no interfaces; the addresses are CNI_IFNAME's,
// and the VM is served them (the MAC is read from the veth at ADD).
func TestLeasesFromLegacyPrev(t *testing.T) {
	for _, v := range []string{"0.1.0", "0.2.0"} {
		prev := `{"cniVersion":"` + v + `","ip4":{"ip":"10.64.0.5/32","gateway":"169.254.1.1","routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}]},
"ip6":{"ip":"fd00:64::5/128","gateway":"fe80::1","routes":[{"dst":"::/0","gw":"fe80::1"}]},"dns":{"nameservers":["10.96.0.10"]}}`
		c := conf(t, v, prev, "")
		if err := AdoptLegacyPrev(c, "net1", "/run/netns/p"); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		ls, err := Leases(c, "")
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		want := Lease{
			IfName: "net1",
			Addr4:  netip.MustParsePrefix("10.64.0.5/32"), Addr6: netip.MustParsePrefix("fd00:64::5/128"),
			Gateway4: netip.MustParseAddr("169.254.1.1"), Gateway6: netip.MustParseAddr("fe80::1"),
			Routes4: []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("169.254.1.1")}},
			Routes6: []Route{{Dst: netip.MustParsePrefix("::/0"), Via: netip.MustParseAddr("fe80::1")}},
			DNS4:    []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Time:    DefaultLease,
		}
		if len(ls) != 1 || fmt.Sprintf("%+v", ls[0]) != fmt.Sprintf("%+v", want) {
			t.Errorf("%s: leases\n got  %+v\n want [%+v]", v, ls, want)
		}
	}
	// A 1.0.0 result keeps its own interfaces.
	c := conf(t, "1.0.0", skeinPrev, "")
	if err := AdoptLegacyPrev(c, "net1", "/run/netns/p"); err != nil {
		t.Fatal(err)
	}
	if ls, err := Leases(c, ""); err != nil || len(ls) != 1 || ls[0].IfName != "eth0" {
		t.Errorf("a 1.0.0 prevResult should be left alone: %+v, %v", ls, err)
	}
}

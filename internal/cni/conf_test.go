package cni

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types020 "github.com/containernetworking/cni/pkg/types/020"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	current "github.com/containernetworking/cni/pkg/types/100"
)

func code(err error) uint {
	if e, ok := err.(*types.Error); ok {
		return e.Code
	}
	return 0
}

func TestParse(t *testing.T) {
	cases := []struct {
		name, in string
		code     uint
		pool     string
	}{
		{"minimal", `{"cniVersion":"1.1.0","name":"n","type":"skein"}`, 0, "default"},
		{"pool", `{"cniVersion":"0.3.1","name":"n","type":"skein","pool":"blue"}`, 0, "blue"},
		{"every version 0.3.0", `{"cniVersion":"0.3.0","name":"n"}`, 0, "default"},
		{"every version 0.4.0", `{"cniVersion":"0.4.0","name":"n"}`, 0, "default"},
		{"every version 1.0.0", `{"cniVersion":"1.0.0","name":"n"}`, 0, "default"},
		{"every version 0.1.0", `{"cniVersion":"0.1.0","name":"n"}`, 0, "default"},
		{"every version 0.2.0", `{"cniVersion":"0.2.0","name":"n"}`, 0, "default"},
		{"no version means 0.1.0", `{"name":"n"}`, 0, "default"},
		{"empty version means 0.1.0", `{"cniVersion":"","name":"n"}`, 0, "default"},
		{"garbage", `{"cniVersion":`, types.ErrDecodingFailure, ""},
		{"not an object", `[1,2]`, types.ErrDecodingFailure, ""},
		{"unknown version", `{"cniVersion":"9.9.9","name":"n"}`, types.ErrIncompatibleCNIVersion, ""},
		{"not a version", `{"cniVersion":"1.0","name":"n"}`, types.ErrIncompatibleCNIVersion, ""},
		{"version of another type", `{"cniVersion":1,"name":"n"}`, types.ErrDecodingFailure, ""},
		{"no name", `{"cniVersion":"1.0.0"}`, types.ErrInvalidNetworkConfig, ""},
		{"bad name", `{"cniVersion":"1.0.0","name":"a/b"}`, types.ErrInvalidNetworkConfig, ""},
		{"mtu low", `{"cniVersion":"1.0.0","name":"n","mtu":10}`, types.ErrInvalidNetworkConfig, ""},
		{"bad prevResult", `{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":"x"}}`, types.ErrDecodingFailure, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := Parse([]byte(c.in))
			if code(err) != c.code {
				t.Fatalf("Parse(%s): code %d (%v), want %d", c.in, code(err), err, c.code)
			}
			if err == nil && conf.Pool != c.pool {
				t.Errorf("pool %q, want %q", conf.Pool, c.pool)
			}
			if err == nil && !strings.Contains(c.in, `"cniVersion":"0`) && !strings.Contains(c.in, `"cniVersion":"1`) && conf.CNIVersion != "0.1.0" {
				t.Errorf("a configuration without cniVersion is 0.1.0 (the spec, libcni); parsed as %q", conf.CNIVersion)
			}
			if err != nil && err.(*types.Error).Msg == "" {
				t.Errorf("error without a message")
			}
		})
	}
}

func TestValidateIfName(t *testing.T) {
	good := []string{"eth0", "net1", "a", "fifteen-chars15"}
	bad := []string{"", ".", "..", "sixteen-chars-16", "a/b", "a b", "tab\tx", "a:b", "net%d", "a\x01b", "a\x7fb"}
	for _, n := range good {
		if err := ValidateIfName(n); err != nil {
			t.Errorf("ValidateIfName(%q) = %v, want ok", n, err)
		}
	}
	for _, n := range bad {
		if err := ValidateIfName(n); err == nil {
			t.Errorf("ValidateIfName(%q) = nil, want error", n)
		}
	}
}

func TestValidateContainerID(t *testing.T) {
	for _, id := range []string{"abc", "a_b.c-d", "0123456789abcdef"} {
		if err := ValidateContainerID(id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	for _, id := range []string{"", "-abc", "a b", "a/b", strings.Repeat("a", 257)} {
		if err := ValidateContainerID(id); err == nil {
			t.Errorf("%q accepted", id)
		}
	}
}

func TestStaticIPs(t *testing.T) {
	conf := func(s string) *NetConf {
		c, err := Parse([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cases := []struct {
		name, conf, args string
		want             []string
		code             uint
	}{
		{"none", `{"cniVersion":"1.0.0","name":"n"}`, "", nil, 0},
		{"capability with prefix", `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ips":["10.1.0.5/24"]}}`, "", []string{"10.1.0.5"}, 0},
		{"args.cni.ips", `{"cniVersion":"1.0.0","name":"n","args":{"cni":{"ips":["fd00::5"]}}}`, "", []string{"fd00::5"}, 0},
		{"CNI_ARGS IP", `{"cniVersion":"1.0.0","name":"n"}`, "IgnoreUnknown=1;IP=10.1.0.7,fd00::7;K8S_POD_NAME=x", []string{"10.1.0.7", "fd00::7"}, 0},
		{"duplicate folded", `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ips":["10.1.0.5"]}}`, "IP=10.1.0.5", []string{"10.1.0.5"}, 0},
		{"two v4", `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ips":["10.1.0.5"]}}`, "IP=10.1.0.6", nil, types.ErrInvalidNetworkConfig},
		{"garbage", `{"cniVersion":"1.0.0","name":"n"}`, "IP=banana", nil, types.ErrInvalidNetworkConfig},
		{"bad CNI_ARGS", `{"cniVersion":"1.0.0","name":"n"}`, "novalue", nil, types.ErrInvalidEnvironmentVariables},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := StaticIPs(conf(c.conf), c.args)
			if code(err) != c.code {
				t.Fatalf("code %d (%v), want %d", code(err), err, c.code)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != netip.MustParseAddr(c.want[i]) {
					t.Errorf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

var attached = Attached{
	HostName: "sk0123456789ab", HostMAC: "02:00:00:00:00:01", IfName: "eth0", ContainerMAC: "02:00:00:00:00:02",
	Sandbox: "/run/netns/p", Addrs: []netip.Addr{netip.MustParseAddr("10.64.0.5"), netip.MustParseAddr("fd00:64::5")},
	GatewayV4: netip.MustParseAddr("169.254.1.1"), GatewayV6: netip.MustParseAddr("fe80::1"),
}

func TestBuildResultEveryVersion(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			conf, err := Parse([]byte(`{"cniVersion":"` + v + `","name":"n","dns":{"nameservers":["10.0.0.10"]}}`))
			if err != nil {
				t.Fatal(err)
			}
			res, err := BuildResult(conf, attached)
			if err != nil {
				t.Fatal(err)
			}
			out, err := Encode(res, v)
			if err != nil {
				t.Fatal(err)
			}
			var raw map[string]any
			if err := json.Unmarshal(out, &raw); err != nil {
				t.Fatal(err)
			}
			if raw["cniVersion"] != v {
				t.Errorf("cniVersion %v, want %s", raw["cniVersion"], v)
			}
			switch v {
			case "0.1.0", "0.2.0":
				// One address per family, no interfaces (SPEC 0.2.0).
				r := res.(*types020.Result)
				if r.IP4 == nil || r.IP4.IP.String() != "10.64.0.5/32" || r.IP4.Gateway.String() != "169.254.1.1" {
					t.Errorf("0.2.0 ip4 wrong: %s", out)
				}
				if r.IP6 == nil || r.IP6.IP.String() != "fd00:64::5/128" || r.IP6.Gateway.String() != "fe80::1" {
					t.Errorf("0.2.0 ip6 wrong: %s", out)
				}
				if len(r.IP4.Routes) != 1 || r.IP4.Routes[0].Dst.String() != "0.0.0.0/0" || len(r.IP6.Routes) != 1 {
					t.Errorf("0.2.0 default routes wrong: %s", out)
				}
				if len(r.DNS.Nameservers) != 1 {
					t.Errorf("dns from config missing: %s", out)
				}
				for _, k := range []string{"interfaces", "ips", "routes"} {
					if _, ok := raw[k]; ok {
						t.Errorf("a %s result has no %q: %s", v, k, out)
					}
				}
			case "0.3.0", "0.3.1", "0.4.0":
				r := res.(*types040.Result)
				if len(r.IPs) != 2 || r.IPs[0].Interface == nil || *r.IPs[0].Interface != 1 || r.IPs[0].Address.String() != "10.64.0.5/32" {
					t.Errorf("0.x result IPs wrong: %s", out)
				}
				if !strings.Contains(string(out), `"version":"4"`) || !strings.Contains(string(out), `"version":"6"`) {
					t.Errorf("0.x result lacks per-IP version: %s", out)
				}
			default:
				r := res.(*current.Result)
				if len(r.Interfaces) != 2 || r.Interfaces[1].Sandbox != "/run/netns/p" || r.IPs[1].Address.String() != "fd00:64::5/128" {
					t.Errorf("result wrong: %s", out)
				}
				if r.IPs[0].Gateway.String() != "169.254.1.1" || r.IPs[1].Gateway.String() != "fe80::1" {
					t.Errorf("gateways wrong: %s", out)
				}
				if len(r.DNS.Nameservers) != 1 {
					t.Errorf("dns from config missing: %s", out)
				}
			}
		})
	}
}

func TestBuildResultChained(t *testing.T) {
	in := `{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0",
		"interfaces":[{"name":"dummy0"},{"name":"x","sandbox":"/run/netns/p"}],
		"ips":[{"address":"192.168.0.2/24","interface":1}],
		"dns":{"nameservers":["1.1.1.1"]}}}`
	conf, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	res, err := BuildResult(conf, attached)
	if err != nil {
		t.Fatal(err)
	}
	r := res.(*current.Result)
	if len(r.Interfaces) != 4 || r.Interfaces[0].Name != "dummy0" || r.Interfaces[2].Name != attached.HostName || r.Interfaces[3].Name != "eth0" {
		t.Fatalf("interfaces not appended: %+v", r.Interfaces)
	}
	if len(r.IPs) != 3 || *r.IPs[0].Interface != 1 || *r.IPs[1].Interface != 3 || *r.IPs[2].Interface != 3 {
		t.Fatalf("ip interface indices wrong: %v", r.IPs)
	}
	if len(r.DNS.Nameservers) != 1 || r.DNS.Nameservers[0] != "1.1.1.1" {
		t.Errorf("prevResult DNS lost: %+v", r.DNS)
	}
	prev, err := PrevAddrs(conf, "x")
	if err != nil || len(prev) != 1 || prev[0] != netip.MustParseAddr("192.168.0.2") {
		t.Errorf("PrevAddrs = %v, %v", prev, err)
	}
}

// TestBuildResultChainedLegacy: chained in 0.1.0/0.2.0, whose results hold
// one address per family and no interfaces, the result reports the
// addresses skein gave CNI_IFNAME, not the first ones of prevResult.
func TestBuildResultChainedLegacy(t *testing.T) {
	for _, v := range []string{"0.1.0", "0.2.0"} {
		in := `{"cniVersion":"` + v + `","name":"n","prevResult":{"cniVersion":"` + v + `",
			"ip4":{"ip":"192.168.0.2/24","gateway":"192.168.0.1","routes":[{"dst":"192.168.9.0/24"}]},
			"dns":{"nameservers":["1.1.1.1"]}}}`
		conf, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		res, err := BuildResult(conf, attached)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		r := res.(*types020.Result)
		if r.CNIVersion != v || r.IP4 == nil || r.IP4.IP.String() != "10.64.0.5/32" || r.IP6 == nil || r.IP6.IP.String() != "fd00:64::5/128" {
			t.Errorf("%s: want skein's addresses 10.64.0.5/32 and fd00:64::5/128, got %+v", v, r)
		}
		if len(r.DNS.Nameservers) != 1 || r.DNS.Nameservers[0] != "1.1.1.1" {
			t.Errorf("%s: prevResult DNS lost: %+v", v, r.DNS)
		}
	}
}

func TestAsError(t *testing.T) {
	if AsError(nil) != nil {
		t.Error("AsError(nil) != nil")
	}
	if e := AsError(types.NewError(7, "m", "d")); e.Code != 7 {
		t.Errorf("code lost: %v", e)
	}
	if e := AsError(json.Unmarshal([]byte("{"), &struct{}{})); e.Code != CodeInternal || e.Msg == "" {
		t.Errorf("plain error: %v", e)
	}
}

package conformance

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The result's field names per spec version (SPEC.md "Success" of each
// release): 0.1.0 and 0.2.0 have "ip4" and "ip6" (one address each, with
// its routes) and no interfaces; 0.3.0–0.4.0 give every IP a "version";
// 1.0.0 removed it; 1.1.0 added interface mtu/socketPath/pciID and route
// mtu/advmss/priority/table/scope.
var (
	topFields02 = []string{"cniVersion", "ip4", "ip6", "dns"}
	ipFields02  = []string{"ip", "gateway", "routes"}
	topFields   = []string{"cniVersion", "interfaces", "ips", "routes", "dns"}
	ifFields    = []string{"name", "mac", "sandbox"}
	ifFields110 = []string{"name", "mac", "sandbox", "mtu", "socketPath", "pciID"}
	ipFields04  = []string{"version", "interface", "address", "gateway"}
	ipFields10  = []string{"interface", "address", "gateway"}
	rtFields    = []string{"dst", "gw"}
	rtFields110 = []string{"dst", "gw", "mtu", "advmss", "priority", "table", "scope"}
	dnsFields   = []string{"nameservers", "domain", "search", "options"}
)

// shapeProblems checks a raw ADD result against the spec types of version
// v for a container interface ifName in sandbox, and returns what is wrong.
func shapeProblems(raw []byte, v, ifName, sandbox string) []string {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return []string{fmt.Sprintf("result is not a JSON object: %v", err)}
	}
	var ver string
	_ = json.Unmarshal(top["cniVersion"], &ver)
	if ver != v {
		add("cniVersion is %q, the configuration asked for %q", ver, v)
	}
	if v < "0.3.0" {
		return append(p, shapeProblems02(top)...)
	}
	unknown(add, "result", top, topFields)
	old := v < "1.0.0"
	ifAllowed, rtAllowed, ipAllowed := ifFields, rtFields, ipFields10
	if v >= "1.1.0" {
		ifAllowed, rtAllowed = ifFields110, rtFields110
	}
	if old {
		ipAllowed = ipFields04
	}

	var ifs []map[string]json.RawMessage
	_ = json.Unmarshal(top["interfaces"], &ifs)
	ctr, host := -1, -1
	for i, f := range ifs {
		unknown(add, fmt.Sprintf("interfaces[%d]", i), f, ifAllowed)
		var name, sb, mac string
		_ = json.Unmarshal(f["name"], &name)
		_ = json.Unmarshal(f["sandbox"], &sb)
		_ = json.Unmarshal(f["mac"], &mac)
		if name == "" {
			add("interfaces[%d] has no name", i)
		}
		if mac != "" {
			if _, err := net.ParseMAC(mac); err != nil {
				add("interfaces[%d].mac %q is not a MAC address", i, mac)
			}
		}
		switch {
		case name == ifName && sb == sandbox:
			ctr = i
		case sb == "" && host < 0:
			host = i
		}
	}
	if ctr < 0 {
		add("no interface %q with sandbox %q in %s", ifName, sandbox, top["interfaces"])
	}
	if host < 0 {
		add("no host-side interface (one without sandbox) in %s", top["interfaces"])
	}

	var ips []map[string]json.RawMessage
	_ = json.Unmarshal(top["ips"], &ips)
	if len(ips) == 0 {
		add("no ips")
	}
	for i, ip := range ips {
		where := fmt.Sprintf("ips[%d]", i)
		unknown(add, where, ip, ipAllowed)
		var addr, gw, fam string
		var idx *int
		_ = json.Unmarshal(ip["address"], &addr)
		_ = json.Unmarshal(ip["gateway"], &gw)
		_ = json.Unmarshal(ip["version"], &fam)
		if err := json.Unmarshal(ip["interface"], &idx); err != nil || idx == nil {
			add("%s.interface is missing or not an index (%s)", where, ip["interface"])
		} else if *idx != ctr {
			add("%s.interface is %d, the container interface %q is interfaces[%d]", where, *idx, ifName, ctr)
		}
		pfx, err := netip.ParsePrefix(addr)
		if err != nil {
			add("%s.address %q is not CIDR notation", where, addr)
			continue
		}
		if old {
			want := "4"
			if pfx.Addr().Is6() {
				want = "6"
			}
			if fam != want {
				add("%s.version is %q, %s needs %q", where, fam, addr, want)
			}
		}
		if gw == "" {
			add("%s has no gateway", where)
		} else if g, err := netip.ParseAddr(gw); err != nil || g.Is4() != pfx.Addr().Is4() {
			add("%s.gateway %q is not an address of the family of %s", where, gw, addr)
		}
	}

	var routes []map[string]json.RawMessage
	_ = json.Unmarshal(top["routes"], &routes)
	for i, r := range routes {
		unknown(add, fmt.Sprintf("routes[%d]", i), r, rtAllowed)
		var dst, gw string
		_ = json.Unmarshal(r["dst"], &dst)
		_ = json.Unmarshal(r["gw"], &gw)
		if _, err := netip.ParsePrefix(dst); err != nil {
			add("routes[%d].dst %q is not CIDR notation", i, dst)
		}
		if gw != "" {
			if _, err := netip.ParseAddr(gw); err != nil {
				add("routes[%d].gw %q is not an address", i, gw)
			}
		}
	}
	if d, ok := top["dns"]; ok {
		var dns map[string]json.RawMessage
		if err := json.Unmarshal(d, &dns); err != nil {
			add("dns is not an object: %s", d)
		}
		unknown(add, "dns", dns, dnsFields)
	}
	return p
}

// shapeProblems02 checks a 0.1.0/0.2.0 result: "ip4" and "ip6", each an
// address of its family in CIDR notation with an optional gateway of the
// same family and routes; at least one of them.
func shapeProblems02(top map[string]json.RawMessage) []string {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	unknown(add, "result", top, topFields02)
	if top["ip4"] == nil && top["ip6"] == nil {
		add("neither ip4 nor ip6 (0.2.0 requires at least one)")
	}
	for _, fam := range []string{"ip4", "ip6"} {
		if top[fam] == nil {
			continue
		}
		var ipc map[string]json.RawMessage
		if err := json.Unmarshal(top[fam], &ipc); err != nil {
			add("%s is not an object: %s", fam, top[fam])
			continue
		}
		unknown(add, fam, ipc, ipFields02)
		var ip, gw string
		_ = json.Unmarshal(ipc["ip"], &ip)
		_ = json.Unmarshal(ipc["gateway"], &gw)
		pfx, err := netip.ParsePrefix(ip)
		if err != nil {
			add("%s.ip %q is not CIDR notation", fam, ip)
			continue
		}
		if pfx.Addr().Is4() != (fam == "ip4") {
			add("%s.ip %s is of the other family", fam, ip)
		}
		if gw != "" {
			if g, err := netip.ParseAddr(gw); err != nil || g.Is4() != pfx.Addr().Is4() {
				add("%s.gateway %q is not an address of the family of %s", fam, gw, ip)
			}
		}
		var routes []map[string]json.RawMessage
		_ = json.Unmarshal(ipc["routes"], &routes)
		for i, r := range routes {
			unknown(add, fmt.Sprintf("%s.routes[%d]", fam, i), r, rtFields)
			var dst string
			_ = json.Unmarshal(r["dst"], &dst)
			if d, err := netip.ParsePrefix(dst); err != nil || d.Addr().Is4() != (fam == "ip4") {
				add("%s.routes[%d].dst %q is not CIDR notation of the family", fam, i, dst)
			}
		}
	}
	return p
}

func unknown(add func(string, ...any), where string, obj map[string]json.RawMessage, allowed []string) {
	var extra []string
	for k := range obj {
		if !slices.Contains(allowed, k) {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		add("%s has fields %v the spec does not define for this version (allowed: %s)", where, extra, strings.Join(allowed, ", "))
	}
}

// TestShapeChecker makes sure the checker itself catches what it should.
func TestShapeChecker(t *testing.T) {
	ok04 := `{"cniVersion":"0.4.0","interfaces":[{"name":"skh","mac":"02:00:00:00:00:01"},{"name":"eth0","mac":"02:00:00:00:00:02","sandbox":"/n"}],
	  "ips":[{"version":"4","interface":1,"address":"10.0.0.2/32","gateway":"169.254.1.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}],"dns":{}}`
	ok10 := `{"cniVersion":"1.0.0","interfaces":[{"name":"skh"},{"name":"eth0","sandbox":"/n"}],
	  "ips":[{"interface":1,"address":"fd00::2/128","gateway":"fe80::1"}],"routes":[{"dst":"::/0","gw":"fe80::1"}]}`
	ok02 := `{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/32","gateway":"169.254.1.1","routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}]},
	  "ip6":{"ip":"fd00::2/128","gateway":"fe80::1","routes":[{"dst":"::/0","gw":"fe80::1"}]},"dns":{}}`
	for _, c := range []struct {
		name, raw, v string
		want         string // substring of a problem; "" = no problem
	}{
		{"0.2.0 ok", ok02, "0.2.0", ""},
		{"0.1.0 ok", strings.Replace(ok02, `"0.2.0"`, `"0.1.0"`, 1), "0.1.0", ""},
		{"0.2.0 with interfaces", ok04, "0.2.0", "[interfaces ips routes]"},
		{"0.2.0 without addresses", `{"cniVersion":"0.2.0","dns":{}}`, "0.2.0", "neither ip4 nor ip6"},
		{"0.2.0 ip4 holding IPv6", strings.Replace(ok02, "10.0.0.2/32", "fd00::9/128", 1), "0.2.0", "other family"},
		{"0.4.0 ok", ok04, "0.4.0", ""},
		{"1.0.0 ok", ok10, "1.0.0", ""},
		{"wrong version", ok04, "0.3.1", `cniVersion is "0.4.0"`},
		{"0.x without ip version", strings.Replace(ok04, `"version":"4",`, "", 1), "0.4.0", `version is ""`},
		{"1.0 with ip version", strings.Replace(ok10, `{"interface"`, `{"version":"6","interface"`, 1), "1.0.0", "[version]"},
		{"bad index", strings.Replace(ok10, `"interface":1`, `"interface":0`, 1), "1.0.0", "interface is 0"},
		{"1.1 field in 1.0", strings.Replace(ok10, `"name":"skh"`, `"name":"skh","mtu":1500`, 1), "1.0.0", "[mtu]"},
		{"no gateway", strings.Replace(ok10, `,"gateway":"fe80::1"`, "", 1), "1.0.0", "no gateway"},
		{"no sandbox", strings.Replace(ok10, `,"sandbox":"/n"`, "", 1), "1.0.0", `no interface "eth0"`},
	} {
		got := strings.Join(shapeProblems([]byte(c.raw), c.v, "eth0", "/n"), "; ")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: problems %q, want one containing %q", c.name, got, c.want)
		}
	}
}

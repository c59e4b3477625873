package e2e

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	types020 "github.com/containernetworking/cni/pkg/types/020"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestChainSkeinThenTuning: skein as the main plugin with the reference
// tuning plugin after it (the usual place for sysctls); ADD, CHECK and DEL
// through the whole list.
func TestChainSkeinThenTuning(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	const sysctl = "net.ipv4.conf.eth0.arp_ignore"
	l := skeintest.ConfList(t, "chain-tuning", "1.0.0", // the Debian reference plugins stop at 1.0.0
		e.d.SkeinPlugin(nil),
		skeintest.Plugin{"type": "tuning", "dataDir": t.TempDir(), "sysctl": map[string]string{sysctl: "1"}})
	ns := harness.NewNS(t, "pod")
	p := e.mustAdd(t, l, ns, "tuned")
	if len(p.addrs) != 2 {
		t.Errorf("the chain's result should still carry skein's two addresses on eth0, has %v", p.res.IPs)
	}
	var got []byte
	if err := ns.Do(func() error {
		var err error
		got, err = os.ReadFile("/proc/sys/" + strings.ReplaceAll(sysctl, ".", "/"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != "1" {
		t.Errorf("tuning after skein should have set %s=1 on skein's eth0, it is %q", sysctl, got)
	}
	mustReach(t, ns, "tuned pod", gw4)
	if err := e.check(t, l, p.rt); err != nil {
		t.Errorf("CHECK through skein+tuning: expected success, got: %v", err)
	}
	e.mustDel(t, l, p.rt)
	e.assertNothingLeft(t)
}

// prevPlug is a minimal plugin for the head of a chain: on ADD it answers
// an interface outside any sandbox and DNS settings; DEL and CHECK succeed.
const prevPlug = `#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
ADD) printf '%s' '{"cniVersion":"1.0.0","interfaces":[{"name":"dummy0","mac":"02:00:00:00:00:01"}],"dns":{"nameservers":["192.0.2.53"],"search":["example.test"]}}' ;;
VERSION) printf '%s' '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
esac
exit 0
`

// TestChainSkeinLater: skein after another plugin keeps that plugin's
// interfaces and DNS in the result and appends its own, with IP entries
// pointing at the right interface index; CHECK and DEL work with that
// prevResult.
func TestChainSkeinLater(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prevplug"), []byte(prevPlug), 0o755); err != nil {
		t.Fatal(err)
	}
	rt := skeintest.NewCNI([]string{dir, e.d.BinDir, skeintest.RefPluginDir}, t.TempDir())
	l := skeintest.ConfList(t, "chain-later", "1.0.0", skeintest.Plugin{"type": "prevplug"}, e.d.SkeinPlugin(nil))
	ns := harness.NewNS(t, "pod")
	conf := skeintest.RT("later", ns.Path(), "eth0")

	r, err := rt.AddNetworkList(ctx(t), l, conf)
	if err != nil {
		t.Fatalf("ADD through prevplug+skein: expected a result, got: %v", err)
	}
	res := asCurrent(t, r)
	var names []string
	for _, i := range res.Interfaces {
		names = append(names, i.Name)
	}
	if len(names) != 3 || names[0] != "dummy0" || !strings.HasPrefix(names[1], "sk") || names[2] != "eth0" {
		t.Fatalf("result interfaces should be prevplug's dummy0, then skein's host veth and eth0; are %v", names)
	}
	if res.Interfaces[2].Sandbox != ns.Path() || res.Interfaces[0].Sandbox != "" {
		t.Errorf("sandboxes: dummy0 none (as prevplug said), eth0 %s; got %q and %q", ns.Path(), res.Interfaces[0].Sandbox, res.Interfaces[2].Sandbox)
	}
	if len(res.IPs) != 2 {
		t.Errorf("result should carry skein's two addresses, has %v", res.IPs)
	}
	for _, ip := range res.IPs {
		if ip.Interface == nil || *ip.Interface != 2 {
			t.Errorf("address %s should point at interface 2 (eth0 after prevplug's dummy0 and the host veth), points at %v", ip.Address.String(), ip.Interface)
		}
	}
	if !slices.Equal(res.DNS.Nameservers, []string{"192.0.2.53"}) || !slices.Equal(res.DNS.Search, []string{"example.test"}) {
		t.Errorf("skein must keep prevResult's DNS, result has %+v", res.DNS)
	}
	if addrs := ctrAddrs(res, "eth0", ns.Path()); len(addrs) == 2 {
		mustReach(t, ns, "pod chained after prevplug", gw4)
	}
	if err := rt.CheckNetworkList(ctx(t), l, conf); err != nil {
		t.Errorf("CHECK through prevplug+skein: expected success, got: %v", err)
	}
	if err := rt.DelNetworkList(ctx(t), l, conf); err != nil {
		t.Errorf("DEL through prevplug+skein: expected success, got: %v", err)
	}
	e.assertNothingLeft(t)
}

// prevPlugLegacy heads a 0.2.0 chain: on ADD it answers the 0.2.0 shape,
// one IPv4 address (not skein's) and DNS settings.
const prevPlugLegacy = `#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
ADD) printf '%s' '{"cniVersion":"0.2.0","ip4":{"ip":"192.0.2.5/24","gateway":"192.0.2.1"},"dns":{"nameservers":["192.0.2.53"]}}' ;;
VERSION) printf '%s' '{"cniVersion":"0.2.0","supportedVersions":["0.1.0","0.2.0"]}' ;;
esac
exit 0
`

// TestChainSkeinLaterLegacy: chained in 0.2.0 after a plugin that answered
// in 0.2.0, skein reads that prevResult, keeps its DNS and reports its own
// addresses (a 0.2.0 result has room for one per family, and skein's are
// what eth0 carries); DEL goes through the chain.
func TestChainSkeinLaterLegacy(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prevplug"), []byte(prevPlugLegacy), 0o755); err != nil {
		t.Fatal(err)
	}
	rt := skeintest.NewCNI([]string{dir, e.d.BinDir, skeintest.RefPluginDir}, t.TempDir())
	l := skeintest.ConfList(t, "chain-legacy", "0.2.0", skeintest.Plugin{"type": "prevplug"}, e.d.SkeinPlugin(nil))
	ns := harness.NewNS(t, "pod")
	conf := skeintest.RT("legacy", ns.Path(), "eth0")
	r, err := rt.AddNetworkList(ctx(t), l, conf)
	if err != nil {
		t.Fatalf("ADD through prevplug+skein in 0.2.0: expected a result, got: %v", err)
	}
	res, ok := r.(*types020.Result)
	if !ok || res.CNIVersion != "0.2.0" {
		t.Fatalf("a 0.2.0 chain should give a 0.2.0 result, got %T %v", r, r)
	}
	if res.IP4 == nil || res.IP4.IP.IP.Equal(net.IPv4(192, 0, 2, 5)) || !res.IP4.Gateway.Equal(gw4.AsSlice()) {
		t.Errorf("ip4 should be skein's address with gateway %s, not prevplug's 192.0.2.5: %+v", gw4, res.IP4)
	}
	if gw6 := e.hostGateway6(t, ns, "eth0"); res.IP6 == nil || !res.IP6.Gateway.Equal(gw6.AsSlice()) {
		t.Errorf("ip6 should be skein's address with gateway %s: %+v", gw6, res.IP6)
	}
	if !slices.Equal(res.DNS.Nameservers, []string{"192.0.2.53"}) {
		t.Errorf("skein must keep prevResult's DNS, result has %+v", res.DNS)
	}
	if res.IP4 != nil {
		if a, ok := netip.AddrFromSlice(res.IP4.IP.IP.To4()); ok {
			mustReach(t, ns, "pod chained after a 0.2.0 plugin", gw4)
			if atts := e.d.Attachments(t); len(atts) != 1 || len(atts[0].Addresses) == 0 || !slices.Contains(atts[0].Addresses, a.String()) {
				t.Errorf("skeind's attachment should hold the result's %s: %s", a, describe(atts))
			}
		}
	}
	if err := rt.DelNetworkList(ctx(t), l, conf); err != nil {
		t.Errorf("DEL through prevplug+skein in 0.2.0: expected success, got: %v", err)
	}
	e.assertNothingLeft(t)
}

package e2e

import (
	"encoding/json"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types020 "github.com/containernetworking/cni/pkg/types/020"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

var gw4 = netip.MustParseAddr("169.254.1.1")

// linkLocal is the modified EUI-64 link-local address of a MAC (RFC 4291,
// appendix A): a pod's IPv6 gateway is that of its host veth.
func linkLocal(t *testing.T, mac string) netip.Addr {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		t.Fatalf("MAC %q: %v", mac, err)
	}
	return netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 8: hw[0] ^ 2, 9: hw[1], 10: hw[2], 11: 0xff, 12: 0xfe, 13: hw[3], 14: hw[4], 15: hw[5]})
}

// hostGateway6 is the IPv6 gateway of the pod interface ifName in ns: the
// link-local address of its peer, the host veth in the node namespace.
func (e *env) hostGateway6(t *testing.T, ns *harness.NS, ifName string) netip.Addr {
	t.Helper()
	l, err := ns.Handle(t).LinkByName(ifName)
	if err != nil {
		t.Fatalf("%s in the pod: %v", ifName, err)
	}
	host, err := e.d.Node.Handle(t).LinkByIndex(l.Attrs().ParentIndex)
	if err != nil {
		t.Fatalf("host veth of %s: %v", ifName, err)
	}
	return linkLocal(t, host.Attrs().HardwareAddr.String())
}

// specVersions is every version the spec has had; skein accepts them all.
var specVersions = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// noVersion stands for a configuration without "cniVersion", which the
// spec and libcni read as 0.1.0.
const noVersion = "none"

// versionedList is a skein conflist in version v, or without cniVersion
// when v is noVersion.
func (e *env) versionedList(t *testing.T, name, v string) *libcni.NetworkConfigList {
	t.Helper()
	if v != noVersion {
		return e.list(t, name, v, nil)
	}
	b, err := json.Marshal(map[string]any{"name": name, "plugins": []skeintest.Plugin{e.d.SkeinPlugin(nil)}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("conflist without cniVersion: %v", err)
	}
	return l
}

// TestEveryVersion runs the whole life of two dual-stack pods in every spec
// version (and without cniVersion, which is 0.1.0): ADD (result in that
// version's types), traffic, CHECK (0.4.0+), DEL, DEL again; nothing may
// be left afterwards.
func TestEveryVersion(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	pool := []netip.Prefix{netip.MustParsePrefix("10.64.0.0/16"), netip.MustParsePrefix("fd00:64::/112")}
	for _, v := range append(specVersions, noVersion) {
		t.Run(v, func(t *testing.T) {
			l := e.versionedList(t, "net-"+strings.ReplaceAll(v, ".", ""), v)
			nsA, nsB := harness.NewNS(t, "pod"), harness.NewNS(t, "pod")
			a := e.addChecked(t, l, nsA, "ctr-a-"+v, pool)
			b := e.addChecked(t, l, nsB, "ctr-b-"+v, pool)
			if a.addr(false) == b.addr(false) || a.addr(true) == b.addr(true) {
				t.Fatalf("two pods got the same address: %v and %v", a.addrs, b.addrs)
			}
			if atts := e.d.Attachments(t); len(atts) != 2 {
				t.Errorf("skeind should list the 2 attachments just made, lists %d: %s", len(atts), describe(atts))
			}

			mustReach(t, nsA, "pod a to pod b", b.addrs...)
			mustReach(t, nsB, "pod b to pod a", a.addrs...)
			mustReach(t, nsA, "pod a to its IPv4 gateway on the node", gw4)
			gw6 := e.hostGateway6(t, nsA, "eth0")
			if out, err := nsA.Exec(t, "ping", "-6", "-c1", "-W2", gw6.String()+"%eth0"); err != nil {
				t.Errorf("pod a should reach its IPv6 gateway %s on the node: %v\n%s", gw6, err, out)
			}

			if v >= "0.4.0" && v != noVersion {
				for _, p := range []*pod{a, b} {
					if err := e.check(t, l, p.rt); err != nil {
						t.Errorf("CHECK %s right after ADD: the spec expects success, got: %v", p.rt.ContainerID, err)
					}
				}
			}
			for _, p := range []*pod{a, b} {
				e.mustDel(t, l, p.rt)
				if err := e.del(t, l, p.rt); err != nil {
					t.Errorf("second DEL of %s: the spec requires DEL to succeed for something already gone, got: %v", p.rt.ContainerID, err)
				}
			}
			e.assertNothingLeft(t)
		})
	}
}

// TestSingleFamilyPools: a pool with only IPv4 (only IPv6) subnets gives
// pods only an address of that family, and they reach each other.
func TestSingleFamilyPools(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	e.createPool(t, "v4only", 4, "10.65.0.0/24")
	e.createPool(t, "v6only", 4, "fd00:65::/120")
	for _, c := range []struct {
		pool   string
		subnet netip.Prefix
	}{
		{"v4only", netip.MustParsePrefix("10.65.0.0/24")},
		{"v6only", netip.MustParsePrefix("fd00:65::/120")},
	} {
		t.Run(c.pool, func(t *testing.T) {
			l := e.list(t, "net-"+c.pool, "1.1.0", skeintest.Plugin{"pool": c.pool})
			nsA, nsB := harness.NewNS(t, "pod"), harness.NewNS(t, "pod")
			a := e.addChecked(t, l, nsA, "ctr-a", []netip.Prefix{c.subnet})
			b := e.addChecked(t, l, nsB, "ctr-b", []netip.Prefix{c.subnet})
			mustReach(t, nsA, "pod a to pod b", b.addrs...)
			mustReach(t, nsB, "pod b to pod a", a.addrs...)
			for _, p := range []*pod{a, b} {
				if err := e.check(t, l, p.rt); err != nil {
					t.Errorf("CHECK %s: the spec expects success, got: %v", p.rt.ContainerID, err)
				}
				e.mustDel(t, l, p.rt)
			}
			e.assertNothingLeft(t)
		})
	}
}

// addChecked ADDs and verifies the result against the spec version of l and
// the kernel: one address per family of pool, each inside pool, as /32 or
// /128 on eth0 in the sandbox, gateways and default routes as skein
// documents, the host veth tagged in the node namespace.
func (e *env) addChecked(t *testing.T, l *libcni.NetworkConfigList, ns *harness.NS, id string, pool []netip.Prefix) *pod {
	t.Helper()
	rt := skeintest.RT(id, ns.Path(), "eth0")
	r, err := e.add(t, l, rt)
	if err != nil {
		t.Fatalf("ADD %s (cniVersion %q): the spec expects a result, got: %v", id, l.CNIVersion, err)
	}
	v := l.CNIVersion
	if v == "" {
		v = "0.1.0"
	}
	checkResultType(t, r, v)
	if v < "0.3.0" {
		return e.checkLegacy(t, l, r, rt, ns, pool)
	}
	res := asCurrent(t, r)
	p := &pod{ns: ns, rt: rt, res: res, addrs: ctrAddrs(res, "eth0", ns.Path())}

	if len(res.Interfaces) != 2 {
		t.Fatalf("result should list 2 interfaces (host veth, then eth0 in the sandbox), has %d: %v", len(res.Interfaces), res)
	}
	host, ctr := res.Interfaces[0], res.Interfaces[1]
	if !strings.HasPrefix(host.Name, "sk") || host.Sandbox != "" || host.Mac == "" {
		t.Errorf("result interface 0 should be the host veth sk<hex> with a MAC and no sandbox, is %+v", *host)
	}
	if ctr.Name != "eth0" || ctr.Sandbox != ns.Path() || ctr.Mac == "" {
		t.Errorf("result interface 1 should be eth0 with a MAC in sandbox %s, is %+v", ns.Path(), *ctr)
	}
	if len(res.IPs) != len(pool) || len(p.addrs) != len(pool) {
		t.Fatalf("result should give eth0 one address per pool family (%d), gives %v", len(pool), res.IPs)
	}
	for _, ip := range res.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		a = a.Unmap()
		ones, bits := ip.Address.Mask.Size()
		if ones != bits || ones != a.BitLen() {
			t.Errorf("result address %v should be a host address (/32 or /128)", ip.Address.String())
		}
		inPool := false
		for _, s := range pool {
			inPool = inPool || s.Contains(a)
		}
		if !inPool {
			t.Errorf("result address %v is not in pool %v", a, pool)
		}
		wantGW := gw4
		if a.Is6() {
			wantGW = linkLocal(t, host.Mac) // the host veth's own
		}
		if g, _ := netip.AddrFromSlice(ip.Gateway); g.Unmap() != wantGW {
			t.Errorf("result gateway of %v should be %v, is %v", a, wantGW, ip.Gateway)
		}
	}
	if len(res.Routes) != len(pool) {
		t.Errorf("result should carry one default route per family, has %v", res.Routes)
	}

	// The kernel agrees with the result.
	link, err := ns.Handle(t).LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 should exist in the pod after ADD: %v", err)
	}
	if link.Attrs().HardwareAddr.String() != ctr.Mac {
		t.Errorf("eth0 MAC is %v, result says %s", link.Attrs().HardwareAddr, ctr.Mac)
	}
	kaddrs, err := ns.Handle(t).AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range p.addrs {
		found := false
		for _, k := range kaddrs {
			ones, _ := k.Mask.Size()
			ka, _ := netip.AddrFromSlice(k.IP)
			found = found || ka.Unmap() == a && ones == a.BitLen()
		}
		if !found {
			t.Errorf("eth0 in the pod should hold %v/%d, holds %v", a, a.BitLen(), kaddrs)
		}
	}
	hl, err := e.d.Node.Handle(t).LinkByName(host.Name)
	if err != nil {
		t.Fatalf("host veth %s from the result should exist in the node namespace: %v", host.Name, err)
	}
	if want := "skein:" + l.Name + ":" + id + ":eth0"; hl.Attrs().Alias != want {
		t.Errorf("host veth alias should be %q, is %q", want, hl.Attrs().Alias)
	}
	return p
}

// checkLegacy verifies a 0.1.0/0.2.0 result, {"ip4", "ip6", "dns"} with one
// address per family and no interfaces, against pool and the kernel.
func (e *env) checkLegacy(t *testing.T, l *libcni.NetworkConfigList, r types.Result, rt *libcni.RuntimeConf, ns *harness.NS, pool []netip.Prefix) *pod {
	t.Helper()
	res, ok := r.(*types020.Result)
	if !ok {
		t.Fatalf("result of type %T", r)
	}
	raw, _ := json.Marshal(r)
	for _, k := range []string{`"interfaces"`, `"ips"`} {
		if strings.Contains(string(raw), k) {
			t.Errorf("a %s result has no %s: %s", r.Version(), k, raw)
		}
	}
	var addrs []netip.Addr
	for _, s := range pool {
		ipc, wantGW, fam := res.IP4, gw4, "ip4"
		if s.Addr().Is6() {
			ipc, wantGW, fam = res.IP6, e.hostGateway6(t, ns, rt.IfName), "ip6"
		}
		if ipc == nil {
			t.Errorf("result should carry %s for pool subnet %s: %s", fam, s, raw)
			continue
		}
		a, _ := netip.AddrFromSlice(ipc.IP.IP)
		a = a.Unmap()
		if ones, bits := ipc.IP.Mask.Size(); ones != bits || !s.Contains(a) {
			t.Errorf("%s.ip %s should be a host address in %s", fam, ipc.IP.String(), s)
		}
		if g, _ := netip.AddrFromSlice(ipc.Gateway); g.Unmap() != wantGW {
			t.Errorf("%s.gateway should be %s, is %v", fam, wantGW, ipc.Gateway)
		}
		if len(ipc.Routes) != 1 || !isDefault(ipc.Routes[0].Dst) {
			t.Errorf("%s.routes should hold the default route, holds %v", fam, ipc.Routes)
		}
		addrs = append(addrs, a)
	}
	link, err := ns.Handle(t).LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 should exist in the pod after ADD: %v", err)
	}
	kaddrs, err := ns.Handle(t).AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		found := false
		for _, k := range kaddrs {
			ka, _ := netip.AddrFromSlice(k.IP)
			ones, _ := k.Mask.Size()
			found = found || ka.Unmap() == a && ones == a.BitLen()
		}
		if !found {
			t.Errorf("eth0 in the pod should hold %v/%d, holds %v", a, a.BitLen(), kaddrs)
		}
	}
	links, err := e.d.Node.Handle(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	tag, tagged := "skein:"+l.Name+":"+rt.ContainerID+":eth0", false
	for _, hl := range links {
		tagged = tagged || hl.Attrs().Alias == tag
	}
	if !tagged {
		t.Errorf("a host veth tagged %q should be in the node namespace", tag)
	}
	return &pod{ns: ns, rt: rt, res: asCurrent(t, r), addrs: addrs}
}

func isDefault(n net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0 && n.IP.IsUnspecified()
}

// checkResultType: libcni decodes the plugin's output with the types of the
// configuration's version; the plugin must have answered in that version.
func checkResultType(t *testing.T, r types.Result, version string) {
	t.Helper()
	if r.Version() != version {
		t.Errorf("result version should be the configuration's %s, is %s", version, r.Version())
	}
	switch res := r.(type) {
	case *types020.Result:
		if version >= "0.3.0" {
			t.Errorf("a %s result should not decode as types020", version)
		}
	case *types040.Result:
		if version >= "1.0.0" || version < "0.3.0" {
			t.Errorf("a %s result should decode as types100, decoded as types040", version)
		}
		for _, ip := range res.IPs {
			want := "4"
			if ip.Address.IP.To4() == nil {
				want = "6"
			}
			if ip.Version != want {
				t.Errorf("a %s result must carry the IP version field: %v has %q, want %q", version, ip.Address.String(), ip.Version, want)
			}
		}
	case *types100.Result:
		if version < "1.0.0" {
			t.Errorf("a %s result should decode as types040, decoded as types100", version)
		}
	default:
		t.Errorf("result of type %T for version %s", r, version)
	}
}

package e2e

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestStaticAddresses: every way a runtime can ask for a fixed address —
// the "ips" capability, CNI_ARGS IP= and args.cni.ips — gives the pod
// exactly that address; a family without a static address gets a dynamic
// one; after DEL the address can be asked for again.
func TestStaticAddresses(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	capList := skeintest.ConfList(t, "static-cap", "1.1.0",
		e.d.SkeinPlugin(skeintest.Plugin{"capabilities": map[string]bool{"ips": true}}))
	plain := e.list(t, "static-plain", "1.1.0", nil)
	for _, c := range []struct {
		name string
		list func(t *testing.T) *libcni.NetworkConfigList
		rt   func(ns *harness.NS) *libcni.RuntimeConf
		want []string // exact static addresses; a missing family is dynamic
	}{
		{
			name: "capability ips, both families with prefix",
			list: func(*testing.T) *libcni.NetworkConfigList { return capList },
			rt: func(ns *harness.NS) *libcni.RuntimeConf {
				rt := skeintest.RT("ctr-cap", ns.Path(), "eth0")
				rt.CapabilityArgs = map[string]any{"ips": []string{"10.64.7.7/16", "fd00:64::707/112"}}
				return rt
			},
			want: []string{"10.64.7.7", "fd00:64::707"},
		},
		{
			name: "CNI_ARGS IP= IPv4 only",
			list: func(*testing.T) *libcni.NetworkConfigList { return plain },
			rt: func(ns *harness.NS) *libcni.RuntimeConf {
				rt := skeintest.RT("ctr-args4", ns.Path(), "eth0")
				rt.Args = [][2]string{{"IP", "10.64.8.8"}}
				return rt
			},
			want: []string{"10.64.8.8"},
		},
		{
			name: "CNI_ARGS IP= both families",
			list: func(*testing.T) *libcni.NetworkConfigList { return plain },
			rt: func(ns *harness.NS) *libcni.RuntimeConf {
				rt := skeintest.RT("ctr-args46", ns.Path(), "eth0")
				rt.Args = [][2]string{{"IP", "10.64.9.9,fd00:64::909"}}
				return rt
			},
			want: []string{"10.64.9.9", "fd00:64::909"},
		},
		{
			name: "args.cni.ips IPv6 only",
			list: func(t *testing.T) *libcni.NetworkConfigList {
				return e.list(t, "static-netconf", "1.1.0", skeintest.Plugin{"args": map[string]any{"cni": map[string]any{"ips": []string{"fd00:64::a0a"}}}})
			},
			rt:   func(ns *harness.NS) *libcni.RuntimeConf { return skeintest.RT("ctr-netconf", ns.Path(), "eth0") },
			want: []string{"fd00:64::a0a"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.list(t)
			for round := 0; round < 2; round++ { // the second round proves DEL released the address
				ns := harness.NewNS(t, "pod")
				rt := c.rt(ns)
				r, err := e.add(t, l, rt)
				if err != nil {
					t.Fatalf("ADD with static %v (round %d): expected success, got: %v", c.want, round, err)
				}
				got := ctrAddrs(asCurrent(t, r), "eth0", ns.Path())
				if len(got) != 2 {
					t.Errorf("a dual-stack pool gives one address per family (static or dynamic); got %v", got)
				}
				for _, w := range c.want {
					if !slices.Contains(got, netip.MustParseAddr(w)) {
						t.Errorf("pod should get exactly the static address %s, result gives %v", w, got)
					}
					assertPodHas(t, ns, netip.MustParseAddr(w))
				}
				e.mustDel(t, l, rt)
			}
			e.assertNothingLeft(t)
		})
	}
}

// assertPodHas checks that eth0 in ns holds a as a host address.
func assertPodHas(t *testing.T, ns *harness.NS, a netip.Addr) {
	t.Helper()
	h := ns.Handle(t)
	link, err := h.LinkByName("eth0")
	if err != nil {
		t.Errorf("eth0 missing in pod: %v", err)
		return
	}
	addrs, _ := h.AddrList(link, netlink.FAMILY_ALL)
	for _, k := range addrs {
		ka, _ := netip.AddrFromSlice(k.IP)
		if ones, _ := k.Mask.Size(); ka.Unmap() == a && ones == a.BitLen() {
			return
		}
	}
	t.Errorf("eth0 in the pod should hold %s/%d, holds %v", a, a.BitLen(), addrs)
}

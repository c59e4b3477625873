package vm

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

const dhclient6Script = `#!/bin/sh
dir=%q
case "$reason" in
BOUND6|RENEW6|REBIND6|REBOOT6)
	env | sort > "$dir/$reason.env"
	ip -6 addr replace "$new_ip6_address/$new_ip6_prefixlen" dev "$interface" nodad ;;
esac
echo "$reason" >> "$dir/events"
exit 0
`

// TestDHCPv6AndRA: IPv6 for the VM. dhclient -6 gets the pod's address
// and DNS over DHCPv6; the router advertisements (sent as the result's
// gateway, the host veth's link-local address) give the VM's kernel its
// default route and MTU; the VM side then reaches another pod over IPv6.
func TestDHCPv6AndRA(t *testing.T) {
	skeintest.RequireTool(t, "dhclient")
	e := newEnv(t)
	dns := map[string]any{"nameservers": []string{"10.96.0.10", "fd00:96::10"}, "search": []string{"svc.cluster.local", "cluster.local"}}
	l := skeintest.ConfList(t, "vm-v6", "1.1.0", e.d.SkeinPlugin(skeintest.Plugin{"dns": dns, "mtu": podMTU}), e.skeinVM(nil))
	p := e.mustAddVM(t, l, "v6pod")
	if !p.addr6.IsValid() {
		t.Fatal("the default test pool is dual-stack: the pod should have an IPv6 address")
	}
	other := harness.NewNS(t, "other6")
	plain := skeintest.ConfList(t, "vm-v6", "1.1.0", e.d.SkeinPlugin(nil))
	ort := skeintest.RT("plain6", other.Path(), "eth0")
	ores, err := e.add(plain, ort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.del(plain, ort) })
	var target netip.Addr
	for _, ip := range ores.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Is6() && ip.Address.IP.To4() == nil {
			target = a
		}
	}

	vm, ifName := p.vmSide(t)
	h := vm.Handle(t)
	link, err := h.LinkByName(ifName)
	if err != nil {
		t.Fatal(err)
	}
	// dhclient -6 binds to the link-local address: wait for DAD.
	waitFor(t, 5*time.Second, "a usable link-local address", func() bool {
		addrs, _ := h.AddrList(link, netlink.FAMILY_V6)
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return true
			}
		}
		return false
	})

	dir, script := clientScript(t, dhclient6Script)
	common := []string{"-6", "-sf", script, "-lf", filepath.Join(dir, "leases"), "-pf", filepath.Join(dir, "pid")}
	t.Cleanup(func() {
		_, _ = run(t, vm, 10*time.Second, "dhclient", append(append([]string{"-x"}, common...), ifName)...)
	})
	out, err := run(t, vm, 30*time.Second, "dhclient", append(append([]string{"-1"}, common...), ifName)...)
	if err != nil || !waitEvent(t, dir, "BOUND6", time.Second) {
		t.Fatalf("dhclient -6 got no lease: %v\n%s", err, out)
	}
	env := readEnv(t, filepath.Join(dir, "BOUND6.env"))
	if got := env["new_ip6_address"]; got != p.addr6.Addr().String() {
		t.Errorf("DHCPv6 address %q, the CNI result has %s", got, p.addr6.Addr())
	}
	if got := words(env["new_dhcp6_name_servers"]); !slices.Equal(got, []string{"fd00:96::10"}) {
		t.Errorf("DHCPv6 DNS %v, want the result's IPv6 nameserver", got)
	}
	if got := words(env["new_dhcp6_domain_search"]); !slices.Equal(got, []string{"svc.cluster.local", "cluster.local"}) {
		t.Errorf("DHCPv6 search list %v", got)
	}
	if !p.gw6.IsLinkLocalUnicast() {
		t.Fatalf("the result's IPv6 gateway should be link-local (the host veth's), is %v", p.gw6)
	}
	waitFor(t, 10*time.Second, "a default route via "+p.gw6.String()+" from the router advertisements", func() bool {
		routes, _ := h.RouteList(link, netlink.FAMILY_V6)
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.String() == "::/0") && r.Gw.String() == p.gw6.String() {
				return true
			}
		}
		return false
	})
	mtu6, _ := readFileIn(vm, "/proc/sys/net/ipv6/conf/"+ifName+"/mtu")
	if mtu6 != fmt.Sprint(podMTU) {
		t.Errorf("RA MTU option: the VM's IPv6 MTU is %q, want %d", mtu6, podMTU)
	}
	var perr error
	for i := 0; i < 5; i++ { // neighbour discovery of the gateway may cost the first echo
		if perr = harness.Ping(t, vm, target); perr == nil {
			break
		}
	}
	if perr != nil {
		t.Errorf("the VM side should reach pod %s over IPv6: %v", target, perr)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("no %s within %v", what, d)
}

func readFileIn(ns *harness.NS, path string) (string, error) {
	var b []byte
	err := ns.Do(func() error {
		var err error
		b, err = os.ReadFile(path)
		return err
	})
	return string(bytesTrim(b)), err
}

func bytesTrim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// The DNS settings every test network hands out through the main plugin.
var (
	testDNS = map[string]any{
		"nameservers": []string{"10.96.0.10", "10.96.0.11"},
		"search":      []string{"default.svc.cluster.local", "svc.cluster.local", "cluster.local"},
		"domain":      "cluster.local",
	}
	podMTU = 1400 // not the default, so the test sees it travel to the client
)

const callTimeout = 60 * time.Second

// env is one skeind with the VM front door, serving one node namespace.
type env struct {
	d   *skeintest.Daemon
	cni *libcni.CNIConfig
}

func newEnv(t testing.TB) *env {
	t.Helper()
	harness.RequireRoot(t)
	d := skeintest.StartDaemon(t, skeintest.Options{})
	return &env{d: d, cni: d.CNI()}
}

// vmSocket and tokenDir are where skeind put the handover socket and the
// tokens: beside its gRPC socket.
func (e *env) vmSocket() string { return filepath.Join(filepath.Dir(e.d.Socket), "vm.sock") }
func (e *env) tokenDir() string { return filepath.Join(filepath.Dir(e.d.Socket), "vm-tokens") }

// skeinVM is the chained VM plugin entry.
func (e *env) skeinVM(extra skeintest.Plugin) skeintest.Plugin {
	p := skeintest.Plugin{"type": "skein-vm", "socket": e.d.Socket}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

// skeinChain is skein (with DNS and an MTU) followed by skein-vm.
func (e *env) skeinChain(t testing.TB, name, version string, vmExtra skeintest.Plugin) *libcni.NetworkConfigList {
	return skeintest.ConfList(t, name, version,
		e.d.SkeinPlugin(skeintest.Plugin{"dns": testDNS, "mtu": podMTU}), e.skeinVM(vmExtra))
}

func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

func (e *env) add(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*types100.Result, error) {
	c, cancel := callCtx()
	defer cancel()
	r, err := e.cni.AddNetworkList(c, l, rt)
	if err != nil {
		return nil, err
	}
	return types100.NewResultFromResult(r)
}

func (e *env) del(l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	c, cancel := callCtx()
	defer cancel()
	return e.cni.DelNetworkList(c, l, rt)
}

// vmPod is a pod whose interface was handed to a VM: the pod namespace,
// the runtime config and the chain's result.
type vmPod struct {
	ns  *harness.NS
	rt  *libcni.RuntimeConf
	res *types100.Result
	// addr4/addr6 are the addresses of the main plugin's interface (with
	// the prefix it gave), gw4 and gw6 its gateways.
	addr4, addr6 netip.Prefix
	gw4, gw6     netip.Addr
	vmMAC        string // the tap's MAC in the result
	tap, bridge  string
}

// mustAddVM runs ADD for a new pod through l and checks the result's shape.
func (e *env) mustAddVM(t testing.TB, l *libcni.NetworkConfigList, id string, args ...[2]string) *vmPod {
	t.Helper()
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT(id, ns.Path(), "eth0")
	rt.Args = args
	res, err := e.add(l, rt)
	if err != nil {
		t.Fatalf("ADD %s through %s: the chain should succeed, got: %v", id, l.Name, err)
	}
	t.Cleanup(func() { _ = e.del(l, rt) })
	p := &vmPod{ns: ns, rt: rt, res: res}
	for _, ip := range res.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		ones, _ := ip.Address.Mask.Size()
		pf := netip.PrefixFrom(a.Unmap(), ones)
		if pf.Addr().Is4() {
			p.addr4 = pf
			p.gw4, _ = netip.AddrFromSlice(ip.Gateway.To4())
		} else {
			p.addr6 = pf
			p.gw6, _ = netip.AddrFromSlice(ip.Gateway)
		}
	}
	for _, i := range res.Interfaces {
		switch {
		case strings.HasPrefix(i.Name, "sktap"):
			p.tap, p.vmMAC = i.Name, i.Mac
		case strings.HasPrefix(i.Name, "skbr"):
			p.bridge = i.Name
		}
	}
	if p.tap == "" || p.bridge == "" || p.vmMAC == "" {
		t.Fatalf("the result should name the bridge and the tap (with the VM's MAC); interfaces are %s", ifaces(res))
	}
	return p
}

func ifaces(res *types100.Result) string {
	var s []string
	for _, i := range res.Interfaces {
		s = append(s, fmt.Sprintf("%s(%s,%q)", i.Name, i.Mac, i.Sandbox))
	}
	return strings.Join(s, " ")
}

// vmSide gives the pod a stand-in for the VM's NIC: a veth pair whose one
// end is a port of the pod's bridge (next to the tap) and whose other end,
// with the VM's MAC, lives in a namespace of its own — the "VM". DHCP
// clients run there as they would in the guest.
func (p *vmPod) vmSide(t testing.TB) (*harness.NS, string) {
	t.Helper()
	vm := harness.NewNS(t, "vm")
	ifName := "vm" + harness.RandHex(3)
	mac, _ := net.ParseMAC(p.vmMAC)
	br, err := p.ns.Handle(t).LinkByName(p.bridge)
	if err != nil {
		t.Fatalf("bridge %s: %v", p.bridge, err)
	}
	p.ns.AddVeth(t, harness.Veth{Name: "vp" + harness.RandHex(3), PeerName: ifName, Peer: vm,
		MTU: br.Attrs().MTU, Master: br.Attrs().Index, PeerMAC: mac})
	return vm, ifName
}

// configured is what a DHCP client set up in the VM namespace, read back
// from the kernel (address, routes, MTU) and from its script (DNS).
type configured struct {
	Addrs  []string
	Routes []string
	MTU    int
}

func readConfigured(t testing.TB, vm *harness.NS, ifName string) configured {
	t.Helper()
	h := vm.Handle(t)
	l, err := h.LinkByName(ifName)
	if err != nil {
		t.Fatal(err)
	}
	var c configured
	c.MTU = l.Attrs().MTU
	addrs, _ := h.AddrList(l, netlink.FAMILY_V4)
	for _, a := range addrs {
		c.Addrs = append(c.Addrs, a.IPNet.String())
	}
	routes, _ := h.RouteList(l, netlink.FAMILY_V4)
	for _, r := range routes {
		dst := "default"
		if r.Dst != nil && r.Dst.String() != "0.0.0.0/0" {
			dst = r.Dst.String()
		}
		if r.Gw != nil {
			dst += " via " + r.Gw.String()
		}
		c.Routes = append(c.Routes, dst)
	}
	slices.Sort(c.Routes)
	return c
}

// wantConfigured is what every client must configure for a skein pod:
// the address with the result's /32, the on-link route to the gateway
// (option 121) and the default route through it, and the pod's MTU.
func (p *vmPod) wantConfigured() configured {
	return configured{
		Addrs:  []string{p.addr4.String()},
		Routes: []string{p.gw4.String() + "/32", "default via " + p.gw4.String()},
		MTU:    podMTU,
	}
}

func (c configured) String() string {
	b, _ := json.Marshal(c)
	return string(b)
}

// run runs a command inside ns with a timeout and returns its output.
func run(t testing.TB, ns *harness.NS, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []byte
	err := ns.Do(func() error {
		var err error
		out, err = exec.CommandContext(ctx, name, args...).CombinedOutput()
		return err
	})
	return string(out), err
}

// poolUsed is the number of addresses skeind holds in the default pool.
func (e *env) poolUsed(t testing.TB) uint64 {
	t.Helper()
	c, cancel := callCtx()
	defer cancel()
	p, err := e.d.Admin(t).GetPool(c, &rpc.PoolRef{Name: "default"})
	if err != nil {
		t.Fatal(err)
	}
	return p.Used
}

// clientScript prepares one DHCP client run: a new directory dir and in
// it the client's script, tmpl formatted with dir (the scripts record what
// the client got in dir/<event>.env and dir/events; see clients_test.go).
func clientScript(t testing.TB, tmpl string) (dir, script string) {
	t.Helper()
	dir = t.TempDir()
	script = filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte(fmt.Sprintf(tmpl, dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, script
}

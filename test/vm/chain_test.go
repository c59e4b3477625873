package vm

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestChainAfterBridge: skein-vm after the reference bridge plugin with
// host-local IPAM (Debian's containernetworking-plugins). The plugins run
// inside a "node" namespace of the test's (the bridge plugin makes its
// bridge in the namespace it runs in). The VM gets the /24 and the router
// option alone (one default route via an on-link gateway needs no 121),
// reaches the node's bridge, and DEL gives the pod back.
func TestChainAfterBridge(t *testing.T) {
	skeintest.RequireTool(t, "udhcpc")
	skeintest.RequireTool(t, filepath.Join(skeintest.RefPluginDir, "bridge"))
	e := newEnv(t)
	node := harness.NewNS(t, "brnode")
	l := skeintest.ConfList(t, "vm-bridge", "1.0.0",
		skeintest.Plugin{"type": "bridge", "bridge": "cnivm0", "isGateway": true, "isDefaultGateway": true,
			"ipam": map[string]any{"type": "host-local", "subnet": "10.22.0.0/24", "dataDir": t.TempDir()}},
		e.skeinVM(skeintest.Plugin{"dns": testDNS}))
	pod := harness.NewNS(t, "pod")
	rt := skeintest.RT("bridged", pod.Path(), "eth0")
	inNode := func(f func() error) {
		t.Helper()
		if err := node.Do(f); err != nil {
			t.Fatal(err)
		}
	}
	var res *types100.Result
	inNode(func() error {
		var err error
		res, err = e.add(l, rt)
		if err != nil {
			return fmt.Errorf("ADD through bridge+skein-vm: %w", err)
		}
		return nil
	})
	t.Cleanup(func() { _ = node.Do(func() error { return e.del(l, rt) }) })
	p := &vmPod{ns: pod, rt: rt, res: res}
	for _, i := range res.Interfaces {
		if i.Sandbox == pod.Path() && len(i.Name) > 5 && i.Name[:5] == "sktap" {
			p.tap, p.vmMAC = i.Name, i.Mac
		}
		if i.Sandbox == pod.Path() && len(i.Name) > 4 && i.Name[:4] == "skbr" {
			p.bridge = i.Name
		}
	}
	if p.tap == "" || p.bridge == "" || len(res.IPs) != 1 {
		t.Fatalf("result should carry host-local's address and skein-vm's bridge and tap: %s", ifaces(res))
	}
	addr, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	ones, _ := res.IPs[0].Address.Mask.Size()
	gw, _ := netip.AddrFromSlice(res.IPs[0].Gateway.To4())

	vm, ifName := p.vmSide(t)
	dir, script := clientScript(t, udhcpcScript)
	out, err := run(t, vm, 20*time.Second, "udhcpc", "-f", "-q", "-n", "-i", ifName, "-s", script, "-t", "10", "-T", "1")
	if err != nil {
		t.Fatalf("udhcpc: %v\n%s", err, out)
	}
	want := configured{
		Addrs:  []string{netip.PrefixFrom(addr, ones).String()},
		Routes: []string{netip.PrefixFrom(addr, ones).Masked().String(), "default via " + gw.String()},
		MTU:    1500,
	}
	if got := readConfigured(t, vm, ifName); got.String() != want.String() {
		t.Errorf("udhcpc configured %s, the bridge plugin's result says %s", got, want)
	}
	env := readEnv(t, filepath.Join(dir, "bound.env"))
	if env["staticroutes"] != "" {
		t.Errorf("one default route via an on-link router needs no option 121, got %q", env["staticroutes"])
	}
	if err := harness.Ping(t, vm, gw); err != nil {
		t.Errorf("the VM side should reach the bridge plugin's gateway %s: %v", gw, err)
	}
	inNode(func() error { return e.del(l, rt) })
	// Left: lo and the test's VM stand-in (vp…), which skein-vm did not make.
	if links := linkNames(t, pod); len(links) != 2 {
		t.Errorf("after DEL the pod should hold lo and the test's stand-in port only (the bridge plugin deletes its veth), has %v", links)
	}
}

func linkNames(t *testing.T, ns *harness.NS) []string {
	t.Helper()
	ls, err := ns.Handle(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		out = append(out, l.Attrs().Name)
	}
	return out
}

// TestDelRestoresBridgePod: the same before/after comparison as
// TestDelRestoresPod with the reference bridge plugin as the main plugin
// (a /24 with its kernel subnet route, a default route via the node's
// bridge).
func TestDelRestoresBridgePod(t *testing.T) {
	skeintest.RequireTool(t, filepath.Join(skeintest.RefPluginDir, "bridge"))
	e := newEnv(t)
	node := harness.NewNS(t, "brnode")
	l := skeintest.ConfList(t, "vm-brdel", "1.0.0",
		skeintest.Plugin{"type": "bridge", "bridge": "cnivm1", "isGateway": true, "isDefaultGateway": true,
			"ipam": map[string]any{"type": "host-local", "subnet": "10.23.0.0/24", "dataDir": t.TempDir()}})
	pod := harness.NewNS(t, "pod")
	rt := skeintest.RT("brdel", pod.Path(), "eth0")
	var res *types100.Result
	if err := node.Do(func() error {
		var err error
		res, err = e.add(l, rt)
		return err
	}); err != nil {
		t.Fatalf("ADD through bridge: %v", err)
	}
	t.Cleanup(func() { _ = node.Do(func() error { return e.del(l, rt) }) })
	before := harness.Snapshot(t, pod)
	conf := e.vmConf("vm-brdel", "1.0.0", res)
	if _, err := e.execVM(t, "ADD", conf, "brdel", pod.Path(), "eth0"); err != nil {
		t.Fatalf("skein-vm ADD after bridge: %v", err)
	}
	if _, err := e.execVM(t, "CHECK", conf, "brdel", pod.Path(), "eth0"); err != nil {
		t.Errorf("skein-vm CHECK: %v", err)
	}
	if _, err := e.execVM(t, "DEL", conf, "brdel", pod.Path(), "eth0"); err != nil {
		t.Fatalf("skein-vm DEL: %v", err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, pod))
}

// TestWholeChainCheck: CHECK of the whole [skein, skein-vm] list passes
// (skein accepts that its interface became a bridge port whose addresses
// belong to the VM), and fails once the tap is gone.
func TestWholeChainCheck(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-check", "1.1.0", nil)
	p := e.mustAddVM(t, l, "chk")
	c, cancel := callCtx()
	defer cancel()
	if err := e.cni.CheckNetworkList(c, l, p.rt); err != nil {
		t.Fatalf("CHECK of the whole chain after ADD: the spec expects success, got %v", err)
	}
	h := p.ns.Handle(t)
	tap, err := h.LinkByName(p.tap)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(tap); err != nil {
		t.Fatal(err)
	}
	if err := e.cni.CheckNetworkList(c, l, p.rt); err == nil {
		t.Fatal("CHECK of the whole chain after the tap was deleted: want an error, got success")
	}
}

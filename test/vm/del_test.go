package vm

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// execVM runs the skein-vm binary itself, as a runtime would for one
// plugin of a chain: conf is its configuration (prevResult included when
// set). It returns stdout or the spec error the plugin printed.
func (e *env) execVM(t *testing.T, verb string, conf map[string]any, id, netnsPath, ifName string) ([]byte, error) {
	t.Helper()
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	r, err := skeintest.ExecPlugin(filepath.Join(e.d.BinDir, "skein-vm"),
		[]string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + netnsPath, "CNI_IFNAME=" + ifName, "CNI_PATH=" + e.d.BinDir}, b)
	switch {
	case err != nil:
		return nil, err
	case r.SpecErr != nil:
		return nil, r.SpecErr
	case r.Exit != 0:
		return nil, fmt.Errorf("skein-vm %s: exit status %d: %s%s", verb, r.Exit, r.Stdout, r.Stderr)
	}
	return r.Stdout, nil
}

// vmConf is skein-vm's configuration for one call.
func (e *env) vmConf(name, version string, prev any) map[string]any {
	c := map[string]any{"cniVersion": version, "name": name, "type": "skein-vm", "socket": e.d.Socket}
	if prev != nil {
		c["prevResult"] = prev
	}
	return c
}

func wantCode(t *testing.T, what string, err error, code uint) {
	t.Helper()
	if got := skeintest.ErrCode(err); err == nil || got != code {
		t.Errorf("%s: want spec error code %d, got %v", what, code, err)
	}
}

// podOnly attaches a pod through skein alone and returns it with the
// result the skein-vm plugin would receive as prevResult.
func (e *env) podOnly(t *testing.T, name, id string) (*harness.NS, *types100.Result) {
	t.Helper()
	ns := harness.NewNS(t, "pod")
	l := skeintest.ConfList(t, name, "1.0.0", e.d.SkeinPlugin(skeintest.Plugin{"dns": testDNS, "mtu": podMTU}))
	rt := skeintest.RT(id, ns.Path(), "eth0")
	res, err := e.add(l, rt)
	if err != nil {
		t.Fatalf("ADD through skein: %v", err)
	}
	t.Cleanup(func() { _ = e.del(l, rt) })
	return ns, res
}

// TestDelRestoresPod: after skein-vm's DEL the pod's namespace is exactly
// what the main plugin made (links, addresses, routes in every table,
// rules), and a second DEL changes nothing.
func TestDelRestoresPod(t *testing.T) {
	e := newEnv(t)
	ns, prev := e.podOnly(t, "vm-del", "delpod")
	before := harness.Snapshot(t, ns)
	conf := e.vmConf("vm-del", "1.0.0", prev)
	if _, err := e.execVM(t, "ADD", conf, "delpod", ns.Path(), "eth0"); err != nil {
		t.Fatalf("skein-vm ADD: %v", err)
	}
	during := harness.Snapshot(t, ns)
	if strings.Join(during.Links, "\n") == strings.Join(before.Links, "\n") {
		t.Fatal("ADD should have added a bridge and a tap to the pod")
	}
	for i := 0; i < 2; i++ {
		if _, err := e.execVM(t, "DEL", conf, "delpod", ns.Path(), "eth0"); err != nil {
			t.Fatalf("skein-vm DEL #%d: the spec expects success, got %v", i+1, err)
		}
		harness.AssertSame(t, before, harness.Snapshot(t, ns))
	}
	// The main plugin's own CHECK passes again on the restored pod.
	l := skeintest.ConfList(t, "vm-del", "1.0.0", e.d.SkeinPlugin(skeintest.Plugin{"dns": testDNS, "mtu": podMTU}))
	c, cancel := callCtx()
	defer cancel()
	if err := e.cni.CheckNetworkList(c, l, skeintest.RT("delpod", ns.Path(), "eth0")); err != nil {
		t.Errorf("skein's CHECK after skein-vm's DEL: %v", err)
	}
}

// TestDelWithoutNetns: DEL succeeds when the pod's namespace is gone, and
// for a container skein-vm never saw.
func TestDelWithoutNetns(t *testing.T) {
	e := newEnv(t)
	l := e.skeinChain(t, "vm-gone", "1.1.0", nil)
	p := e.mustAddVM(t, l, "gone")
	if err := netns.Remove(p.ns.Path()); err != nil {
		t.Fatal(err)
	}
	if err := e.del(l, p.rt); err != nil {
		t.Errorf("DEL after the namespace vanished: the spec expects success, got %v", err)
	}
	if _, err := e.execVM(t, "DEL", e.vmConf("vm-gone", "1.1.0", nil), "never-seen", "", "eth0"); err != nil {
		t.Errorf("DEL of an unknown container: the spec expects success, got %v", err)
	}
	if atts := e.d.Attachments(t); len(atts) != 0 {
		t.Errorf("skeind still holds %d attachments", len(atts))
	}
}

// TestDelDespitePodChanges: what the pod did to skein-vm's links (with
// CAP_NET_ADMIN in the pod: an alias of its own on the tap) does not make
// DEL fail. Before, every DEL failed, so the runtime never ran the main
// plugin's DEL and the pod's address, veth and sandbox leaked. What DEL
// cannot undo is in the pod's namespace and goes with it.
func TestDelDespitePodChanges(t *testing.T) {
	e := newEnv(t)
	ns, prev := e.podOnly(t, "vm-delchg", "delchg")
	conf := e.vmConf("vm-delchg", "1.0.0", prev)
	out, err := e.execVM(t, "ADD", conf, "delchg", ns.Path(), "eth0")
	if err != nil {
		t.Fatalf("skein-vm ADD: %v", err)
	}
	var res types100.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	tap := ""
	for _, i := range res.Interfaces {
		if strings.HasPrefix(i.Name, "sktap") {
			tap = i.Name
		}
	}
	h := ns.Handle(t)
	l, err := h.LinkByName(tap)
	if err != nil {
		t.Fatalf("tap %q: %v", tap, err)
	}
	if err := h.LinkSetAlias(l, "mine"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := e.execVM(t, "DEL", conf, "delchg", ns.Path(), "eth0"); err != nil {
			t.Fatalf("skein-vm DEL #%d after the pod changed its tap: %v", i+1, err)
		}
	}
	// The chain goes on: the main plugin's DEL runs and frees the address.
	used := e.poolUsed(t)
	lst := skeintest.ConfList(t, "vm-delchg", "1.0.0", e.d.SkeinPlugin(skeintest.Plugin{"dns": testDNS, "mtu": podMTU}))
	c, cancel := callCtx()
	defer cancel()
	if err := e.cni.DelNetworkList(c, lst, skeintest.RT("delchg", ns.Path(), "eth0")); err != nil {
		t.Fatalf("skein's DEL: %v", err)
	}
	if after := e.poolUsed(t); after >= used {
		t.Errorf("the pod's address is still held after the chain's DEL (%d in use, %d before)", after, used)
	}
}

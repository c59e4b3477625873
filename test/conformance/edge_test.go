package conformance

import (
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// The spec's edge cases, each as the spec words it.

func (e *env) mustAdd(t *testing.T, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *types100.Result {
	t.Helper()
	r, err := e.cni.AddNetworkList(cctx(t), l, rt)
	if err != nil {
		t.Fatalf("ADD %s/%s in %s: the spec expects a result, got: %v", rt.ContainerID, rt.IfName, rt.NetNS, err)
	}
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (e *env) used(t *testing.T) uint64 {
	t.Helper()
	p, err := e.d.Admin(t).GetPool(cctx(t), &rpc.PoolRef{Name: "default"})
	if err != nil {
		t.Fatal(err)
	}
	return p.Used
}

// TestDel: DEL must succeed when what it would remove is already gone
// ("plugins should generally complete a DEL action without error even if
// some resources are missing"), with or without prevResult and CNI_NETNS.
func TestDel(t *testing.T) {
	e := newEnv(t)
	l := e.list(t, "del", "1.1.0")
	conf := map[string]any{"cniVersion": "1.1.0", "name": "del"}

	t.Run("netns gone", func(t *testing.T) {
		path := filepath.Join(harness.NetNSDir, harness.NamePrefix+"conf-gone-"+harness.RandHex(4))
		if err := netns.Create(path); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.Remove(path) })
		rt := skeintest.RT("gone", path, "eth0")
		e.mustAdd(t, l, rt)
		if err := netns.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
			violation(t, "DEL succeeds when the container's netns no longer exists", "DEL failed: %v", err)
		}
		e.assertClean(t, "DEL after the netns was removed")
	})
	t.Run("twice", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		rt := skeintest.RT("twice", ns.Path(), "eth0")
		e.mustAdd(t, l, rt)
		for i := 1; i <= 2; i++ {
			if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
				violation(t, "DEL is idempotent: a second DEL succeeds", "DEL #%d failed: %v", i, err)
			}
		}
		e.assertClean(t, "two DELs")
	})
	t.Run("no prevResult", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		e.mustAdd(t, l, skeintest.RT("noprev", ns.Path(), "eth0"))
		if _, serr := e.exec(t, call{cmd: "DEL", id: "noprev", netns: ns.Path(), ifname: "eth0", conf: conf}); serr != nil {
			violation(t, "DEL without prevResult succeeds (a runtime may have lost its cache)", "DEL failed: %v", serr)
		}
		if _, err := ns.Handle(t).LinkByName("eth0"); err == nil {
			violation(t, "DEL releases what ADD created", "eth0 is still in the pod after DEL without prevResult")
		}
		e.assertClean(t, "DEL without prevResult")
	})
	t.Run("no CNI_NETNS", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		e.mustAdd(t, l, skeintest.RT("nonetns", ns.Path(), "eth0"))
		if _, serr := e.exec(t, call{cmd: "DEL", id: "nonetns", ifname: "eth0", conf: conf}); serr != nil {
			violation(t, "CNI_NETNS is optional for DEL", "DEL without CNI_NETNS failed: %v", serr)
		}
		if _, err := ns.Handle(t).LinkByName("eth0"); err == nil {
			violation(t, "DEL releases what ADD created", "eth0 is still in the pod after DEL without CNI_NETNS")
		}
		e.assertClean(t, "DEL without CNI_NETNS")
	})
	t.Run("never added", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		if _, serr := e.exec(t, call{cmd: "DEL", id: "never", netns: ns.Path(), ifname: "eth0", conf: conf}); serr != nil {
			violation(t, "DEL of something that never existed succeeds", "DEL failed: %v", serr)
		}
		e.assertClean(t, "DEL of nothing")
	})
}

// TestGC (1.1.0): "the plugin should remove any resources related to
// attachments not listed in cni.dev/valid-attachments" — for its network
// only. The calls are raw, as a runtime that lost its cache sends them
// (libcni would DEL its cached attachments before calling the plugin).
func TestGC(t *testing.T) {
	e := newEnv(t)
	l, other := e.list(t, "gc", "1.1.0"), e.list(t, "gc-other", "1.1.0")
	for _, id := range []string{"g1", "g2"} {
		e.mustAdd(t, l, skeintest.RT(id, harness.NewNS(t, "pod").Path(), "eth0"))
	}
	keep := skeintest.RT("o1", harness.NewNS(t, "pod").Path(), "eth0")
	e.mustAdd(t, other, keep)
	gc := func(valid []map[string]string) {
		t.Helper()
		if _, serr := e.exec(t, call{cmd: "GC", conf: map[string]any{"cniVersion": "1.1.0", "name": "gc", "cni.dev/valid-attachments": valid}}); serr != nil {
			violation(t, "GC succeeds", "GC with valid %v failed: %v", valid, serr)
		}
	}
	gc([]map[string]string{{"containerID": "g1", "ifname": "eth0"}})
	if got, want := keys(e.d.Attachments(t)), "gc-other/o1/eth0, gc/g1/eth0"; got != want {
		violation(t, "GC with a partial valid list removes exactly the unlisted attachments of its network", "skeind holds [%s], want [%s]", got, want)
	}
	gc([]map[string]string{})
	if got, want := keys(e.d.Attachments(t)), "gc-other/o1/eth0"; got != want {
		violation(t, "GC with an empty valid list removes every attachment of its network and nothing else", "skeind holds [%s], want [%s]", got, want)
	}
	if err := e.cni.DelNetworkList(cctx(t), other, keep); err != nil {
		t.Errorf("DEL: %v", err)
	}
	// g1 and g2 were removed by GC; libcni still caches them: DEL them too,
	// which must succeed.
	for _, id := range []string{"g1", "g2"} {
		if err := e.cni.DelNetworkList(cctx(t), l, &libcni.RuntimeConf{ContainerID: id, IfName: "eth0"}); err != nil {
			violation(t, "DEL after GC removed the attachment succeeds", "DEL %s: %v", id, err)
		}
	}
	e.assertClean(t, "GC and DEL")
}

// TestCheckDetects: "the plugin must return an error if ... the container
// interface's addresses or routes are not as in prevResult".
func TestCheckDetects(t *testing.T) {
	e := newEnv(t)
	l := e.list(t, "check", "1.0.0")
	for _, c := range []struct {
		what   string
		mutate func(h *netlink.Handle, eth0 netlink.Link, res *types100.Result) error
	}{
		{"a removed address", func(h *netlink.Handle, eth0 netlink.Link, res *types100.Result) error {
			return h.AddrDel(eth0, &netlink.Addr{IPNet: &res.IPs[0].Address})
		}},
		{"a removed default route", func(h *netlink.Handle, eth0 netlink.Link, res *types100.Result) error {
			routes, err := h.RouteList(eth0, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			for _, r := range routes {
				if r.Dst == nil || r.Dst.IP.Equal(net.IPv4zero) {
					return h.RouteDel(&r)
				}
			}
			return nil
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			ns := harness.NewNS(t, "pod")
			rt := skeintest.RT("chk"+harness.RandHex(4), ns.Path(), "eth0")
			res := e.mustAdd(t, l, rt)
			if err := e.cni.CheckNetworkList(cctx(t), l, rt); err != nil {
				t.Fatalf("CHECK right after ADD: expected success, got: %v", err)
			}
			h := ns.Handle(t)
			eth0, err := h.LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			if err := c.mutate(h, eth0, res); err != nil {
				t.Fatalf("break the pod: %v", err)
			}
			if err := e.cni.CheckNetworkList(cctx(t), l, rt); err == nil {
				violation(t, "CHECK fails when the container's networking is not as ADD left it", "CHECK succeeded after %s", c.what)
			}
			if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
				t.Errorf("DEL: %v", err)
			}
		})
	}
	e.assertClean(t, "CHECK cases")
}

// TestStatusDaemonDown: "STATUS: a plugin must exit with a non-zero code
// and error 50 (plugin not available) if it cannot service ADD requests";
// ADD meanwhile asks the runtime to try again (11).
func TestStatusDaemonDown(t *testing.T) {
	e := newEnv(t)
	l := e.list(t, "down", "1.1.0")
	if err := e.cni.GetStatusNetworkList(cctx(t), l); err != nil {
		t.Fatalf("STATUS with skeind up: expected success, got: %v", err)
	}
	e.d.Stop(t)
	wantCode(t, "STATUS (libcni) with skeind stopped", "STATUS: error 50 when ADD cannot be served", e.cni.GetStatusNetworkList(cctx(t), l), types.ErrPluginNotAvailable)
	_, serr := e.exec(t, call{cmd: "STATUS", conf: map[string]any{"cniVersion": "1.1.0", "name": "down"}})
	wantCode(t, "STATUS (raw) with skeind stopped", "STATUS: error 50 when ADD cannot be served", errOrNil(serr), types.ErrPluginNotAvailable)
	ns := harness.NewNS(t, "pod")
	_, err := e.cni.AddNetworkList(cctx(t), l, skeintest.RT("down", ns.Path(), "eth0"))
	wantCode(t, "ADD with skeind stopped", "error 11: try again later (skein's choice while skeind restarts)", err, types.ErrTryAgainLater)
	if links, _ := ns.Handle(t).LinkList(); len(links) != 1 {
		violation(t, "a failed ADD leaves nothing behind", "the pod has %d links after the failed ADD", len(links))
	}
}

func errOrNil(e *types.Error) error {
	if e == nil {
		return nil
	}
	return e
}

// TestAddTwice: a second ADD of the same (network, container, ifname)
// fails with skein's 102 and changes nothing — not the pod, not the node,
// not the addresses held.
func TestAddTwice(t *testing.T) {
	e := newEnv(t)
	l := e.list(t, "twice", "1.1.0")
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT("same", ns.Path(), "eth0")
	e.mustAdd(t, l, rt)
	node, pod, atts, used := nodeState(t, e.d), harness.Snapshot(t, ns), keysAddrs(e.d.Attachments(t)), e.used(t)
	_, err := e.cni.AddNetworkList(cctx(t), l, rt)
	wantCode(t, "second ADD of the same key", "an ADD for an existing attachment is an error (skein: 102, attachment exists)", err, 102)
	harness.AssertSame(t, node, nodeState(t, e.d))
	harness.AssertSame(t, pod, harness.Snapshot(t, ns))
	if got := keysAddrs(e.d.Attachments(t)); !slices.Equal(got, atts) {
		violation(t, "a refused ADD changes nothing", "attachments were %v, are %v", atts, got)
	}
	if got := e.used(t); got != used {
		violation(t, "a refused ADD changes nothing", "addresses used were %d, are %d", used, got)
	}
	if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
		t.Errorf("DEL: %v", err)
	}
	e.assertClean(t, "DEL")
}

func keysAddrs(atts []*rpc.Attachment) []string {
	var s []string
	for _, a := range atts {
		s = append(s, a.Network+"/"+a.ContainerId+"/"+a.Ifname+" "+a.Addresses[0])
	}
	slices.Sort(s)
	return s
}

// TestIfNameCollisions: an interface name already taken in the sandbox is
// refused without touching what is there; one container may have several
// interfaces on one network under different names.
func TestIfNameCollisions(t *testing.T) {
	e := newEnv(t)
	l := e.list(t, "ifn", "1.1.0")

	t.Run("taken by someone else", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		h := ns.Handle(t)
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "other0"}); err != nil {
			t.Fatal(err)
		}
		before, used := harness.Snapshot(t, ns), e.used(t)
		_, err := e.cni.AddNetworkList(cctx(t), l, skeintest.RT("taken", ns.Path(), "eth0"))
		wantCode(t, "ADD with CNI_IFNAME taken in the pod", "the plugin must not take over an existing interface (skein: 4, invalid environment)", err, types.ErrInvalidEnvironmentVariables)
		harness.AssertSame(t, before, harness.Snapshot(t, ns))
		if got := e.used(t); got != used {
			violation(t, "a failed ADD releases its addresses", "addresses used were %d, are %d", used, got)
		}
		e.assertClean(t, "refused ADD")
	})
	t.Run("two containers one name", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		first := skeintest.RT("first", ns.Path(), "eth0")
		e.mustAdd(t, l, first)
		_, err := e.cni.AddNetworkList(cctx(t), l, skeintest.RT("second", ns.Path(), "eth0"))
		wantCode(t, "ADD of a second container with the first one's CNI_IFNAME", "the plugin must not take over an existing interface (skein: 4)", err, types.ErrInvalidEnvironmentVariables)
		if got := keys(e.d.Attachments(t)); got != "ifn/first/eth0" {
			violation(t, "a refused ADD changes nothing", "skeind holds [%s]", got)
		}
		reach(t, ns, "the first container after the refused ADD", gw4, nodeAddr)
		if err := e.cni.DelNetworkList(cctx(t), l, first); err != nil {
			t.Errorf("DEL: %v", err)
		}
		e.assertClean(t, "DEL")
	})
	t.Run("one container two names", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		a, b := skeintest.RT("multi", ns.Path(), "eth0"), skeintest.RT("multi", ns.Path(), "net1")
		ra := e.mustAdd(t, l, a)
		rb := e.mustAdd(t, l, b)
		checkKernel(t, ns, ra, "eth0")
		checkKernel(t, ns, rb, "net1")
		reach(t, ns, "a pod with two interfaces", nodeAddr)
		for _, rt := range []*libcni.RuntimeConf{a, b} {
			if err := e.cni.CheckNetworkList(cctx(t), l, rt); err != nil {
				violation(t, "CHECK succeeds for each attachment as ADD left it", "CHECK %s: %v", rt.IfName, err)
			}
		}
		for _, rt := range []*libcni.RuntimeConf{b, a} {
			if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
				t.Errorf("DEL %s: %v", rt.IfName, err)
			}
		}
		e.assertClean(t, "DEL of both")
	})
}

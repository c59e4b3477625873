package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestBadInputChangesNothing sends every kind of bad ADD skein must refuse
// and checks, for each, the spec (or skein) error code and that nothing
// changed: the node namespace, skeind's attachments and the pool's use are
// as before, and a normal ADD right after gets a free address of the pool.
// The cases run against a six-address pool, which the last case fills: if
// any earlier case had held an address, filling would stop short.
func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	e.createPool(t, "tiny", 2, "10.99.0.0/29") // 2 blocks of 4, minus network and broadcast: 6 usable
	tiny := netip.MustParsePrefix("10.99.0.0/29")
	l := e.list(t, "bad", "1.1.0", skeintest.Plugin{"pool": "tiny"})
	const netName = "bad"

	firstNS := harness.NewNS(t, "pod")
	first := e.mustAdd(t, l, firstNS, "first")
	conf := e.rawConf(t, netName, "1.1.0", map[string]any{"pool": "tiny"})

	var fillers []*pod
	cases := []struct {
		name  string
		code  uint
		setup func(t *testing.T)
		run   func(t *testing.T, ns *harness.NS) error
		after func(t *testing.T)
	}{
		{name: "invalid JSON", code: 6, run: func(t *testing.T, ns *harness.NS) error {
			_, _, err := e.rawCNI(t, e.rawVars("ADD", "c1", ns.Path(), "eth0"), []byte(`{"cniVersion": "1.1.0", "name": `))
			return err
		}},
		{name: "unknown cniVersion", code: 1, run: func(t *testing.T, ns *harness.NS) error {
			_, err := e.add(t, e.list(t, netName, "9.9.9", skeintest.Plugin{"pool": "tiny"}), skeintest.RT("c1", ns.Path(), "eth0"))
			return err
		}},
		{name: "missing CNI_CONTAINERID", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			v := e.rawVars("ADD", "c1", ns.Path(), "eth0")
			delete(v, "CNI_CONTAINERID")
			_, _, err := e.rawCNI(t, v, conf)
			return err
		}},
		{name: "missing CNI_NETNS", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			v := e.rawVars("ADD", "c1", ns.Path(), "eth0")
			delete(v, "CNI_NETNS")
			_, _, err := e.rawCNI(t, v, conf)
			return err
		}},
		{name: "missing CNI_IFNAME", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			v := e.rawVars("ADD", "c1", ns.Path(), "eth0")
			delete(v, "CNI_IFNAME")
			_, _, err := e.rawCNI(t, v, conf)
			return err
		}},
		// The host's own namespace (PID 1's) is refused the same way, but
		// is not tried here: a regression would plumb the real host.
		{name: "CNI_NETNS is the node's namespace", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			_, _, err := e.rawCNI(t, e.rawVars("ADD", "c1", e.d.Node.Path(), "eth0"), conf)
			return err
		}},
		{name: "ifname longer than 15 bytes", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			_, _, err := e.rawCNI(t, e.rawVars("ADD", "c1", ns.Path(), "eth0123456789abc"), conf)
			return err
		}},
		{name: "ifname with slash", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			_, _, err := e.rawCNI(t, e.rawVars("ADD", "c1", ns.Path(), "eth/0"), conf)
			return err
		}},
		{name: "ifname with space", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			_, _, err := e.rawCNI(t, e.rawVars("ADD", "c1", ns.Path(), "eth 0"), conf)
			return err
		}},
		{name: "netns path does not exist", code: 3, run: func(t *testing.T, ns *harness.NS) error {
			_, err := e.add(t, l, skeintest.RT("c1", filepath.Join(harness.NetNSDir, "skein-e2e-no-such-ns"), "eth0"))
			return err
		}},
		{name: "netns path is a regular file", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			f := filepath.Join(t.TempDir(), "not-a-netns")
			if err := os.WriteFile(f, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := e.add(t, l, skeintest.RT("c1", f, "eth0"))
			return err
		}},
		{name: "second ADD of the same attachment", code: 102, run: func(t *testing.T, ns *harness.NS) error {
			_, err := e.add(t, l, first.rt)
			return err
		}, after: func(t *testing.T) {
			if err := e.check(t, l, first.rt); err != nil {
				t.Errorf("the first attachment must survive a refused second ADD; CHECK says: %v", err)
			}
			mustReach(t, firstNS, "first pod after a refused second ADD", gw4)
		}},
		{name: "pool does not exist", code: 7, run: func(t *testing.T, ns *harness.NS) error {
			_, err := e.add(t, e.list(t, netName, "1.1.0", skeintest.Plugin{"pool": "no-such-pool"}), skeintest.RT("c1", ns.Path(), "eth0"))
			return err
		}},
		{name: "static address outside the pool", code: 7, run: func(t *testing.T, ns *harness.NS) error {
			rt := skeintest.RT("c1", ns.Path(), "eth0")
			rt.Args = [][2]string{{"IP", "10.98.0.1"}}
			_, err := e.add(t, l, rt)
			return err
		}},
		{name: "static address already taken", code: 101, run: func(t *testing.T, ns *harness.NS) error {
			rt := skeintest.RT("c1", ns.Path(), "eth0")
			rt.Args = [][2]string{{"IP", first.addrs[0].String()}}
			_, err := e.add(t, l, rt)
			return err
		}},
		{name: "ifname already present in the pod", code: 4, run: func(t *testing.T, ns *harness.NS) error {
			h := ns.Handle(t)
			own := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "own-peer"}
			if err := h.LinkAdd(own); err != nil {
				t.Fatalf("create the pod's own eth0: %v", err)
			}
			before, err := h.LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			_, addErr := e.add(t, l, skeintest.RT("c1", ns.Path(), "eth0"))
			after, err := h.LinkByName("eth0")
			switch {
			case err != nil:
				t.Errorf("the pod's own eth0 must be left alone, it is gone: %v", err)
			case after.Attrs().Index != before.Attrs().Index || after.Attrs().ParentIndex != before.Attrs().ParentIndex:
				t.Errorf("the pod's own eth0 must be left alone: was #%d peer #%d, now #%d peer #%d", before.Attrs().Index, before.Attrs().ParentIndex, after.Attrs().Index, after.Attrs().ParentIndex)
			}
			return addErr
		}},
		{name: "pool exhausted", code: 100, setup: func(t *testing.T) {
			for i := 0; ; i++ {
				ns := harness.NewNS(t, "pod")
				rt := skeintest.RT("fill-"+string(rune('a'+i)), ns.Path(), "eth0")
				r, err := e.add(t, l, rt)
				if err != nil {
					if skeintest.ErrCode(err) != 100 || len(fillers) != 5 {
						t.Fatalf("filling a 6-address pool holding 1: ADD %d should succeed up to 5, then fail with 100; got %d then: %v (was an address held by an earlier case?)", i+1, len(fillers), err)
					}
					return
				}
				fillers = append(fillers, &pod{ns: ns, rt: rt, addrs: ctrAddrs(asCurrent(t, r), "eth0", ns.Path())})
			}
		}, run: func(t *testing.T, ns *harness.NS) error {
			_, err := e.add(t, l, skeintest.RT("c1", ns.Path(), "eth0"))
			return err
		}, after: func(t *testing.T) {
			for _, p := range fillers {
				e.mustDel(t, l, p.rt)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup(t)
			}
			ns := harness.NewNS(t, "pod")
			before, attsBefore, usedBefore := nodeState(t, e.d), attKeys(e.d.Attachments(t)), e.poolUsed(t, "tiny")

			wantCode(t, "ADD with "+c.name, c.run(t, ns), c.code)

			harness.AssertSame(t, before, nodeState(t, e.d))
			if after := attKeys(e.d.Attachments(t)); !slices.Equal(attsBefore, after) {
				t.Errorf("a refused ADD must not change skeind's attachments: before %v, after %v", attsBefore, after)
			}
			if used := e.poolUsed(t, "tiny"); used != usedBefore {
				t.Errorf("a refused ADD must hold no address: pool used %d before, %d after", usedBefore, used)
			}
			if links := podLinks(t, ns); len(links) != 1 && c.name != "ifname already present in the pod" || len(links) > 3 {
				t.Errorf("a refused ADD must leave the pod namespace alone; it has %v", links)
			}
			if c.after != nil {
				c.after(t)
			}
			e.probe(t, l, tiny)
		})
	}
	e.mustDel(t, l, first.rt)
	e.assertNothingLeft(t)
}

// probe checks that a normal ADD works and gets a free address of pool,
// then removes it again.
func (e *env) probe(t *testing.T, l *libcni.NetworkConfigList, pool netip.Prefix) {
	t.Helper()
	held := map[string]bool{}
	for _, a := range e.d.Attachments(t) {
		for _, ad := range a.Addresses {
			held[ad] = true
		}
	}
	p := e.mustAdd(t, l, harness.NewNS(t, "pod"), "probe")
	for _, a := range p.addrs {
		if !pool.Contains(a) || held[a.String()] {
			t.Errorf("a normal ADD after a refused one should get a free address of %v, got %v (held: %v)", pool, a, held)
		}
	}
	e.mustDel(t, l, p.rt)
}

// podLinks lists the link names in a pod namespace.
func podLinks(t *testing.T, ns *harness.NS) []string {
	t.Helper()
	links, err := ns.Handle(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names
}

// TestMissingCommand: without CNI_COMMAND the binary does nothing. skel
// (as every reference plugin) prints its "about" text to stderr and exits
// 0 instead of answering with error 4; what matters to a runtime is that
// no result comes out and nothing is plumbed.
func TestMissingCommand(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	ns := harness.NewNS(t, "pod")
	v := e.rawVars("ADD", "c1", ns.Path(), "eth0")
	delete(v, "CNI_COMMAND")
	out, stderr, err := e.rawCNI(t, v, e.rawConf(t, "nocmd", "1.1.0", nil))
	if err != nil && skeintest.ErrCode(err) != 4 {
		t.Errorf("without CNI_COMMAND the plugin should fail with 4 or print its about text; got %v", err)
	}
	if err == nil && (len(out) != 0 || !strings.Contains(stderr, "skein CNI plugin")) {
		t.Errorf("without CNI_COMMAND: expected no stdout and the about text on stderr, got stdout %q stderr %q", out, stderr)
	}
	e.assertNothingLeft(t)
	if links := podLinks(t, ns); len(links) != 1 {
		t.Errorf("pod namespace should only hold lo, holds %v", links)
	}
}

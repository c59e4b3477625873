package e2e

import (
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// freshRuntime is a libcni runtime with an empty result cache. libcni's
// GCNetworkList first DELs every cached attachment missing from the valid
// list and only then calls the plugin's GC; a runtime with no cache (the
// case GC exists for: it lost track) leaves all the work to skein.
func (e *env) freshRuntime(t *testing.T) *libcni.CNIConfig {
	return skeintest.NewCNI([]string{e.d.BinDir, skeintest.RefPluginDir}, t.TempDir())
}

// TestGC (CNI 1.1.0): GC removes every attachment of the network that the
// runtime does not list as valid — links, records and addresses — and
// nothing of other networks.
func TestGC(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "gc", "1.1.0", nil)
	other := e.list(t, "gc-other", "1.1.0", nil)
	pods := map[string]*pod{}
	for _, id := range []string{"g1", "g2", "g3"} {
		pods[id] = e.mustAdd(t, l, harness.NewNS(t, "pod"), id)
	}
	o1 := e.mustAdd(t, other, harness.NewNS(t, "pod"), "o1")
	gc := func(valid ...string) {
		t.Helper()
		args := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{}}
		for _, id := range valid {
			args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: id, IfName: "eth0"})
		}
		if err := e.freshRuntime(t).GCNetworkList(ctx(t), l, args); err != nil {
			t.Fatalf("GC of network gc with valid %v: expected success, got: %v", valid, err)
		}
	}
	linkOf := func(p *pod) string { return p.res.Interfaces[0].Name }

	gc("g1")
	if got, want := attKeys(e.d.Attachments(t)), []string{"gc-other/o1/eth0", "gc/g1/eth0"}; !slices.Equal(got, want) {
		t.Errorf("GC with valid [g1] should leave exactly %v, skeind holds %v", want, got)
	}
	links := hostLinks(t, e.d.Node)
	for _, id := range []string{"g2", "g3"} {
		if slices.Contains(links, linkOf(pods[id])) {
			t.Errorf("GC should have removed the host veth %s of %s", linkOf(pods[id]), id)
		}
	}
	for _, p := range []*pod{pods["g1"], o1} {
		if !slices.Contains(links, linkOf(p)) {
			t.Errorf("GC must keep the host veth %s of valid attachment %s", linkOf(p), p.rt.ContainerID)
		}
	}
	// g2's addresses are free again.
	g4ns := harness.NewNS(t, "pod")
	rt := skeintest.RT("g4", g4ns.Path(), "eth0")
	rt.Args = [][2]string{{"IP", pods["g2"].addrs[0].String() + "," + pods["g2"].addrs[1].String()}}
	if _, err := e.add(t, l, rt); err != nil {
		t.Errorf("GC should have released %v of g2; asking for them again failed: %v", pods["g2"].addrs, err)
	}

	gc()
	if got, want := attKeys(e.d.Attachments(t)), []string{"gc-other/o1/eth0"}; !slices.Equal(got, want) {
		t.Errorf("GC with no valid attachment should remove all of network gc and none of gc-other: want %v, skeind holds %v", want, got)
	}
	if links := hostLinks(t, e.d.Node); !slices.Equal(links, []string{linkOf(o1)}) {
		t.Errorf("after GC of network gc only %s (gc-other) should remain, node has %v", linkOf(o1), links)
	}
	if err := e.check(t, other, o1.rt); err != nil {
		t.Errorf("an attachment of another network must survive GC intact; CHECK says: %v", err)
	}
	mustReach(t, o1.ns, "pod of another network after GC", gw4)

	// The runtime's own DELs of what GC removed still succeed.
	for _, id := range []string{"g1", "g2", "g3"} {
		e.mustDel(t, l, pods[id].rt)
	}
	e.mustDel(t, l, rt)
	e.mustDel(t, other, o1.rt)
	e.assertNothingLeft(t)
}

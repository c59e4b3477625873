package daemon

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestReconcile: after a restart every recorded address is held again,
// a tagged link no record claims is removed, a claimed link that lost its
// tag gets it back, and the export covers the node's blocks.
func TestReconcile(t *testing.T) {
	ctx := context.Background()
	n := newTestNode(t, Config{})
	a, _, err := n.d.Attach(ctx, attachReq("c1"))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := n.d.Attach(ctx, attachReq("c2"))
	if err != nil {
		t.Fatal(err)
	}
	// c2's link lost its tag (an ADD cut short before tagging); a link
	// of an ADD whose record never became durable is left over.
	n.kernel.addLink(b.HostLink, "", b.Addrs...)
	n.kernel.addLink("skleftover", "skein:net:gone:eth0", netip.MustParseAddr("10.0.0.99"))

	if err := n.restart(); err != nil {
		t.Fatal(err)
	}
	if got := n.used("p"); got != 4 {
		t.Errorf("after restart %d addresses held, want 4", got)
	}
	want := []string{a.HostLink, b.HostLink}
	slices.Sort(want)
	if got := n.kernel.linkNames(); !slices.Equal(got, want) {
		t.Errorf("links after restart %v, want %v (leftover removed)", got, want)
	}
	if l, _ := n.kernel.link(b.HostLink); l.alias != n.d.aliasFor(b.AttachmentKey) {
		t.Errorf("untagged claimed link not retagged: alias %q", l.alias)
	}
	if len(n.kernel.exported) == 0 {
		t.Errorf("no blocks exported after reconcile")
	}
	if strings.Contains(n.log.String(), "level=ERROR") {
		t.Errorf("reconcile logged errors:\n%s", n.log.String())
	}
	// A new attachment gets none of the restored addresses.
	c, _, err := n.d.Attach(ctx, attachReq("c3"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ad := range c.Addrs {
		if slices.Contains(a.Addrs, ad) || slices.Contains(b.Addrs, ad) {
			t.Errorf("after restart %v handed out again", ad)
		}
	}
}

// TestReconcileReleasesVanished: a CNI record whose link and netns are
// both gone belongs to a container that is gone: its addresses are freed.
func TestReconcileReleasesVanished(t *testing.T) {
	ctx := context.Background()
	n := newTestNode(t, Config{})
	a, _, err := n.d.Attach(ctx, attachReq("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.d.dp.Teardown(a.HostLink, "", "", nil); err != nil {
		t.Fatal(err)
	}
	if err := n.restart(); err != nil {
		t.Fatal(err)
	}
	if len(n.records()) != 0 || n.used("p") != 0 {
		t.Fatalf("vanished attachment kept: records %v, used %d", n.records(), n.used("p"))
	}
}

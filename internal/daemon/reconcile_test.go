package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
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
	// Its address is in a block the node owns: it was allocated first.
	n.kernel.addLink("skleftover", "skein:net:gone:eth0", netip.MustParseAddr("10.0.0.20"))

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

// gauge reads skein_attachments as a scrape would.
func (n *testNode) gauge() float64 {
	n.t.Helper()
	mfs, err := n.d.metrics.reg.Gather()
	if err != nil {
		n.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "skein_attachments" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	n.t.Fatal("no skein_attachments metric")
	return 0
}

// TestReconcileDockerEndpoint: a Docker endpoint routes addresses its IPAM
// lease owns. A restart restores each address once (no "restored twice"
// error), retags the endpoint's link if it lost its tag, and counts the
// endpoint (not the lease) in skein_attachments. An endpoint whose lease is
// gone still keeps its routed addresses from being handed out.
func TestReconcileDockerEndpoint(t *testing.T) {
	ctx := context.Background()
	n := newTestNode(t, Config{})
	addrs, err := n.d.ipam.Allocate(ctx, ipam.Request{Pool: "p"})
	if err != nil {
		t.Fatal(err)
	}
	lease := store.Attachment{AttachmentKey: store.AttachmentKey{Network: "docker-ipam:pool1", ContainerID: addrs[0].String(), IfName: "ipam"},
		Pool: "p", Addrs: addrs, Owner: "docker"}
	ep := store.Attachment{AttachmentKey: store.AttachmentKey{Network: "docker:net1", ContainerID: "ep1", IfName: "eth"},
		Pool: "p", Addrs: addrs, HostLink: "skdockerep1", Owner: "docker", Borrowed: true}
	orphan := store.Attachment{AttachmentKey: store.AttachmentKey{Network: "docker:net1", ContainerID: "ep2", IfName: "eth"},
		Pool: "p", Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.200")}, HostLink: "skdockerep2", Owner: "docker", Borrowed: true}
	for _, a := range []store.Attachment{lease, ep, orphan} {
		if err := n.st.PutAttachment(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	n.kernel.addLink(ep.HostLink, "", addrs...) // lost its tag
	n.kernel.addLink(orphan.HostLink, n.d.aliasFor(orphan.AttachmentKey), orphan.Addrs...)

	for i := range 2 {
		if err := n.restart(); err != nil {
			t.Fatal(err)
		}
		if log := n.log.String(); strings.Contains(log, "level=ERROR") {
			t.Fatalf("restart %d: reconcile logged errors:\n%s", i+1, log)
		}
		if l, _ := n.kernel.link(ep.HostLink); l.alias != n.d.aliasFor(ep.AttachmentKey) {
			t.Errorf("restart %d: endpoint link not retagged: alias %q", i+1, l.alias)
		}
		if got := n.used("p"); got != uint64(len(addrs))+1 {
			t.Errorf("restart %d: %d addresses held, want %d (the lease's and the orphan endpoint's)", i+1, got, len(addrs)+1)
		}
		if g := n.gauge(); g != 2 {
			t.Errorf("restart %d: skein_attachments = %v, want 2 (the endpoints, not the lease)", i+1, g)
		}
	}
	// The addresses are the lease's: handing them out again must fail.
	for _, ad := range append(addrs, orphan.Addrs...) {
		if _, err := n.d.ipam.Allocate(ctx, ipam.Request{Pool: "p", Static: []netip.Addr{ad}}); !errors.Is(err, ipam.ErrInUse) {
			t.Errorf("static %v after restart: %v, want ErrInUse", ad, err)
		}
	}
}

// TestReconcileRefusesUnknownStore: skeind started on an empty store (the
// state directory moved or deleted) or on a copy older than the kernel must
// not delete the running attachments' links as leftovers: it refuses to
// start, says why and how to override, and deletes no link;
// ReconcileForce deletes them.
func TestReconcileRefusesUnknownStore(t *testing.T) {
	ctx := context.Background()
	// Blocks of two addresses, so each attachment claims its own block.
	n := newTestNode(t, Config{Pools: []PoolSpec{{Name: "p", Subnets: []string{"10.0.0.0/24", "fd00::/120"}, BlockSizeBits: 1}}})
	if _, _, err := n.d.Attach(ctx, attachReq("c1")); err != nil {
		t.Fatal(err)
	}
	// A copy of the store as it was with c1 alone.
	backup := filepath.Join(t.TempDir(), "backup.db")
	n.d.Close()
	n.d = nil
	copyFile(t, n.path, backup)
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c2", "c3"} {
		if _, _, err := n.d.Attach(ctx, attachReq(id)); err != nil {
			t.Fatal(err)
		}
	}
	links := n.kernel.linkNames()
	right := n.path

	for _, tt := range []struct {
		name, path string
		links      int
	}{
		{"an empty store (the pool comes back from the configuration)", filepath.Join(t.TempDir(), "moved.db"), 3},
		{"a copy from before c2 and c3", backup, 2},
	} {
		n.path = tt.path
		err := n.restart()
		if !errors.Is(err, ErrStoreMismatch) || !strings.Contains(err.Error(), "--reconcile-force") ||
			!strings.Contains(err.Error(), fmt.Sprintf("%d host link(s)", tt.links)) {
			t.Fatalf("start on %s: %v, want ErrStoreMismatch naming %d links and --reconcile-force", tt.name, err, tt.links)
		}
		if got := n.kernel.linkNames(); !slices.Equal(got, links) {
			t.Fatalf("start on %s: links after the refusal %v, want %v untouched", tt.name, got, links)
		}
		if !strings.Contains(n.log.String(), "level=ERROR") {
			t.Errorf("start on %s: the refusal was not logged as an error:\n%s", tt.name, n.log.String())
		}
	}

	// Back on the right store, nothing was lost.
	n.path = right
	if err := n.restart(); err != nil {
		t.Fatalf("start on the right store: %v", err)
	}
	if len(n.records()) != 3 || n.used("p") != 6 || !slices.Equal(n.kernel.linkNames(), links) {
		t.Fatalf("on the right store: records %d, used %d, links %v", len(n.records()), n.used("p"), n.kernel.linkNames())
	}

	// Forced, on the empty store: the links go.
	n.path = filepath.Join(t.TempDir(), "forced.db")
	n.cfg.ReconcileForce = true
	if err := n.restart(); err != nil {
		t.Fatalf("forced start: %v", err)
	}
	if got := n.kernel.linkNames(); len(got) != 0 {
		t.Fatalf("forced start left links %v", got)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

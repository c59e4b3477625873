package dataplane

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
)

// TestRollbackReportsUndoFailure: Setup's undo used to ignore LinkDel's
// error, so a caller could release addresses still routed to a link that
// stayed. A link the kernel refuses to delete (lo) must give an error
// wrapping both the cause and ErrUndoFailed; a link already gone is a
// successful undo.
func TestRollbackReportsUndoFailure(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace of its own)")
	}
	path := filepath.Join(t.TempDir(), "ns")
	if err := netns.Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(path) })
	h, closeH, err := netns.Handle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer closeH()
	d := &Dataplane{}
	cause := errors.New("set alias: boom")

	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	err = d.rollback(h, lo.Attrs().Index, "lo", cause)
	if !errors.Is(err, cause) || !errors.Is(err, ErrUndoFailed) {
		t.Fatalf("undo that cannot delete the link: %v, want the cause and ErrUndoFailed", err)
	}
	if err := d.rollback(h, 0, "sknotthere", cause); err != cause {
		t.Fatalf("undo of a link already gone: %v, want the cause alone", err)
	}
	// Index unknown (0): the link is found by its name and deleted.
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "skrollback"}, PeerName: "skrollbackp"}); err != nil {
		t.Fatal(err)
	}
	if err := d.rollback(h, 0, "skrollback", cause); err != cause {
		t.Fatalf("undo by name: %v, want the cause alone", err)
	}
	if _, err := h.LinkByName("skrollback"); err == nil {
		t.Fatal("undo by name left the link")
	}
}

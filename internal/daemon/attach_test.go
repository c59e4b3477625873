package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/dataplane"
)

// errUndo is a Setup failure whose undo failed too.
var errUndo = fmt.Errorf("set alias: %w (undo: delete: %w)", errBoom, dataplane.ErrUndoFailed)

// TestAttachDetach: the happy path leaves one record, one link and the
// addresses held; Detach undoes all three and is idempotent.
func TestAttachDetach(t *testing.T) {
	ctx := context.Background()
	n := newTestNode(t, Config{})
	a, _, err := n.d.Attach(ctx, attachReq("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Addrs) != 2 || n.used("p") != 2 || len(n.records()) != 1 {
		t.Fatalf("after Attach: addrs %v, used %d, records %d", a.Addrs, n.used("p"), len(n.records()))
	}
	l, ok := n.kernel.link(a.HostLink)
	if !ok || l.alias != n.d.aliasFor(a.AttachmentKey) {
		t.Fatalf("host link %s: present %v, alias %q", a.HostLink, ok, l.alias)
	}
	if _, _, err := n.d.Attach(ctx, attachReq("c1")); !errors.Is(err, ErrAttachmentExists) {
		t.Fatalf("second Attach of the key: %v, want ErrAttachmentExists", err)
	}
	for i := range 2 {
		found, err := n.d.Detach(ctx, key("c1"), "")
		if err != nil || found != (i == 0) {
			t.Fatalf("Detach #%d: found %v, err %v", i+1, found, err)
		}
	}
	if n.used("p") != 0 || len(n.records()) != 0 || len(n.kernel.linkNames()) != 0 {
		t.Fatalf("after Detach: used %d, records %v, links %v", n.used("p"), n.records(), n.kernel.linkNames())
	}
}

// TestAttachFailures drives each way Attach can fail half-way, the
// kernel and the store failing alone or with their undo, and checks what
// stays: nothing when the undo worked; when it did not, the addresses stay
// held as long as something (a link, a record) may still claim them.
func TestAttachFailures(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// put, del: store failures; setup, teardown: kernel failures.
		put, del, setup, teardown error
		// setupLeaves: the failed Setup could not undo itself.
		setupLeaves          bool
		wantRecord, wantLink bool
		wantUsed             uint64
	}{
		{name: "kernel ok, store failed", put: errBoom},
		{name: "store ok, kernel failed", setup: errBoom},
		{name: "store failed, kernel failed", put: errBoom, setup: errBoom},
		{name: "kernel ok, store failed, teardown failed", put: errBoom, teardown: errBoom, wantLink: true, wantUsed: 2},
		{name: "store ok, kernel failed, record delete failed", setup: errBoom, del: errBoom, wantRecord: true, wantUsed: 2},
		// A Setup whose own undo failed leaves a link routing the
		// addresses: they stay held, with the record DEL needs.
		{name: "store ok, kernel failed, its undo failed", setup: errUndo, setupLeaves: true, wantRecord: true, wantLink: true, wantUsed: 2},
		{name: "store failed, kernel failed, its undo failed", put: errBoom, setup: errUndo, setupLeaves: true, wantLink: true, wantUsed: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newTestNode(t, Config{})
			n.st.fail(tt.put, tt.del)
			n.kernel.fail(tt.setup, tt.teardown)
			n.kernel.setupLeaves = tt.setupLeaves
			_, _, err := n.d.Attach(ctx, attachReq("c1"))
			if !errors.Is(err, errBoom) {
				t.Fatalf("Attach: %v, want the injected failure", err)
			}
			n.st.fail(nil, nil)
			n.kernel.fail(nil, nil)
			if got := len(n.records()) == 1; got != tt.wantRecord {
				t.Errorf("record left: %v, want %v", got, tt.wantRecord)
			}
			if got := len(n.kernel.linkNames()) == 1; got != tt.wantLink {
				t.Errorf("link left: %v, want %v", got, tt.wantLink)
			}
			if got := n.used("p"); got != tt.wantUsed {
				t.Errorf("addresses held: %d, want %d", got, tt.wantUsed)
			}
			// Whatever was left, a DEL cleans it all up, and the key can
			// be attached again.
			if _, err := n.d.Detach(ctx, key("c1"), ""); err != nil {
				t.Fatalf("Detach: %v", err)
			}
			if len(n.records()) != 0 || len(n.kernel.linkNames()) != 0 {
				t.Errorf("after Detach: records %v, links %v", n.records(), n.kernel.linkNames())
			}
			if _, _, err := n.d.Attach(ctx, attachReq("c1")); err != nil {
				t.Fatalf("Attach again: %v", err)
			}
		})
	}
}

// TestDetachFailures: a DEL that cannot tear down the link or delete the
// record fails and keeps the addresses held; a retry finishes the job.
func TestDetachFailures(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name          string
		teardown, del error
		wantLink      bool
	}{
		{"teardown failed", errBoom, nil, true},
		{"record delete failed", nil, errBoom, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newTestNode(t, Config{})
			if _, _, err := n.d.Attach(ctx, attachReq("c1")); err != nil {
				t.Fatal(err)
			}
			n.kernel.fail(nil, tt.teardown)
			n.st.fail(nil, tt.del)
			if _, err := n.d.Detach(ctx, key("c1"), ""); !errors.Is(err, errBoom) {
				t.Fatalf("Detach: %v, want the injected failure", err)
			}
			if len(n.records()) != 1 || n.used("p") != 2 || (len(n.kernel.linkNames()) == 1) != tt.wantLink {
				t.Fatalf("after a failed Detach: records %d, used %d, links %v", len(n.records()), n.used("p"), n.kernel.linkNames())
			}
			n.kernel.fail(nil, nil)
			n.st.fail(nil, nil)
			if found, err := n.d.Detach(ctx, key("c1"), ""); err != nil || !found {
				t.Fatalf("Detach retry: found %v, err %v", found, err)
			}
			if len(n.records()) != 0 || n.used("p") != 0 || len(n.kernel.linkNames()) != 0 {
				t.Fatalf("after the retry: records %d, used %d, links %v", len(n.records()), n.used("p"), n.kernel.linkNames())
			}
		})
	}
}

// TestLongContainerIDs: CNI allows container IDs of 256 bytes. Two that
// differ only at the end get host links tagged differently, each tag
// within the kernel's limit and ending with the interface name.
func TestLongContainerIDs(t *testing.T) {
	ctx := context.Background()
	n := newTestNode(t, Config{})
	seen := map[string]bool{}
	for _, last := range []string{"1", "2"} {
		r := attachReq(strings.Repeat("c", 255) + last)
		a, _, err := n.d.Attach(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		l, _ := n.kernel.link(a.HostLink)
		if len(l.alias) > dataplane.MaxAliasLen || !strings.HasSuffix(l.alias, ":eth0") || !strings.HasPrefix(l.alias, "skein:net:ccc") {
			t.Errorf("alias %q (%d bytes)", l.alias, len(l.alias))
		}
		seen[l.alias] = true
	}
	if len(seen) != 2 {
		t.Errorf("two attachments share the alias %v", seen)
	}
}

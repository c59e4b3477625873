package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// tieredAt opens a Tiered store over the durable file in dir, with CNI
// records volatile, as skeind does; boot is the kernel's boot ID it sees.
func tieredAt(t *testing.T, dir, boot string, force bool) (*Tiered, error) {
	t.Helper()
	durable, err := OpenBolt(filepath.Join(dir, "skein.db"), BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := OpenTiered(context.Background(), durable, TieredOptions{
		Path: filepath.Join(dir, "run", "attachments.db"), Volatile: func(a Attachment) bool { return a.Owner == "cni" },
		CheckPools: true, Force: force, BootID: boot,
	})
	if err != nil {
		durable.Close()
		return nil, err
	}
	return ts, nil
}

func mustTiered(t *testing.T, dir, boot string) *Tiered {
	t.Helper()
	ts, err := tieredAt(t, dir, boot, false)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func keys(t *testing.T, s Store) map[string]bool {
	t.Helper()
	list, err := s.ListAttachments(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, a := range list {
		out[a.AttachmentKey.String()] = true
	}
	return out
}

// TestTieredRoutesByOwner: CNI records go to the volatile file without a
// synced commit, others to the durable one; every read, update and
// delete finds a record in its tier; a key is never in both.
func TestTieredRoutesByOwner(t *testing.T) {
	ctx := context.Background()
	ts := mustTiered(t, t.TempDir(), "boot-1")
	defer ts.Close()
	if err := ts.CreatePool(ctx, testPool("p", "10.0.0.0/24"), nil); err != nil {
		t.Fatal(err)
	}
	cni := testAttachment("n", "c1", "10.0.0.2")
	docker := testAttachment("n", "c2", "10.0.0.3")
	docker.Owner = "docker"
	before := ts.Commits()
	if err := ts.PutAttachment(ctx, cni); err != nil {
		t.Fatal(err)
	}
	if n := ts.Commits() - before; n != 0 {
		t.Errorf("a CNI record cost %d synced commits, want 0", n)
	}
	if err := ts.PutAttachment(ctx, docker); err != nil {
		t.Fatal(err)
	}
	if n := ts.Commits() - before; n != 1 {
		t.Errorf("a Docker record cost %d synced commits, want 1", n)
	}
	if k := keys(t, ts.vol); !k[cni.AttachmentKey.String()] || len(k) != 1 {
		t.Errorf("volatile file holds %v, want the CNI record alone", k)
	}
	if k := keys(t, ts.Store); !k[docker.AttachmentKey.String()] || len(k) != 1 {
		t.Errorf("durable file holds %v, want the Docker record alone", k)
	}
	if k := keys(t, ts); len(k) != 2 {
		t.Errorf("ListAttachments: %v, want both", k)
	}
	// A durable record (one written before the tiers, say) keeps its key.
	clash := docker
	clash.Owner = "cni"
	if err := ts.PutAttachment(ctx, clash); !errors.Is(err, ErrExists) {
		t.Errorf("a CNI record over a durable one's key: %v, want ErrExists", err)
	}
	for _, a := range []Attachment{cni, docker} {
		a.Extra = []byte(`{"updated":true}`)
		if err := ts.UpdateAttachment(ctx, a); err != nil {
			t.Fatal(err)
		}
		if got, err := ts.GetAttachment(ctx, a.AttachmentKey); err != nil || string(got.Extra) != `{"updated":true}` {
			t.Errorf("%s after update: %+v, %v", a.AttachmentKey, got, err)
		}
	}
	before = ts.Commits()
	for _, a := range []Attachment{cni, cni, docker} {
		if err := ts.DeleteAttachment(ctx, a.AttachmentKey); err != nil {
			t.Fatal(err)
		}
	}
	if n := ts.Commits() - before; n != 1 {
		t.Errorf("deleting a CNI record twice and a Docker one cost %d synced commits, want 1", n)
	}
	if k := keys(t, ts); len(k) != 0 {
		t.Errorf("left %v", k)
	}
	if _, err := ts.GetAttachment(ctx, cni.AttachmentKey); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after delete: %v", err)
	}
	if err := ts.UpdateAttachment(ctx, cni); !errors.Is(err, ErrNotFound) {
		t.Errorf("Update of a missing record: %v", err)
	}
}

// TestTieredPools: a volatile record must name a pool of the durable
// file, and a pool's deletion sees its volatile holders — also when the
// two race, as one transaction in one file would.
func TestTieredPools(t *testing.T) {
	ctx := context.Background()
	ts := mustTiered(t, t.TempDir(), "boot-1")
	defer ts.Close()
	if err := ts.PutAttachment(ctx, testAttachment("n", "c0", "10.0.0.2")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a record of a missing pool: %v, want ErrNotFound", err)
	}
	refuse := func(h []Attachment) error {
		if len(h) > 0 {
			return fmt.Errorf("%d holders", len(h))
		}
		return nil
	}
	for i := range 30 {
		if err := ts.CreatePool(ctx, testPool("p", "10.0.0.0/24"), nil); err != nil {
			t.Fatal(err)
		}
		a := testAttachment("n", fmt.Sprintf("c%d", i), "10.0.0.2")
		var wg sync.WaitGroup
		var putErr, delErr error
		wg.Add(2)
		go func() { defer wg.Done(); putErr = ts.PutAttachment(ctx, a) }()
		go func() { defer wg.Done(); delErr = ts.DeletePool(ctx, "p", refuse) }()
		wg.Wait()
		_, poolErr := ts.GetPool(ctx, "p")
		_, recErr := ts.GetAttachment(ctx, a.AttachmentKey)
		switch {
		case putErr == nil && delErr == nil:
			t.Fatalf("round %d: the record was written and its pool deleted", i)
		case recErr == nil && poolErr != nil:
			t.Fatalf("round %d: a record names a deleted pool", i)
		}
		ts.DeleteAttachment(ctx, a.AttachmentKey)
		ts.DeletePool(ctx, "p", nil)
	}
}

// TestTieredAcrossStarts: the volatile records outlive the process (a
// reopen in the same boot) but not a reboot (a new boot ID discards
// them, durable records stay); this boot's file gone or unreadable is
// refused unless forced.
func TestTieredAcrossStarts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ts := mustTiered(t, dir, "boot-1")
	if err := ts.CreatePool(ctx, testPool("p", "10.0.0.0/24"), nil); err != nil {
		t.Fatal(err)
	}
	cni := testAttachment("n", "c1", "10.0.0.2")
	kurma := testAttachment("n", "c2", "10.0.0.3")
	kurma.Owner = "kurma"
	for _, a := range []Attachment{cni, kurma} {
		if err := ts.PutAttachment(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	ts.Close()

	ts = mustTiered(t, dir, "boot-1")
	if k := keys(t, ts); len(k) != 2 {
		t.Fatalf("after a restart in the same boot: %v, want both records", k)
	}
	ts.Close()

	ts = mustTiered(t, dir, "boot-2")
	if k := keys(t, ts); len(k) != 1 || !k[kurma.AttachmentKey.String()] {
		t.Fatalf("after a reboot: %v, want the durable record alone", k)
	}
	if err := ts.PutAttachment(ctx, cni); err != nil {
		t.Fatal(err)
	}
	ts.Close()

	// The same boot, the records asked for elsewhere (a changed socket).
	durable, err := OpenBolt(filepath.Join(dir, "skein.db"), BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	moved := TieredOptions{Path: filepath.Join(dir, "other.db"), Volatile: func(Attachment) bool { return true }, BootID: "boot-2"}
	if _, err := OpenTiered(ctx, durable, moved); !errors.Is(err, ErrVolatileLost) || !strings.Contains(err.Error(), filepath.Join(dir, "run", "attachments.db")) {
		t.Fatalf("this boot's records asked for at another path: %v, want ErrVolatileLost naming where they are", err)
	}
	durable.Close()

	vol := filepath.Join(dir, "run", "attachments.db")
	if err := os.Remove(vol); err != nil {
		t.Fatal(err)
	}
	if _, err := tieredAt(t, dir, "boot-2", false); !errors.Is(err, ErrVolatileLost) {
		t.Fatalf("this boot's file gone: %v, want ErrVolatileLost", err)
	}
	if err := os.WriteFile(vol, []byte("not a bolt file at all, not even close to one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := tieredAt(t, dir, "boot-2", false); !errors.Is(err, ErrVolatileLost) {
		t.Fatalf("this boot's file unreadable: %v, want ErrVolatileLost", err)
	}
	ts, err = tieredAt(t, dir, "boot-2", true)
	if err != nil {
		t.Fatalf("forced: %v", err)
	}
	if k := keys(t, ts); len(k) != 1 {
		t.Errorf("forced start: %v, want the durable record alone", k)
	}
	ts.Close()

	// An unreadable file of an earlier boot is discarded.
	if err := os.WriteFile(vol, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	ts = mustTiered(t, dir, "boot-3")
	if k := keys(t, ts); len(k) != 1 {
		t.Errorf("after a reboot over a broken file: %v", k)
	}
	ts.Close()
}

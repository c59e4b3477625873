package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestMovedStoreRefused: a skeind started for the same node on another
// (empty) state directory finds the pods' tagged host links but no record
// of them. It must not delete them as leftovers: it exits, saying how to
// override, and the pods keep working; the daemon on the right store
// serves them on.
func TestMovedStoreRefused(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "moved", "1.1.0", nil)
	a := e.mustAdd(t, l, harness.NewNS(t, "pod"), "a")
	b := e.mustAdd(t, l, harness.NewNS(t, "pod"), "b")
	e.d.Stop(t)

	dir := t.TempDir()
	args := []string{
		"--node-netns", e.d.Node.Path(),
		"--state-dir", filepath.Join(dir, "state"),
		"--socket", filepath.Join(dir, "skeind.sock"),
		"--metrics-addr", "off", "--docker-socket", "off", "--node", "test-node",
		"--default-pool", "10.64.0.0/16,fd00:64::/112",
	}
	// A skeind that accepts the store serves until killed.
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(c, filepath.Join(e.d.BinDir, "skeind"), args...).CombinedOutput()
	if c.Err() != nil {
		t.Errorf("skeind started on an empty store instead of refusing; output:\n%s", out)
	} else if err == nil || !strings.Contains(string(out), "--reconcile-force") || !strings.Contains(string(out), "2 host link(s)") {
		t.Fatalf("skeind on an empty store: err %v, output:\n%s\nwant a refusal naming the 2 links and --reconcile-force", err, out)
	}
	mustReach(t, a.ns, "pod b after skeind refused an empty store", b.addrs...)

	e.d.Start(t)
	for _, p := range []*pod{a, b} {
		if err := e.check(t, l, p.rt); err != nil {
			t.Errorf("CHECK %s on the right store: %v", p.rt.ContainerID, err)
		}
		e.mustDel(t, l, p.rt)
	}
	e.assertNothingLeft(t)
}

// TestVolatileRecordsLost: the CNI records live in a file beside the
// socket that is not synced (store.Tiered). If it vanishes while the
// node runs (its directory cleared, or not mounted from the host), the
// pods' tagged links look like leftovers of interrupted ADDs; skeind must
// refuse to start rather than delete them, saying where the records were
// and how to override, and the pods keep working. With --reconcile-force
// it starts with no records and deletes those links.
func TestVolatileRecordsLost(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "lost", "1.1.0", nil)
	a := e.mustAdd(t, l, harness.NewNS(t, "pod"), "a")
	b := e.mustAdd(t, l, harness.NewNS(t, "pod"), "b")
	e.d.Stop(t)
	vol := e.d.VolatileStore()
	if err := os.Remove(vol); err != nil {
		t.Fatalf("the CNI records are not at %s: %v", vol, err)
	}
	args := []string{
		"--node-netns", e.d.Node.Path(),
		"--state-dir", filepath.Join(e.d.Dir, "state"),
		"--socket", e.d.Socket,
		"--metrics-addr", "off", "--docker-socket", "off", "--node", "test-node",
	}
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(c, filepath.Join(e.d.BinDir, "skeind"), args...).CombinedOutput()
	if c.Err() != nil {
		t.Fatalf("skeind started without this boot's records instead of refusing; output:\n%s", out)
	} else if err == nil || !strings.Contains(string(out), "--reconcile-force") || !strings.Contains(string(out), vol) {
		t.Fatalf("skeind without its records: err %v, output:\n%s\nwant a refusal naming %s and --reconcile-force", err, out, vol)
	}
	if links := hostLinks(t, e.d.Node); len(links) != 2 {
		t.Errorf("after the refusal the node has host links %v, want the two pods'", links)
	}
	mustReach(t, a.ns, "pod b after skeind refused to start without its records", b.addrs...)

	c2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	forced := exec.CommandContext(c2, filepath.Join(e.d.BinDir, "skeind"), append(args, "--reconcile-force")...)
	out, _ = forced.CombinedOutput()
	if c2.Err() == nil {
		t.Fatalf("skeind --reconcile-force exited instead of serving; output:\n%s", out)
	}
	if links := hostLinks(t, e.d.Node); len(links) != 0 {
		t.Errorf("--reconcile-force left host links %v", links)
	}
}

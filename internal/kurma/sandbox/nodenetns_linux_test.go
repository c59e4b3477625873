package sandbox

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// TestNodeNetNS: with Options.NodeNetNS a call runs in that namespace (its
// /proc/self/ns/net and its /sys/class/net are the node's), not in the
// namespace of the process that started it; without it, in the starter's.
func TestNodeNetNS(t *testing.T) {
	needRoot(t)
	node := filepath.Join(t.TempDir(), "netns", "node")
	if err := netns.Create(node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(node) })
	if err := netns.Do(node, func() error {
		return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "nodeprobe0"}})
	}); err != nil {
		t.Fatal(err)
	}
	var nodeSt, hostSt unix.Stat_t
	if err := unix.Stat(node, &nodeSt); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/self/ns/net", &hostSt); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		nodeNS   string
		wantIno  uint64
		wantLink bool
	}{
		{"node", node, nodeSt.Ino, true},
		{"inherited", "", hostSt.Ino, false},
	} {
		bothStarts(t, Options{NodeNetNS: c.nodeNS}, func(t *testing.T, e *testEnv) {
			res, err := e.run(t, context.Background(), e.spec(`{"mode":"probe"}`))
			if err != nil {
				t.Fatal(err)
			}
			var r probeReport
			if err := json.Unmarshal(res.Stdout, &r); err != nil {
				t.Fatalf("probe output: %v\n%s", err, res.Stdout)
			}
			if r.SelfNetIno != c.wantIno {
				t.Errorf("%s: the call's netns inode %d, want %d", c.name, r.SelfNetIno, c.wantIno)
			}
			if got := slices.Contains(r.SysLinks, "nodeprobe0"); got != c.wantLink {
				t.Errorf("%s: /sys/class/net %v: node's bridge seen %v, want %v", c.name, r.SysLinks, got, c.wantLink)
			}
		})
	}
	if _, err := New(Options{NodeNetNS: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("a node netns that does not exist: want an error from New")
	}
}

package netns_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

func TestIsNetNS(t *testing.T) {
	harness.RequireRoot(t)
	ns := harness.NewNS(t, "isns")
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want error
	}{
		{ns.Path(), nil},
		{"/proc/self/ns/net", nil},
		{filepath.Join(t.TempDir(), "missing"), netns.ErrNotExist},
		{"", netns.ErrNotExist},
		{file, netns.ErrNotNetNS},
		{t.TempDir(), netns.ErrNotNetNS},
	} {
		err := netns.IsNetNS(c.path)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("IsNetNS(%q) = %v, want %v", c.path, err, c.want)
		}
	}
}

// TestDoAndHandle checks that Do runs inside the namespace, that a handle
// made by Handle sees that namespace's links, and that the caller's own
// namespace is unchanged afterwards.
func TestDoAndHandle(t *testing.T) {
	harness.RequireRoot(t)
	before, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	ns := harness.NewNS(t, "do")
	var inside string
	if err := netns.Do(ns.Path(), func() error {
		var err error
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == before {
		t.Errorf("Do did not switch namespace (%s)", inside)
	}
	h, closeH, err := netns.Handle(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer closeH()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Errorf("links in fresh namespace: %d, want only lo", len(links))
	}
	if err := netns.Do(filepath.Join(t.TempDir(), "nope"), func() error { return nil }); !errors.Is(err, netns.ErrNotExist) {
		t.Errorf("Do(missing) = %v, want ErrNotExist", err)
	}
	after, _ := os.Readlink("/proc/self/ns/net")
	if after != before {
		t.Errorf("process namespace changed: %s -> %s", before, after)
	}
}

func TestWriteSysctl(t *testing.T) {
	harness.RequireRoot(t)
	ns := harness.NewNS(t, "sysctl")
	host, _ := os.ReadFile("/proc/sys/net/ipv4/conf/lo/forwarding")
	if err := netns.WriteSysctl(ns.Path(), "net.ipv4.conf.lo.forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	if err := netns.WriteSysctls(ns.Path(), [2]string{"net/ipv4/conf/lo/proxy_arp", "1"}); err != nil {
		t.Fatal(err)
	}
	var got, got2 []byte
	if err := ns.Do(func() error {
		var err error
		if got, err = os.ReadFile("/proc/sys/net/ipv4/conf/lo/forwarding"); err != nil {
			return err
		}
		got2, err = os.ReadFile("/proc/sys/net/ipv4/conf/lo/proxy_arp")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != "1" || strings.TrimSpace(string(got2)) != "1" {
		t.Errorf("inside: forwarding=%q proxy_arp=%q, want 1 and 1", got, got2)
	}
	if now, _ := os.ReadFile("/proc/sys/net/ipv4/conf/lo/forwarding"); string(now) != string(host) {
		t.Errorf("host's lo forwarding changed: %q -> %q", host, now)
	}
	if err := netns.WriteSysctl(ns.Path(), "net.ipv4.conf.nosuchif.forwarding", "1"); err == nil {
		t.Error("writing a missing sysctl succeeded")
	}
}

// TestCreateRemove runs in a private mount namespace (see
// hidden_linux_test.go): Create makes the pin's directory a mount point.
func TestCreateRemove(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	dir := pinDir(t)
	path := filepath.Join(dir, "ns")
	if err := netns.Create(path); err != nil {
		t.Fatal(err)
	}
	if err := netns.IsNetNS(path); err != nil {
		t.Errorf("created namespace: %v", err)
	}
	if m := mountsAt(t, dir); len(m) != 1 || !strings.Contains(m[0], " shared:") {
		t.Errorf("the pin directory should be one shared mount of itself; mounts there:\n%s", strings.Join(m, "\n"))
	}
	if err := netns.Create(path); err == nil {
		t.Error("Create over an existing path succeeded")
	}
	if err := netns.Remove(dir); err == nil {
		t.Error("Remove of a directory succeeded")
	}
	if m := mountsAt(t, dir); len(m) != 1 {
		t.Errorf("a refused Remove changed the mounts at %s:\n%s", dir, strings.Join(m, "\n"))
	}
	for i := 0; i < 2; i++ {
		if err := netns.Remove(path); err != nil {
			t.Errorf("Remove #%d: %v", i+1, err)
		}
	}
	if err := netns.IsNetNS(path); !errors.Is(err, netns.ErrNotExist) {
		t.Errorf("after Remove: %v, want ErrNotExist", err)
	}
	assertGone(t, path)
	// Another process preparing the directory again (with a pin in it)
	// stacks no second mount and hides nothing.
	if err := netns.Create(path); err != nil {
		t.Fatal(err)
	}
	if err := netns.PrepareDirAgain(dir); err != nil {
		t.Fatal(err)
	}
	if m := mountsAt(t, dir); len(m) != 1 {
		t.Errorf("preparing twice stacked mounts at %s:\n%s", dir, strings.Join(m, "\n"))
	}
	if err := netns.Remove(path); err != nil {
		t.Error(err)
	}
	assertGone(t, path)
}

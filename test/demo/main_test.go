package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParsePingLines(t *testing.T) {
	// A serial console: CRs, kernel messages on the same line, other
	// reports, an address that is not one.
	console := "SKEIN-VM lease4 ok\r\n" +
		"[    9.1] random: crng init done SKEIN-VM ping 10.64.0.1 ok\r\n" +
		"SKEIN-VM ping fd00:64::1 fail\n" +
		"SKEIN-VM ping 10.64.0.2 ok trailing\n" +
		"SKEIN-VM ping nonsense ok\n" +
		"ping 10.64.0.9 ok\n"
	got := parsePingLines(console, "SKEIN-VM ping ")
	want := map[netip.Addr]bool{
		netip.MustParseAddr("10.64.0.1"):  true,
		netip.MustParseAddr("fd00:64::1"): false,
	}
	if len(got) != len(want) {
		t.Fatalf("parsed %v, want %v", got, want)
	}
	for a, ok := range want {
		if r, found := got[a]; !found || r != ok {
			t.Errorf("%s: got %v (present %v), want %v", a, r, found, ok)
		}
	}
	// docker exec output: no prefix.
	if got := parsePingLines("10.64.0.4 ok\nfd00:64::4 fail\n", ""); !got[netip.MustParseAddr("10.64.0.4")] || got[netip.MustParseAddr("fd00:64::4")] || len(got) != 2 {
		t.Errorf("unprefixed lines: %v", got)
	}
}

func TestForeign(t *testing.T) {
	d := &demo{dir: filepath.Join(os.TempDir(), "skein-demo-123"), plugin: "skein-demo-abc"}
	for _, c := range []struct {
		line string
		want bool
	}{
		{"path /run/netns/skein-demo-pod1-aabbcc", false},
		{"mount /run/netns/skein-demo-node-aabbcc type nsfs", false},
		{"path /run/netns/node-1234", true},
		{"mount /run/netns/skein-node-1234 type nsfs", true},
		{"path /run/docker/plugins/skein-demo-abc.sock", false},
		{"path /run/docker/plugins/skein-1234.sock", true},
		{"mount " + d.dir + "/docker/data type ext4", false},
		{"path " + d.dir, false},
		{"mount " + filepath.Join(os.TempDir(), "skdocker-1/data") + " type ext4", true},
		{"path " + d.dir + "0", true},
		// Outside the shared places every difference is the demo's.
		{"path /run/docker", false},
		{"path /run/netns mode=d---------", false},
		{"link skb75076e3fd41 type=veth mtu=1500 up=true", false},
		{"nft table family 2 docker", false},
		{"mount /var/lib/docker type ext4", false},
	} {
		if got := d.foreign(c.line); got != c.want {
			t.Errorf("foreign(%q) = %v, want %v", c.line, got, c.want)
		}
	}
	// Without a Docker part no plugin socket is the demo's.
	if !(&demo{}).foreign("path /run/docker/plugins/skein-demo-abc.sock") {
		t.Error("with no plugin, a plugin socket should be foreign")
	}
}

func TestHostStateDiff(t *testing.T) {
	before := hostState{"a", "b", "b", "c"}
	after := hostState{"b", "c", "d"}
	gone, added := before.diff(after)
	if !slices.Equal(gone, []string{"a", "b"}) || !slices.Equal(added, []string{"d"}) {
		t.Errorf("diff: gone %v, added %v", gone, added)
	}
	if g, a := after.diff(after); len(g)+len(a) != 0 {
		t.Errorf("a state differs from itself: %v %v", g, a)
	}
}

func TestMkdirOwned(t *testing.T) {
	root := t.TempDir()
	existing := filepath.Join(root, "run")
	if err := os.Mkdir(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	var c cleanup
	target := filepath.Join(existing, "docker", "plugins")
	if err := mkdirOwned(&c, target); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() {
		t.Fatalf("%s not created: %v", target, err)
	}
	c.run()
	if c.failed != 0 {
		t.Fatalf("%d cleanup steps failed", c.failed)
	}
	if _, err := os.Stat(filepath.Join(existing, "docker")); !os.IsNotExist(err) {
		t.Errorf("the directories mkdirOwned made should be gone: %v", err)
	}
	if _, err := os.Stat(existing); err != nil {
		t.Errorf("the directory that existed before must stay: %v", err)
	}

	// An existing target is left alone.
	var c2 cleanup
	if err := mkdirOwned(&c2, existing); err != nil {
		t.Fatal(err)
	}
	c2.run()
	if _, err := os.Stat(existing); err != nil || c2.failed != 0 {
		t.Errorf("an existing directory was removed or cleanup failed: %v, %d", err, c2.failed)
	}
}

package pack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/test/skeintest"
)

// refPlugins are the reference plugins the tests wrap (Debian's
// containernetworking-plugins: dynamically linked against glibc).
var refPlugins = []string{"bridge", "host-local", "macvlan", "ptp"}

func pluginPaths(t testing.TB, names ...string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		p := filepath.Join("/usr/lib/cni", n)
		if _, err := os.Stat(p); err != nil {
			t.Skipf("reference CNI plugin %s missing (Debian package containernetworking-plugins): %v", n, err)
		}
		out = append(out, p)
	}
	return out
}

func shimPath(t testing.TB) string {
	t.Helper()
	p := filepath.Join(skeintest.Binaries(t), ShimName)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("shim not built: %v", err)
	}
	return p
}

// writeArchive packs into a file and returns its path and the sha256 of
// its bytes (the digest internal/kurma/image gives a file:// archive).
func writeArchive(t testing.TB, o Options) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	if _, err := Write(&buf, o); err != nil {
		t.Fatalf("pack: %v", err)
	}
	p := filepath.Join(t.TempDir(), "cni.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return p, "sha256:" + hex.EncodeToString(sum[:])
}

func acquire(t testing.TB, src image.Source) image.Image {
	t.Helper()
	c, err := image.Open(image.Options{Dir: filepath.Join(t.TempDir(), "images")})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := image.Parse(src)
	if err != nil {
		t.Fatalf("parse %q: %v", src.Image, err)
	}
	img, release, err := c.Acquire(context.Background(), ref)
	if err != nil {
		t.Fatalf("acquire %s: %v", src.Image, err)
	}
	t.Cleanup(release)
	return img
}

// TestPackUnpack: the reference plugins packed with the shim unpack
// through the image cache into the layout the package doc promises.
func TestPackUnpack(t *testing.T) {
	archive, sum := writeArchive(t, Options{Plugins: pluginPaths(t, refPlugins...), Shim: shimPath(t)})
	img := acquire(t, image.Source{Image: "file://" + archive})
	if img.Digest != sum {
		t.Errorf("digest %s, want the archive's %s", img.Digest, sum)
	}
	if len(img.MainExec) != 0 {
		t.Errorf("main exec %q, want none", img.MainExec)
	}
	regular := []string{AddPath, DelPath, "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6"}
	for _, n := range refPlugins {
		regular = append(regular, PluginDir+"/"+n)
	}
	for _, p := range regular {
		fi, err := os.Lstat(filepath.Join(img.Root, p))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			t.Errorf("%s: want an executable regular file, got %v %v", p, fi, err)
		}
	}
	add, _ := os.Stat(filepath.Join(img.Root, AddPath))
	del, _ := os.Stat(filepath.Join(img.Root, DelPath))
	if add == nil || del == nil || add.Sys().(*syscall.Stat_t).Ino != del.Sys().(*syscall.Stat_t).Ino {
		t.Errorf("del is not a hard link of add")
	}
	for _, n := range refPlugins {
		want, _ := os.ReadFile(filepath.Join("/usr/lib/cni", n))
		got, _ := os.ReadFile(filepath.Join(img.Root, PluginDir, n))
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from /usr/lib/cni/%s", n, n)
		}
	}
	if l, err := os.Readlink(filepath.Join(img.Root, CNIState)); err != nil || l != "network" {
		t.Errorf("%s → %q %v, want the link to network", CNIState, l, err)
	}
	if fi, err := os.Stat(filepath.Join(img.Root, StateDir)); err != nil || !fi.IsDir() {
		t.Errorf("%s: %v", StateDir, err)
	}
}

// TestPackDeterministic: the same inputs give the same bytes, whatever
// their order; another plugin set gives other bytes.
func TestPackDeterministic(t *testing.T) {
	shim := shimPath(t)
	pack := func(plugins []string) []byte {
		var buf bytes.Buffer
		if _, err := Write(&buf, Options{Plugins: plugins, Shim: shim}); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	a := pack(pluginPaths(t, "ptp", "host-local"))
	b := pack(pluginPaths(t, "host-local", "ptp"))
	if !bytes.Equal(a, b) {
		t.Error("two packs of the same plugins differ")
	}
	if c := pack(pluginPaths(t, "ptp")); bytes.Equal(a, c) {
		t.Error("packs of different plugins are equal")
	}
	img, err := Build(Options{Plugins: pluginPaths(t, "ptp", "host-local"), Shim: shim})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.Labels[PluginsLabel] != "host-local,ptp" || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config: labels %v os %s arch %s", cf.Config.Labels, cf.OS, cf.Architecture)
	}
}

// TestPackRefuses: bad inputs fail with a message naming the problem.
func TestPackRefuses(t *testing.T) {
	shim := shimPath(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	_ = os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755)
	noexec := filepath.Join(dir, "noexec")
	_ = os.WriteFile(noexec, []byte("x"), 0o644)
	bridge := pluginPaths(t, "bridge")[0]
	copyDir := t.TempDir()
	b, _ := os.ReadFile(bridge)
	_ = os.WriteFile(filepath.Join(copyDir, "bridge"), b, 0o755)
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no shim", Options{Plugins: []string{bridge}}, "no shim"},
		{"no plugins", Options{Shim: shim}, "no plugins"},
		{"dynamic shim", Options{Plugins: []string{bridge}, Shim: bridge}, "dynamically linked"},
		{"script", Options{Plugins: []string{script}, Shim: shim}, "not an ELF"},
		{"not executable", Options{Plugins: []string{noexec}, Shim: shim}, "not an executable"},
		{"missing", Options{Plugins: []string{filepath.Join(dir, "nope")}, Shim: shim}, "no such file"},
		{"same name twice", Options{Plugins: []string{bridge, filepath.Join(copyDir, "bridge")}, Shim: shim}, "already packed"},
		{"library missing", Options{Plugins: []string{bridge}, Shim: shim, LibDirs: []string{dir}}, "needs libc.so.6"},
		{"bad tag", Options{Plugins: []string{bridge}, Shim: shim, Tag: "Not A Tag"}, "tag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := Write(&buf, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written on failure", buf.Len())
			}
		})
	}
}

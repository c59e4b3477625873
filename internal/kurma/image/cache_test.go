package image

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFileFormats: an image given as an OCI layout directory, a docker
// save tar, an OCI layout tar (plain and gzipped) and an ACI (plain and
// gzipped) unpacks to the same tree, with the add/del executables and the
// main exec, under the digest the package doc promises.
func TestFileFormats(t *testing.T) {
	top := t.TempDir()
	es := append(pluginEnts(), dir("bin/"), exe("bin/pause", "pause"), symlink("bin/sh", "/bin/pause"))
	img := mkImage(t, mkTar(t, es...))
	manifest := digestOf(t, img).String()
	cases := []struct {
		name, path string
		format     Format
		digest     string // "" means the file's sha256
		exec       []string
	}{
		{"oci-layout", writeLayout(t, filepath.Join(top, "layout"), img), FormatOCILayout, manifest, []string{"/bin/pause", "net"}},
		{"docker-save", writeDockerSave(t, filepath.Join(top, "docker.tar"), img), FormatDocker, "", []string{"/bin/pause", "net"}},
		{"oci-archive", writeOCIArchive(t, filepath.Join(top, "oci.tar"), img, false), FormatOCIArchive, "", []string{"/bin/pause", "net"}},
		{"oci-archive-gz", writeOCIArchive(t, filepath.Join(top, "oci.tar.gz"), img, true), FormatOCIArchive, "", []string{"/bin/pause", "net"}},
		{"aci", writeACI(t, filepath.Join(top, "p.aci"), es, false), FormatACI, "", []string{"/bin/pause", "aci"}},
		{"aci-gz", writeACI(t, filepath.Join(top, "p.aci.gz"), es, true), FormatACI, "", []string{"/bin/pause", "aci"}},
	}
	cache := newCache(t, Options{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.digest
			if want == "" {
				want = sha256File(t, c.path)
			}
			got, release, err := acquire(t, cache, Source{Image: "file://" + c.path})
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			if got.Digest != want || got.Format != c.format || !slices.Equal(got.MainExec, c.exec) {
				t.Errorf("got %s %s %q, want %s %s %q", got.Digest, got.Format, got.MainExec, want, c.format, c.exec)
			}
			if got.Root != filepath.Join(cache.Dir(), strings.Replace(want, ":", "-", 1), "rootfs") {
				t.Errorf("root %s", got.Root)
			}
			if b, err := os.ReadFile(filepath.Join(got.Root, "opt/network/add")); err != nil || string(b) != "#!/bin/sh\necho add\n" {
				t.Errorf("add: %q %v", b, err)
			}
			// The absolute link is stored relative, so it stays inside.
			if l, err := os.Readlink(filepath.Join(got.Root, "bin/sh")); err != nil || l != "../bin/pause" {
				t.Errorf("bin/sh -> %q %v, want ../bin/pause", l, err)
			}
			if !slices.Contains(got.Env, "PATH=/bin") {
				t.Errorf("env %q", got.Env)
			}
			// The same file again, now with its digest pinned: served from
			// the cache without reading the file.
			again, release2, err := acquire(t, cache, Source{Image: "file://" + c.path, Digest: want})
			if err != nil || again.Root != got.Root {
				t.Fatalf("pinned acquire: %+v %v", again, err)
			}
			release2()
		})
	}
	// A digest that does not match the file is refused.
	other := "sha256:" + strings.Repeat("0", 64)
	if _, _, err := acquire(t, cache, Source{Image: "file://" + cases[1].path, Digest: other}); !errors.Is(err, ErrDigestMismatch) {
		t.Errorf("wrong digest: %v", err)
	}
	if _, _, err := acquire(t, cache, Source{Image: "file://" + cases[0].path, Digest: other}); err == nil || !strings.Contains(err.Error(), "holds no manifest") {
		t.Errorf("wrong digest in a layout: %v", err)
	}
}

// TestWhiteouts: a later layer's .wh.NAME removes NAME and its opaque
// marker hides what lower layers put in its directory, keeping its own.
func TestWhiteouts(t *testing.T) {
	l1 := mkTar(t, append(pluginEnts(), dir("a/"), file("a/x", "1"), file("a/y", "1"), dir("b/"), file("b/z", "1"), dir("b/sub/"), file("b/sub/w", "1"), file("keep", "1"), file("c/d/e", "1"))...)
	l2 := mkTar(t, file("a/.wh.x", ""), file(".wh.c", ""), file("b/new", "2"), file("b/.wh..wh..opq", ""), file(".wh.missing", ""), dir("a/x2/"))
	l3 := mkTar(t, file("a/x", "3")) // re-created after its whiteout
	src := writeLayout(t, filepath.Join(t.TempDir(), "layout"), mkImage(t, l1, l2, l3))
	img, release, err := acquire(t, newCache(t, Options{}), Source{Image: "file://" + src})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var got []string
	filepath.WalkDir(img.Root, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(img.Root, p)
		if !strings.HasPrefix(rel, "opt") && rel != "." {
			got = append(got, rel)
		}
		return nil
	})
	want := []string{"a", "a/x", "a/x2", "a/y", "b", "b/new", "keep"}
	if !slices.Equal(got, want) {
		t.Errorf("tree %q, want %q", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(img.Root, "a/x")); string(b) != "3" {
		t.Errorf("a/x = %q", b)
	}
}

// TestSymlinkTargets: the table of what a link may point at and what is
// stored.
func TestSymlinkTargets(t *testing.T) {
	cases := []struct{ at, target, want string }{
		{"bin/sh", "busybox", "busybox"},
		{"bin/sh", "/bin/busybox", "../bin/busybox"},
		{"sh", "/bin/busybox", "bin/busybox"},
		{"a/b/c", "/", "../.."},
		{"lib64", "usr/lib", "usr/lib"},
		{"usr/lib/x", "../../etc/x", "../../etc/x"},
		{"usr/lib/x", "./../y/./z", "../y/z"},
		{"usr/lib/x", "../../../etc", ""},
		{"x", "..", ""},
		{"a/x", "b/../..", ""},
		{"a/x", "/etc/../..", ""},
		{"a/x", "", ""},
	}
	for _, c := range cases {
		got, err := symlinkTarget(c.at, c.at, c.target)
		if c.want == "" {
			if !errors.Is(err, ErrUnsafeEntry) {
				t.Errorf("%s -> %q: %q %v, want refused", c.at, c.target, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s -> %q: %q %v, want %q", c.at, c.target, got, err, c.want)
		}
	}
}

// TestNotAPlugin: an image without executable add and del is refused and
// not cached.
func TestNotAPlugin(t *testing.T) {
	top := t.TempDir()
	cache := newCache(t, Options{})
	for name, es := range map[string][]ent{
		"no-del":         {exe("opt/network/add", "x")},
		"not-executable": {exe("opt/network/add", "x"), file("opt/network/del", "x")},
		"dir":            {exe("opt/network/add", "x"), dir("opt/network/del/")},
		"dangling-link":  {exe("opt/network/add", "x"), symlink("opt/network/del", "/nowhere")},
	} {
		src := writeLayout(t, filepath.Join(top, name), mkImage(t, mkTar(t, es...)))
		if _, _, err := acquire(t, cache, Source{Image: "file://" + src}); !errors.Is(err, ErrNotPlugin) {
			t.Errorf("%s: %v, want ErrNotPlugin", name, err)
		}
	}
	// A link to an executable inside the image will do.
	src := writeLayout(t, filepath.Join(top, "link"), mkImage(t, mkTar(t, exe("bin/plugin", "x"), symlink("opt/network/add", "/bin/plugin"), symlink("opt/network/del", "../../bin/plugin"))))
	if _, release, err := acquire(t, cache, Source{Image: "file://" + src}); err != nil {
		t.Errorf("links: %v", err)
	} else {
		release()
	}
	if n := len(cacheEntries(t, cache)); n != 1 {
		t.Errorf("cache holds %d entries, want 1", n)
	}
}

// TestHTTP: an http image is verified against its digest before use; a
// wrong digest leaves nothing in the cache; a missing one is a parse error.
func TestHTTP(t *testing.T) {
	top := t.TempDir()
	payload := writeDockerSave(t, filepath.Join(top, "p.tar"), mkImage(t, mkTar(t, pluginEnts()...)))
	var gets int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets++
		http.ServeFile(w, r, payload)
	}))
	defer srv.Close()
	url := srv.URL + "/plugins/p.tar"
	if _, err := Parse(Source{Image: url}); err == nil || !strings.Contains(err.Error(), "needs a digest") {
		t.Errorf("no digest: %v", err)
	}
	cache := newCache(t, Options{})
	wrong := "sha256:" + strings.Repeat("ab", 32)
	if _, _, err := acquire(t, cache, Source{Image: url, Digest: wrong}); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("wrong digest: %v", err)
	}
	if names := cacheEntries(t, cache); len(names) != 0 {
		t.Fatalf("cache holds %v after a refused download", names)
	}
	d := sha256File(t, payload)
	img, release, err := acquire(t, cache, Source{Image: url, Digest: d})
	if err != nil {
		t.Fatal(err)
	}
	release()
	if img.Digest != d || img.Format != FormatDocker {
		t.Errorf("got %s %s", img.Digest, img.Format)
	}
	// Pinned and cached: no second download.
	if _, release, err := acquire(t, cache, Source{Image: url, Digest: d}); err != nil || gets != 2 {
		t.Errorf("second acquire: %v, %d downloads, want 2", err, gets)
	} else {
		release()
	}
	// Over the download cap.
	small := newCache(t, Options{MaxDownload: 100})
	if _, _, err := acquire(t, small, Source{Image: url, Digest: d}); !errors.Is(err, ErrLimit) {
		t.Errorf("over the download cap: %v", err)
	}
}

// TestPruneAndRestart: Prune keeps what is held or in use and removes the
// rest; a new Cache on the same directory (a restart) finds the images.
func TestPruneAndRestart(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "cache")
	cache := newCache(t, Options{Dir: dir})
	var imgs []Image
	var releases []func()
	for i, body := range []string{"1", "2", "3"} {
		src := writeLayout(t, filepath.Join(top, body), mkImage(t, mkTar(t, append(pluginEnts(), file("v", body))...)))
		img, release, err := acquire(t, cache, Source{Image: "file://" + src})
		if err != nil {
			t.Fatal(i, err)
		}
		imgs, releases = append(imgs, img), append(releases, release)
	}
	releases[1]()
	releases[1]() // twice does nothing more
	releases[2]()
	removed, err := cache.Prune(map[string]bool{imgs[2].Digest: true})
	if err != nil || !slices.Equal(removed, []string{imgs[1].Digest}) {
		t.Fatalf("prune: %v %v, want [%s]", removed, err, imgs[1].Digest)
	}
	if _, err := os.Stat(imgs[1].Root); !os.IsNotExist(err) {
		t.Errorf("pruned image still there: %v", err)
	}

	// A restart with a crash's leftovers: a temporary unpack and trash.
	os.MkdirAll(filepath.Join(dir, ".tmp-sha256-"+strings.Repeat("1", 64)+".123/rootfs/x"), 0o755)
	os.MkdirAll(filepath.Join(dir, ".trash-sha256-"+strings.Repeat("2", 64)+".456/rootfs"), 0o755)
	cache2 := newCache(t, Options{Dir: dir})
	names := cacheEntries(t, cache2)
	slices.Sort(names)
	want := []string{keyOf(imgs[0].Digest), keyOf(imgs[2].Digest)}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("after restart the cache holds %v, want %v", names, want)
	}
	img, release, err := cache2.Lookup(imgs[0].Digest)
	if err != nil || img.Root != imgs[0].Root || !slices.Equal(img.MainExec, []string{"/bin/pause", "net"}) {
		t.Fatalf("lookup after restart: %+v %v", img, err)
	}
	if _, _, err := cache2.Lookup(imgs[1].Digest); !errors.Is(err, ErrNotCached) {
		t.Errorf("lookup of a pruned digest: %v", err)
	}
	// The new process holds imgs[0]; the records name neither.
	removed, err = cache2.Prune(nil)
	if err != nil || !slices.Equal(removed, []string{imgs[2].Digest}) {
		t.Errorf("prune after restart: %v %v", removed, err)
	}
	release()
	if removed, err = cache2.Prune(nil); err != nil || len(removed) != 1 {
		t.Errorf("prune after release: %v %v", removed, err)
	}
}

// TestAcquireCancelled: a cancelled fetch leaves nothing behind.
func TestAcquireCancelled(t *testing.T) {
	src := writeLayout(t, filepath.Join(t.TempDir(), "l"), mkImage(t, mkTar(t, pluginEnts()...)))
	cache := newCache(t, Options{})
	ref, err := Parse(Source{Image: "file://" + src})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := cache.Acquire(ctx, ref); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if names := cacheEntries(t, cache); len(names) != 0 {
		t.Errorf("cache holds %v", names)
	}
}

// TestHTTPS: the same over TLS (the server's certificate trusted through
// Options.Transport).
func TestHTTPS(t *testing.T) {
	top := t.TempDir()
	payload := writeACI(t, filepath.Join(top, "p.aci"), pluginEnts(), true)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, payload)
	}))
	defer srv.Close()
	cache := newCache(t, Options{Transport: srv.Client().Transport})
	d := sha256File(t, payload)
	img, release, err := acquire(t, cache, Source{Image: srv.URL + "/p.aci", Digest: d})
	if err != nil {
		t.Fatal(err)
	}
	release()
	if img.Digest != d || img.Format != FormatACI {
		t.Errorf("got %s %s", img.Digest, img.Format)
	}
	// Without trusting the certificate the download fails.
	if _, _, err := acquire(t, newCache(t, Options{}), Source{Image: srv.URL + "/p.aci", Digest: d}); err == nil {
		t.Error("an untrusted certificate was accepted")
	}
}

// TestBadFiles: file references to what is not an image give clear
// errors and leave the cache empty.
func TestBadFiles(t *testing.T) {
	top := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(top, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	os.Mkdir(filepath.Join(top, "emptydir"), 0o755)
	cases := map[string]string{
		filepath.Join(top, "missing"):                                                                    "no such file",
		filepath.Join(top, "emptydir"):                                                                   "not an OCI image layout",
		write("garbage", []byte("this is not a tar"+strings.Repeat(" ", 600))):                           "not a tar",
		write("plain.tar", mkTar(t, file("hello", "x"))):                                                 "neither a docker save tar",
		write("x.tar.xz", []byte("\xfd7zXZ\x00rest")):                                                    "xz compression is not supported",
		write("no-manifest.aci", mkTar(t, file("manifest", `{"acKind":"PodManifest"}`), dir("rootfs/"))): "acKind",
	}
	cache := newCache(t, Options{})
	for p, want := range cases {
		_, _, err := acquire(t, cache, Source{Image: "file://" + p})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", filepath.Base(p), err, want)
		}
	}
	if names := cacheEntries(t, cache); len(names) != 0 {
		t.Errorf("cache holds %v", names)
	}
}

// TestHold: Hold adds a reference only to an image this process holds,
// and that reference alone keeps it from Prune.
func TestHold(t *testing.T) {
	top := t.TempDir()
	cache := newCache(t, Options{Dir: filepath.Join(top, "cache")})
	src := writeLayout(t, filepath.Join(top, "src"), mkImage(t, mkTar(t, pluginEnts()...)))
	img, release, err := acquire(t, cache, Source{Image: "file://" + src})
	if err != nil {
		t.Fatal(err)
	}
	held, ok := cache.Hold(img.Digest)
	if !ok {
		t.Fatal("Hold of an acquired image failed")
	}
	release()
	if removed, err := cache.Prune(nil); err != nil || len(removed) != 0 {
		t.Fatalf("prune with the image held: removed %v, %v", removed, err)
	}
	held()
	if _, ok := cache.Hold(img.Digest); ok {
		t.Error("Hold of an image nothing holds succeeded")
	}
	if removed, err := cache.Prune(nil); err != nil || len(removed) != 1 {
		t.Errorf("prune once released: removed %v, %v; want the image", removed, err)
	}
}

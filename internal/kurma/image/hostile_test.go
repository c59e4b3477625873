package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostileImagesRefused feeds one hostile image per class through the
// public path (file:// OCI layout, and ACI where the class applies) and
// checks that each is refused with the right error, that nothing outside
// the cache changed, and that the cache holds nothing afterwards (the
// temporary directory is gone).
func TestHostileImagesRefused(t *testing.T) {
	// The rootfs being filled is <T>/cache/.tmp-…/rootfs, so from it
	// ../../../outside is <T>/outside.
	const up = "../../../outside"
	type tc struct {
		name   string
		layers func(outside string) [][]ent
		aci    bool // also as an ACI (one layer only)
		opts   Options
		want   error
	}
	one := func(es ...ent) func(string) [][]ent {
		return func(string) [][]ent { return [][]ent{append(pluginEnts(), es...)} }
	}
	cases := []tc{
		{name: "dotdot", layers: one(file(up+"/pwned", "x")), aci: true, want: ErrUnsafeEntry},
		{name: "dotdot-inside", layers: one(file("opt/../../../../outside/pwned", "x")), aci: true, want: ErrUnsafeEntry},
		{name: "absolute", layers: func(o string) [][]ent { return [][]ent{append(pluginEnts(), file(o+"/pwned", "x"))} }, aci: true, want: ErrUnsafeEntry},
		{name: "symlink-escape-then-write", layers: one(symlink("esc", up), file("esc/pwned", "x")), aci: true, want: ErrUnsafeEntry},
		{name: "symlink-dotdot-after-name", layers: one(dir("a/"), symlink("a/self", "."), symlink("a/esc", "self/../../../outside")), aci: true, want: ErrUnsafeEntry},
		{name: "absolute-symlink-then-write", layers: func(o string) [][]ent {
			return [][]ent{append(pluginEnts(), symlink("esc", o)), {file("esc/pwned", "x")}}
		}, want: ErrUnsafeEntry},
		{name: "absolute-symlink-then-write-same-layer", layers: func(o string) [][]ent {
			return [][]ent{append(pluginEnts(), symlink("esc", o), file("esc/pwned", "x"))}
		}, aci: true, want: ErrUnsafeEntry},
		{name: "hardlink-dotdot", layers: one(hardlink("hl", up+"/secret")), aci: true, want: ErrUnsafeEntry},
		{name: "hardlink-absolute", layers: func(o string) [][]ent {
			return [][]ent{append(pluginEnts(), hardlink("hl", o+"/secret"))}
		}, want: ErrUnsafeEntry},
		{name: "hardlink-through-symlink", layers: func(o string) [][]ent {
			return [][]ent{append(pluginEnts(), symlink("esc", o), hardlink("hl", "esc/secret"))}
		}, aci: true, want: ErrUnsafeEntry},
		{name: "hardlink-to-symlink", layers: one(dir("deep/a/b/"), symlink("deep/a/b/l", up), hardlink("esc", "deep/a/b/l")), aci: true, want: ErrUnsafeEntry},
		{name: "char-device", layers: one(ent{name: "dev/mem", typ: tar.TypeChar, mode: 0o666}), aci: true, want: ErrUnsafeEntry},
		{name: "block-device", layers: one(ent{name: "sda", typ: tar.TypeBlock, mode: 0o666}), want: ErrUnsafeEntry},
		{name: "fifo", layers: one(ent{name: "fifo", typ: tar.TypeFifo, mode: 0o666}), aci: true, want: ErrUnsafeEntry},
		{name: "oversize", layers: one(ent{name: "big", typ: tar.TypeReg, mode: 0o644, size: 2 << 20}), aci: true,
			opts: Options{MaxBytes: 1 << 20}, want: ErrLimit},
		{name: "too-many-entries", layers: func(string) [][]ent {
			es := pluginEnts()
			for i := range 30 {
				es = append(es, file("f"+strings.Repeat("x", i), ""))
			}
			return [][]ent{es}
		}, aci: true, opts: Options{MaxEntries: 20}, want: ErrLimit},
		{name: "deep", layers: one(file("a/b/c/d/e/f/g/h/i/j", "x")), aci: true, opts: Options{MaxDepth: 8}, want: ErrLimit},
		// A whiteout's content is read (and skipped) like any other: it
		// counts against the byte cap.
		{name: "big-whiteout", layers: func(string) [][]ent {
			return [][]ent{pluginEnts(), {ent{name: ".wh.x", typ: tar.TypeReg, mode: 0o644, size: 4 << 20}}}
		}, opts: Options{MaxBytes: 1 << 20}, want: ErrLimit},
		{name: "many-whiteouts", layers: func(string) [][]ent {
			var wh []ent
			for i := range 17 {
				wh = append(wh, ent{name: fmt.Sprintf("d/.wh.x%d", i), typ: tar.TypeReg, mode: 0o644, size: 1 << 20})
			}
			return [][]ent{pluginEnts(), wh}
		}, opts: Options{MaxBytes: 8 << 20}, want: ErrLimit},
		{name: "whiteout-dotdot", layers: func(string) [][]ent {
			return [][]ent{pluginEnts(), {file(".wh...", "")}}
		}, want: ErrUnsafeEntry},
		{name: "whiteout-through-symlink", layers: func(o string) [][]ent {
			return [][]ent{append(pluginEnts(), symlink("esc", o)), {file("esc/.wh.secret", "")}}
		}, want: ErrUnsafeEntry},
		{name: "opaque-through-symlink", layers: func(o string) [][]ent {
			return [][]ent{append(pluginEnts(), symlink("esc", o)), {file("esc/.wh..wh..opq", "")}}
		}, want: ErrUnsafeEntry},
	}
	for _, c := range cases {
		formats := []string{"oci"}
		if c.aci {
			formats = append(formats, "aci")
		}
		for _, format := range formats {
			t.Run(c.name+"/"+format, func(t *testing.T) {
				top := t.TempDir()
				outside := filepath.Join(top, "outside")
				if err := os.Mkdir(outside, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("keep"), 0o644); err != nil {
					t.Fatal(err)
				}
				layers := c.layers(outside)
				var src string
				switch format {
				case "oci":
					var tars [][]byte
					for _, l := range layers {
						tars = append(tars, mkTar(t, l...))
					}
					src = writeLayout(t, filepath.Join(top, "layout"), mkImage(t, tars...))
				case "aci":
					if len(layers) != 1 {
						t.Fatal("an aci case has one layer")
					}
					src = writeACI(t, filepath.Join(top, "hostile.aci"), layers[0], true)
				}
				before := snapshot(t, outside)
				topBefore, _ := os.ReadDir(top)
				o := c.opts
				o.Dir = filepath.Join(top, "cache")
				cache := newCache(t, o)

				_, _, err := acquire(t, cache, Source{Image: "file://" + src})
				if !errors.Is(err, c.want) {
					t.Fatalf("acquire: %v, want %v", err, c.want)
				}
				t.Logf("refused: %v", err)
				if after := snapshot(t, outside); after != before {
					t.Errorf("outside changed:\nbefore:\n%s\nafter:\n%s", before, after)
				}
				if names := cacheEntries(t, cache); len(names) != 0 {
					t.Errorf("cache holds %v after a refused image", names)
				}
				topAfter, _ := os.ReadDir(top)
				if len(topAfter) != len(topBefore)+1 { // + the cache dir
					t.Errorf("%s: entries %v, then %v", top, topBefore, topAfter)
				}
			})
		}
	}
}

// TestSetuidStripped: setuid and setgid bits are dropped, the image is
// kept.
func TestSetuidStripped(t *testing.T) {
	top := t.TempDir()
	es := append(pluginEnts(),
		ent{name: "bin/su", typ: tar.TypeReg, body: "x", mode: 0o4755},
		ent{name: "bin/sg", typ: tar.TypeReg, body: "x", mode: 0o2755},
		ent{name: "shared/", typ: tar.TypeDir, mode: 0o2775},
		ent{name: "tmp/", typ: tar.TypeDir, mode: 0o1777})
	for _, format := range []string{"oci", "aci"} {
		t.Run(format, func(t *testing.T) {
			var src string
			if format == "oci" {
				src = writeLayout(t, filepath.Join(top, "layout"), mkImage(t, mkTar(t, es...)))
			} else {
				src = writeACI(t, filepath.Join(top, "x.aci"), es, false)
			}
			img, release, err := acquire(t, newCache(t, Options{}), Source{Image: "file://" + src})
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			for p, want := range map[string]os.FileMode{"bin/su": 0o755, "bin/sg": 0o755, "shared": os.ModeDir | 0o775, "tmp": os.ModeDir | os.ModeSticky | 0o777} {
				fi, err := os.Lstat(filepath.Join(img.Root, p))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != want {
					t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
				}
			}
		})
	}
}

// TestACIBytesOutsideRootfs: an ACI's entries outside rootfs/ (not part of
// the image, but read all the same) and its manifest count against the
// byte cap; a manifest over MaxManifest is refused.
func TestACIBytesOutsideRootfs(t *testing.T) {
	top := t.TempDir()
	es := []ent{file("manifest", `{"acKind":"ImageManifest","name":"x"}`), dir("rootfs/")}
	for _, e := range pluginEnts() {
		e.name = "rootfs/" + e.name
		es = append(es, e)
	}
	for _, c := range []struct {
		name  string
		extra []ent
		opts  Options
	}{
		{"junk", []ent{{name: "junk", typ: tar.TypeReg, mode: 0o644, size: 4 << 20}}, Options{MaxBytes: 1 << 20, MaxDownload: 64 << 20}},
		{"many-junk", []ent{{name: "j1", typ: tar.TypeReg, mode: 0o644, size: 1 << 20}, {name: "j2", typ: tar.TypeReg, mode: 0o644, size: 1 << 20}},
			Options{MaxBytes: 1 << 20, MaxDownload: 64 << 20}},
		{"big-manifest", nil, Options{MaxManifest: 16}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(top, c.name+".aci")
			writeArchive(t, path, mkTar(t, append(append([]ent(nil), es...), c.extra...)...), false)
			cache := newCache(t, c.opts)
			_, _, err := acquire(t, cache, Source{Image: "file://" + path})
			if !errors.Is(err, ErrLimit) {
				t.Fatalf("err %v, want ErrLimit", err)
			}
			t.Logf("refused: %v", err)
			if names := cacheEntries(t, cache); len(names) != 0 {
				t.Errorf("cache holds %v", names)
			}
		})
	}
}

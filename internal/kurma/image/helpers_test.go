package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ent is one tar entry of a test layer.
type ent struct {
	name string
	typ  byte
	body string
	link string
	mode int64
	size int64 // for a regular file with a body of zeros
}

func file(name, body string) ent { return ent{name: name, typ: tar.TypeReg, body: body, mode: 0o644} }
func exe(name, body string) ent  { return ent{name: name, typ: tar.TypeReg, body: body, mode: 0o755} }
func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }

// pluginEnts are the files every plugin image needs.
func pluginEnts() []ent {
	return []ent{dir("opt/"), dir("opt/network/"), exe("opt/network/add", "#!/bin/sh\necho add\n"), exe("opt/network/del", "#!/bin/sh\necho del\n")}
}

func mkTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
			if e.size > 0 {
				h.Size = e.size
			}
		}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if e.size > 0 {
				if _, err := io.CopyN(tw, zeros{}, e.size); err != nil {
					t.Fatal(err)
				}
			} else if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// mkImage builds an image of layers (each a tar) whose entrypoint is
// /bin/pause with argument "net".
func mkImage(t testing.TB, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		b := l
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, v1.Config{Entrypoint: []string{"/bin/pause"}, Cmd: []string{"net"}, Env: []string{"PATH=/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digestOf(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// writeLayout writes img as an OCI layout directory.
func writeLayout(t testing.TB, dir string, img v1.Image) string {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writeDockerSave writes img as a `docker save` tar.
func writeDockerSave(t testing.TB, path string, img v1.Image) string {
	t.Helper()
	tag, err := name.NewTag("skein.test/plugin:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeOCIArchive writes img as a tar (gzipped if gz) of an OCI layout.
func writeOCIArchive(t testing.TB, path string, img v1.Image, gz bool) string {
	t.Helper()
	ldir := writeLayout(t, t.TempDir(), img)
	var ents []ent
	filepath.WalkDir(ldir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(ldir, p)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			ents = append(ents, dir(rel+"/"))
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		ents = append(ents, file(rel, string(b)))
		return nil
	})
	writeArchive(t, path, mkTar(t, ents...), gz)
	return path
}

// writeACI writes an ACI holding ents under rootfs/ and a manifest.
func writeACI(t testing.TB, path string, ents []ent, gz bool) string {
	t.Helper()
	man, _ := json.Marshal(map[string]any{
		"acKind": "ImageManifest", "acVersion": "0.8.11", "name": "skein.test/plugin",
		"app": map[string]any{"exec": []string{"/bin/pause", "aci"}, "user": "0", "group": "0",
			"environment": []map[string]string{{"name": "PATH", "value": "/bin"}}},
	})
	all := []ent{file("manifest", string(man)), dir("rootfs/")}
	for _, e := range ents {
		if strings.HasPrefix(e.name, "/") {
			// An absolute name stays one in the archive.
			all = append(all, e)
			continue
		}
		e.name = "rootfs/" + e.name
		if e.typ == tar.TypeLink {
			e.link = "rootfs/" + e.link
		}
		all = append(all, e)
	}
	writeArchive(t, path, mkTar(t, all...), gz)
	return path
}

func writeArchive(t testing.TB, path string, b []byte, gz bool) {
	t.Helper()
	if gz {
		var buf bytes.Buffer
		z := gzip.NewWriter(&buf)
		z.Write(b)
		z.Close()
		b = buf.Bytes()
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func sha256File(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func newCache(t testing.TB, o Options) *Cache {
	t.Helper()
	if o.Dir == "" {
		o.Dir = filepath.Join(t.TempDir(), "cache")
	}
	c, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func acquire(t testing.TB, c *Cache, src Source) (Image, func(), error) {
	t.Helper()
	ref, err := Parse(src)
	if err != nil {
		t.Fatalf("parse %+v: %v", src, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Acquire(ctx, ref)
}

// cacheEntries lists the names in the cache directory.
func cacheEntries(t testing.TB, c *Cache) []string {
	t.Helper()
	ents, err := os.ReadDir(c.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// snapshot describes every file under dir (path, mode, size, contents,
// mtime), to show that nothing there changed.
func snapshot(t testing.TB, dir string) string {
	t.Helper()
	var lines []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		line := p + " " + fi.Mode().String() + " " + fi.ModTime().String()
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		}
		lines = append(lines, line)
		return nil
	})
	sort.Strings(lines)
	var buf bytes.Buffer
	for _, l := range lines {
		buf.WriteString(l + "\n")
	}
	return buf.String()
}

func readFile(t testing.TB, root, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzApply builds layers of small hostile-minded entries from the fuzz
// input (names and link targets over "a", "b", "..", ".", "/"), applies
// them, and checks the invariants the package doc promises: nothing
// outside the image root changes, and every symlink in an accepted tree
// that resolves at all, followed by the host kernel, resolves inside it.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{2, 0x11, 0x22, 3, 0x13, 0x31, 9, 1, 0x21, 4, 0x12})
	f.Add([]byte{2, 0x05, 0x44, 3, 0x31, 0x05, 9, 0, 0x31})
	// c/c/c -> ../../a, then a hard link "a" to it at the top.
	f.Add([]byte{8, 191, 6, 4, 0, 0, 0})
	// Whiteouts and opaque markers over several layers (their content
	// counts against the byte cap like any entry's).
	f.Add([]byte{1, 0x00, 1, 0x01, 0, 0x05, 7, 0x05, 9, 5, 0x00, 5, 0x01, 6, 0x05, 9, 5, 0x05, 1, 0x00})
	f.Fuzz(func(t *testing.T, in []byte) {
		top := t.TempDir()
		outside := filepath.Join(top, "outside")
		rootDir := filepath.Join(top, "a", "b", "root")
		for _, d := range []string{outside, rootDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.WriteFile(filepath.Join(outside, "secret"), []byte("keep"), 0o644)
		// Decoys above the root, so that a link climbing out resolves to
		// something that exists (a link to nothing cannot be told apart).
		for _, up := range []string{top, filepath.Join(top, "a"), filepath.Join(top, "a", "b")} {
			for _, c := range []string{"a", "b", "c"} {
				os.MkdirAll(filepath.Join(up, c, "a"), 0o755)
				os.WriteFile(filepath.Join(up, c, "f"), nil, 0o644)
			}
		}
		before := snapshot(t, outside)

		layers := fuzzLayers(in)
		root, err := os.OpenRoot(rootDir)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		a := newApplier(root, &limits{maxBytes: 1 << 20, maxEntries: 1000, maxDepth: 16})
		var applyErr error
		for _, l := range layers {
			if applyErr = applyTar(context.Background(), bytes.NewReader(fuzzTar(l)), a, true); applyErr != nil {
				break
			}
		}
		if applyErr == nil {
			applyErr = a.finish()
		}
		if after := snapshot(t, outside); after != before {
			t.Fatalf("outside changed (apply: %v)", applyErr)
		}
		if applyErr != nil {
			return
		}
		filepath.WalkDir(rootDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.Type() != fs.ModeSymlink {
				return nil
			}
			r, ok := resolveHost(p)
			if !ok {
				return nil // a loop
			}
			if r != rootDir && !strings.HasPrefix(r, rootDir+"/") {
				l, _ := os.Readlink(p)
				t.Fatalf("symlink %s -> %q resolves to %s, outside the image", p, l, r)
			}
			return nil
		})
	})
}

// resolveHost resolves p as the host kernel would, following every
// symlink, but carries on lexically past a name that does not exist (a
// link to a missing file outside the image is still a way out). ok is
// false for a loop.
func resolveHost(p string) (string, bool) {
	todo := strings.Split(p, "/")
	cur := "/"
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil || fi.Mode().Type() != fs.ModeSymlink {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", false
		}
		t, err := os.Readlink(next)
		if err != nil {
			return "", false
		}
		if strings.HasPrefix(t, "/") {
			cur = "/"
		}
		todo = append(strings.Split(t, "/"), todo...)
	}
	return cur, true
}

// fuzzLayers decodes the input: an operation byte, then its argument
// bytes (a name; for links also a target); op 9 starts a new layer. A
// hard link targets one of the names made so far.
func fuzzLayers(in []byte) [][]ent {
	comps := []string{"a", "b", "..", ".", "", "c"}
	pathOf := func(x byte) string {
		var parts []string
		for i := 0; i < int(x>>6)+1; i++ {
			parts = append(parts, comps[int(x>>(i*2))%len(comps)])
		}
		if p := strings.Join(parts, "/"); p != "" {
			return p
		}
		return "a"
	}
	layers := [][]ent{nil}
	var names []string
	next := func() byte {
		if len(in) == 0 {
			return 0
		}
		b := in[0]
		in = in[1:]
		return b
	}
	for len(in) > 0 {
		op := next() % 10
		n := pathOf(next())
		cur := &layers[len(layers)-1]
		switch op {
		case 0:
			*cur = append(*cur, dir(n))
		case 1:
			*cur = append(*cur, file(n, "x"))
		case 2:
			*cur = append(*cur, symlink(n, pathOf(next())))
		case 3:
			*cur = append(*cur, symlink(n, "/"+pathOf(next())))
		case 4:
			t := pathOf(next())
			if len(names) > 0 {
				t = names[int(next())%len(names)]
			}
			*cur = append(*cur, hardlink(n, t))
		case 5:
			*cur = append(*cur, file(filepath.Join(filepath.Dir(n), whiteoutPrefix+filepath.Base(n)), ""))
		case 6:
			*cur = append(*cur, file(filepath.Join(n, opaqueMarker), ""))
		case 7:
			*cur = append(*cur, file(n+"/f", "y"))
		case 8:
			x := next()
			*cur = append(*cur, symlink(n, strings.Repeat("../", int(x%4))+pathOf(x)))
		case 9:
			layers = append(layers, nil)
		}
		names = append(names, n)
	}
	return layers
}

// fuzzTar writes the entries the tar writer accepts and skips the rest.
func fuzzTar(ents []ent) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if tw.WriteHeader(h) != nil {
			continue
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

// TestResolveHostCatchesRelocatedLink: the fuzz check sees the escape a
// hard link to a symlink would make (the attack the applier refuses).
func TestResolveHostCatchesRelocatedLink(t *testing.T) {
	top := t.TempDir()
	root := filepath.Join(top, "r")
	os.MkdirAll(filepath.Join(root, "a/b"), 0o755)
	os.Symlink("../../x", filepath.Join(root, "a/b/l"))
	os.Link(filepath.Join(root, "a/b/l"), filepath.Join(root, "esc"))
	if r, ok := resolveHost(filepath.Join(root, "a/b/l")); !ok || r != filepath.Join(root, "x") {
		t.Errorf("a/b/l resolves to %s %v", r, ok)
	}
	if r, ok := resolveHost(filepath.Join(root, "esc")); !ok || r != filepath.Join(filepath.Dir(top), "x") {
		t.Errorf("esc resolves to %s %v, want %s", r, ok, filepath.Join(filepath.Dir(top), "x"))
	}
}

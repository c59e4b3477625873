package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// zeroMember is one gzip member of 1 MiB of zeros: repeated, it makes a
// stream of any size of zeros from a small file (gzip readers read
// concatenated members as one stream).
var zeroMember = func() []byte {
	var b bytes.Buffer
	z, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	z.Write(make([]byte, 1<<20))
	z.Close()
	return b.Bytes()
}()

// bombArchive is a gzipped tar: the entries before, then an entry of
// mib MiB of zeros (hdr), then the entries after; a few MiB on disk.
func bombArchive(t testing.TB, before []ent, hdr tar.Header, mib int, after []ent) []byte {
	t.Helper()
	member := func(b []byte) []byte {
		var out bytes.Buffer
		z := gzip.NewWriter(&out)
		z.Write(b)
		z.Close()
		return out.Bytes()
	}
	var head bytes.Buffer
	tw := tar.NewWriter(&head)
	writeEnts(t, tw, before)
	hdr.Size = int64(mib) << 20
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(&hdr); err != nil {
		t.Fatal(err)
	}
	// The head's writer is left with the body unwritten: its bytes so far
	// are the headers.
	var tail bytes.Buffer
	tw2 := tar.NewWriter(&tail)
	writeEnts(t, tw2, after)
	if err := tw2.Close(); err != nil {
		t.Fatal(err)
	}
	out := member(head.Bytes())
	for range mib {
		out = append(out, zeroMember...)
	}
	return append(out, member(tail.Bytes())...)
}

func writeEnts(t testing.TB, tw *tar.Writer, ents []ent) {
	t.Helper()
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
}

// peakRSS resets the process's peak resident size (clear_refs 5) and
// returns a function that reports how far it rose since.
func peakRSS(t testing.TB) func() int64 {
	t.Helper()
	hwm := func() int64 {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
		t.Fatal("no VmHWM in /proc/self/status")
		return 0
	}
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("reset the peak RSS (/proc/self/clear_refs): %v", err)
	}
	start := hwm()
	return func() int64 { return hwm() - start }
}

// TestConfigBombRefused: a docker save archive of about 1 MiB whose
// config is 1 GiB of zeros (manifest.json names it, last as docker writes
// it) is refused for its config's size, within seconds, and the process's
// peak RSS does not grow by more than 64 MiB on the way (go-containerregistry
// reads a config whole: it used to grow by over 2 GiB).
func TestConfigBombRefused(t *testing.T) {
	layer := mkTar(t, pluginEnts()...)
	man, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{"skein.test/bomb:1"}, "Layers": []string{"layer.tar"}}})
	b := bombArchive(t, nil, tar.Header{Name: "config.json", Typeflag: tar.TypeReg, Mode: 0o644}, 1024,
		[]ent{file("layer.tar", string(layer)), file("manifest.json", string(man))})
	path := filepath.Join(t.TempDir(), "bomb.tar.gz")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cache := newCache(t, Options{})
	grew := peakRSS(t)
	start := time.Now()
	_, _, err := acquire(t, cache, Source{Image: "file://" + path})
	took := time.Since(start)
	rss := grew()
	t.Logf("a %d KiB archive with a 1 GiB config: %v after %v, peak RSS +%d MiB", len(b)>>10, err, took.Round(time.Millisecond), rss>>20)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "config") {
		t.Errorf("err %v, want ErrLimit for the config", err)
	}
	if rss > 64<<20 {
		t.Errorf("peak RSS grew by %d MiB", rss>>20)
	}
	if took > 30*time.Second {
		t.Errorf("took %v", took)
	}
	if names := cacheEntries(t, cache); len(names) != 0 {
		t.Errorf("cache holds %v", names)
	}
}

// TestScanBombRefused: an ACI whose first entry is 1 GiB of zeros, far
// over MaxDownload, is refused while its format is still being detected,
// after reading about MaxDownload (plus 1 KiB per allowed entry).
func TestScanBombRefused(t *testing.T) {
	b := bombArchive(t, nil, tar.Header{Name: "junk", Typeflag: tar.TypeReg, Mode: 0o644}, 1024,
		append([]ent{file("manifest", `{"acKind":"ImageManifest"}`)}, pluginEnts()...))
	path := filepath.Join(t.TempDir(), "bomb.aci.gz")
	os.WriteFile(path, b, 0o644)
	cache := newCache(t, Options{MaxBytes: 1 << 20, MaxDownload: 4 << 20, MaxEntries: 1000})
	start := time.Now()
	_, _, err := acquire(t, cache, Source{Image: "file://" + path})
	took := time.Since(start)
	t.Logf("refused after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, ErrLimit) {
		t.Errorf("err %v, want ErrLimit", err)
	}
	if took > 2*time.Second {
		t.Errorf("took %v: the whole stream was read", took)
	}
}

// TestManifestBombRefused: a registry whose manifest is an endless
// stream of JSON whitespace is refused once the manifest passes
// MaxManifest (go-containerregistry alone reads up to 100 MiB).
func TestManifestBombRefused(t *testing.T) {
	var served int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/manifests/") {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		chunk := bytes.Repeat([]byte(" "), 64<<10)
		for served < 256<<20 {
			n, err := w.Write(chunk)
			served += int64(n)
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	cache := newCache(t, Options{MaxManifest: 1 << 20})
	_, _, err := acquire(t, cache, Source{Image: "docker://" + host + "/skein/bomb@sha256:" + strings.Repeat("a", 64)})
	t.Logf("refused after the server sent %d MiB: %v", served>>20, err)
	if !errors.Is(err, ErrLimit) {
		t.Errorf("err %v, want ErrLimit", err)
	}
}

// TestCancelWithinEntry: cancelling an unpack stops it inside one huge
// entry (1 GiB of zeros in an OCI layer), not at the next entry.
func TestCancelWithinEntry(t *testing.T) {
	layer := bombArchive(t, pluginEnts(), tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644}, 1024, nil)
	src := writeLayout(t, filepath.Join(t.TempDir(), "layout"), mkImage(t, layer))
	cache := newCache(t, Options{MaxBytes: 4 << 30})
	ref, err := Parse(Source{Image: "file://" + src})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	_, _, err = cache.Acquire(ctx, ref)
	took := time.Since(start)
	t.Logf("cancelled after 300ms; returned after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err %v, want context.Canceled", err)
	}
	if took > 1300*time.Millisecond {
		t.Errorf("returned %v after the cancel", took-300*time.Millisecond)
	}
	if names := cacheEntries(t, cache); len(names) != 0 {
		t.Errorf("cache holds %v", names)
	}
}

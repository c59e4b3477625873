package image

import (
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// testRegistry is go-containerregistry's in-process registry on
// 127.0.0.1, counting the blob downloads.
type testRegistry struct {
	host     string
	blobGets atomic.Int64
}

func startRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r := &testRegistry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
			r.blobGets.Add(1)
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func push(t testing.TB, ref string, img v1.Image) v1.Hash {
	t.Helper()
	n, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(n, img); err != nil {
		t.Fatal(err)
	}
	return digestOf(t, img)
}

// TestRegistry: docker:// references to a registry on 127.0.0.1, pinned,
// by tag (refused, then allowed), and pinned through the digest field.
func TestRegistry(t *testing.T) {
	reg := startRegistry(t)
	img := mkImage(t, mkTar(t, append(pluginEnts(), file("v", "1"))...))
	d := push(t, reg.host+"/skein/plugin:v1", img)
	repo := "docker://" + reg.host + "/skein/plugin"
	cache := newCache(t, Options{})

	got, release, err := acquire(t, cache, Source{Image: repo + "@" + d.String()})
	if err != nil {
		t.Fatal(err)
	}
	release()
	if got.Digest != d.String() || got.Format != FormatRegistry || !slices.Equal(got.MainExec, []string{"/bin/pause", "net"}) {
		t.Errorf("got %+v", got)
	}

	for _, tagged := range []string{repo + ":v1", repo} {
		if _, err := Parse(Source{Image: tagged}); !errors.Is(err, ErrTagNotAllowed) {
			t.Errorf("%s without allowTags: %v", tagged, err)
		}
	}
	got2, release, err := acquire(t, cache, Source{Image: repo + ":v1", AllowTags: true})
	if err != nil || got2.Digest != d.String() || got2.Root != got.Root {
		t.Fatalf("by tag: %+v %v", got2, err)
	}
	release()
	got3, release, err := acquire(t, cache, Source{Image: repo + ":v1", Digest: d.String()})
	if err != nil || got3.Root != got.Root {
		t.Fatalf("tag pinned by the digest field: %+v %v", got3, err)
	}
	release()

	missing := "sha256:" + strings.Repeat("0", 64)
	if _, _, err := acquire(t, cache, Source{Image: repo + "@" + missing}); err == nil {
		t.Error("a digest the registry does not have was accepted")
	}
	if _, err := Parse(Source{Image: repo + "@" + d.String(), Digest: missing}); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("conflicting digests: %v", err)
	}
}

// TestRegistryIndex: a multi-platform index resolves to this platform's
// image; the cache key is the index digest the reference pins.
func TestRegistryIndex(t *testing.T) {
	reg := startRegistry(t)
	mine := mkImage(t, mkTar(t, append(pluginEnts(), file("arch", runtime.GOARCH))...))
	other := mkImage(t, mkTar(t, append(pluginEnts(), file("arch", "other"))...))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}})
	n, _ := name.ParseReference(reg.host + "/skein/multi:v1")
	if err := remote.WriteIndex(n, idx); err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	img, release, err := acquire(t, newCache(t, Options{}), Source{Image: "docker://" + reg.host + "/skein/multi@" + d.String()})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if img.Digest != d.String() {
		t.Errorf("digest %s, want %s", img.Digest, d)
	}
	if b := readFile(t, img.Root, "arch"); b != runtime.GOARCH {
		t.Errorf("unpacked the %q image", b)
	}
}

// TestConcurrentAcquireUnpacksOnce: many callers of one digest share one
// fetch: the layer is downloaded once and all get the same root.
func TestConcurrentAcquireUnpacksOnce(t *testing.T) {
	reg := startRegistry(t)
	img := mkImage(t, mkTar(t, append(pluginEnts(), ent{name: "blob", typ: '0', mode: 0o644, size: 4 << 20})...))
	d := push(t, reg.host+"/skein/plugin:v1", img)
	reg.blobGets.Store(0)
	cache := newCache(t, Options{})
	src := Source{Image: "docker://" + reg.host + "/skein/plugin@" + d.String()}
	const n = 16
	roots := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			img, release, err := acquire(t, cache, src)
			if err != nil {
				t.Error(err)
				return
			}
			defer release()
			roots[i] = img.Root
		})
	}
	wg.Wait()
	// One config blob and one layer blob.
	if got := reg.blobGets.Load(); got != 2 {
		t.Errorf("%d blob downloads for %d concurrent acquires, want 2", got, n)
	}
	for _, r := range roots {
		if r != roots[0] {
			t.Errorf("roots differ: %q", roots)
			break
		}
	}
	if names := cacheEntries(t, cache); len(names) != 1 {
		t.Errorf("cache holds %v", names)
	}
}

// TestHTTPGuard: plain http goes only to loopback registries unless
// Insecure is set; nothing is sent when refused.
func TestHTTPGuard(t *testing.T) {
	var sent []string
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = append(sent, r.URL.String())
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	cases := []struct {
		url      string
		insecure bool
		ok       bool
	}{
		{"http://127.0.0.1:5000/v2/", false, true},
		{"http://127.3.4.5:5000/v2/", false, true},
		{"http://localhost:5000/v2/", false, true},
		{"http://[::1]:5000/v2/", false, true},
		{"https://10.1.2.3:5000/v2/", false, true},
		{"http://10.1.2.3:5000/v2/", false, false},
		{"http://registry.local/v2/", false, false},
		{"http://registry.example/v2/", false, false},
		{"http://10.1.2.3:5000/v2/", true, true},
	}
	for _, c := range cases {
		sent = nil
		req, _ := http.NewRequest(http.MethodGet, c.url, nil)
		_, err := httpGuard{next: next, insecure: c.insecure}.RoundTrip(req)
		if c.ok != (err == nil) || c.ok != (len(sent) == 1) {
			t.Errorf("%s insecure=%v: err %v, sent %q", c.url, c.insecure, err, sent)
		}
		if !c.ok && !errors.Is(err, ErrInsecure) {
			t.Errorf("%s: %v, want ErrInsecure", c.url, err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

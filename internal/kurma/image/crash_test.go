package image

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// TestCrashDuringUnpack kills (SIGKILL) a process in the middle of
// unpacking an image, with files of the image already written, and checks
// that no image is visible under its digest, that opening the cache again
// removes the remains, and that the image then unpacks whole.
func TestCrashDuringUnpack(t *testing.T) {
	if env := os.Getenv("SKEIN_IMAGE_CRASH_CHILD"); env != "" {
		crashChild(env)
		return
	}
	// 64 files of 64 KiB; the layer is served up to about its middle,
	// then the server stalls.
	var es []ent
	for i := range 64 {
		es = append(es, file(fmt.Sprintf("data/f%02d", i), strings.Repeat(string(rune('a'+i%26)), 64<<10)))
	}
	img := mkImage(t, mkTar(t, append(pluginEnts(), es...)...))
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	stall := make(chan struct{})
	var once sync.Once
	unstall := func() { once.Do(func() { close(stall) }) }
	defer unstall()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var stallOn atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stallOn.Load() && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, ld.String()) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			b := rec.Body.Bytes()
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.WriteHeader(http.StatusOK)
			w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			select {
			case <-stall:
			case <-r.Context().Done():
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	d := push(t, host+"/skein/plugin:v1", img)
	stallOn.Store(true)
	src := "docker://" + host + "/skein/plugin@" + d.String()
	dir := filepath.Join(t.TempDir(), "cache")

	child := exec.Command(os.Args[0], "-test.run=^TestCrashDuringUnpack$", "-test.count=1")
	child.Env = append(os.Environ(), "SKEIN_IMAGE_CRASH_CHILD="+dir+"|"+src)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the child has written part of the image.
	deadline := time.Now().Add(20 * time.Second)
	var written int
	for time.Now().Before(deadline) && written < 10 {
		m, _ := filepath.Glob(filepath.Join(dir, ".tmp-*", "rootfs", "data", "*"))
		written = len(m)
		time.Sleep(10 * time.Millisecond)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	unstall()
	if written < 10 {
		t.Fatalf("the child wrote %d files before the deadline", written)
	}
	t.Logf("killed the unpacking process after %d of 64 files", written)
	names, _ := os.ReadDir(dir)
	for _, n := range names {
		if !strings.HasPrefix(n.Name(), ".tmp-") {
			t.Errorf("after the crash the cache shows %s", n.Name())
		}
	}
	cache := newCache(t, Options{Dir: dir})
	if left := cacheEntries(t, cache); len(left) != 0 {
		t.Errorf("open left %v", left)
	}
	if _, _, err := cache.Lookup(d.String()); err == nil {
		t.Error("a half image is visible")
	}
	stallOn.Store(false)
	got, release, err := acquire(t, cache, Source{Image: src})
	if err != nil {
		t.Fatal(err)
	}
	release()
	if m, _ := filepath.Glob(filepath.Join(got.Root, "data", "*")); len(m) != 64 {
		t.Errorf("after the crash the image has %d of 64 files", len(m))
	}
}

// crashChild acquires the image and never returns normally: the parent
// kills it.
func crashChild(env string) {
	dir, src, _ := strings.Cut(env, "|")
	c, err := Open(Options{Dir: dir})
	if err != nil {
		os.Exit(2)
	}
	ref, err := Parse(Source{Image: src})
	if err != nil {
		os.Exit(2)
	}
	c.Acquire(context.Background(), ref)
	os.Exit(3)
}

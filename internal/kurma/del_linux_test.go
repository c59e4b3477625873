package kurma_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/skeinnet/skein/internal/kurma"
)

// TestDelNeverFetches: a pod attached to a network whose image comes
// from a registry; the registry then stalls (it answers nothing, ever)
// and the unpacked image is lost from the cache. The pod's detach ends at
// once with an error saying the image is gone (its record stays, marked
// del-failed): it neither asks the registry nor waits on it. It used to
// fetch the image again, without a deadline, and hang.
func TestDelNeverFetches(t *testing.T) {
	needRoot(t)
	var stalled atomic.Bool
	var askedWhileStalled atomic.Int64
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stalled.Load() {
			askedWhileStalled.Add(1)
			<-r.Context().Done()
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	defer stalled.Store(false)
	host := strings.TrimPrefix(srv.URL, "http://")
	p, err := layout.FromPath(strings.TrimPrefix(pluginImage, "file://"))
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := p.ImageIndex()
	im, _ := idx.IndexManifest()
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/skein/plugin:v1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	w := newWorld(t, `[{"name":"reg","image":"docker://`+host+`/skein/plugin@`+d.String()+`","type":"test","mode":"ok","addr":"10.1.0.5/24","timeout":"8s","containerInterface":"net0"}]`)
	ns := w.pod()
	ctx := context.Background()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: uuid1, NetNS: ns.Path(), Networks: sel("reg")}); err != nil {
		t.Fatal(err)
	}

	stalled.Store(true)
	if err := os.RemoveAll(filepath.Join(w.cfg.StateDir, "images", "sha256-"+d.Hex)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.pods.Detach(ctx, uuid1) }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("detach still running after 20 s (the network's timeout is 8 s)")
	}
	t.Logf("detach after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if !errors.Is(err, kurma.ErrImageGone) {
		t.Errorf("err %v, want ErrImageGone", err)
	}
	if n := askedWhileStalled.Load(); n > 0 {
		t.Errorf("the detach asked the registry %d times", n)
	}
	st, serr := w.pods.Status(ctx, uuid1)
	if serr != nil || len(st.Attachments) != 1 || st.Attachments[0].State != kurma.StateDelFailed {
		t.Errorf("record after the failed del: %+v, %v", st, serr)
	}
}

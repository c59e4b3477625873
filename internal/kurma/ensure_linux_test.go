package kurma_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/test/harness"
)

// TestConcurrentFirstAttachStartsOnce: eight pods attach at once to a
// network whose main exec is not running yet; exactly one main exec is
// started, and it stays up.
func TestConcurrentFirstAttachStartsOnce(t *testing.T) {
	w := newWorld(t, `[{"name":"served","image":"%MAINIMG%","type":"test","mode":"ok","addr":"10.4.0.5/24","containerInterface":"eth0"}]`)
	ctx := context.Background()
	const n = 8
	nss := make([]*harness.NS, n)
	for i := range nss {
		nss[i] = w.pod()
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: fmt.Sprintf("pod-%d", i), NetNS: nss[i].Path(), Networks: sel("served")}); err != nil {
				t.Errorf("pod %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if got := strings.Count(w.log.String(), `msg="main exec started" frontdoor=pods network=served`); got != 1 {
		t.Errorf("%d main execs started for %d concurrent first attaches, want 1", got, n)
	}
	if got := mainExecs(t); got != 1 {
		t.Errorf("%d main execs running, want 1", got)
	}
	for i := range n {
		if err := w.pods.Detach(ctx, fmt.Sprintf("pod-%d", i)); err != nil {
			t.Fatal(err)
		}
		w.assertNothingLeft(fmt.Sprintf("pod-%d", i), nss[i])
	}
}

// TestReloadDuringAttach: an attach planned before a reload (held up
// fetching an earlier network's image from a server that answers only when
// told) goes on after the reload changed a network with a main exec and
// another pod started the new config's main exec; that main exec stays
// up, and it is the only one.
func TestReloadDuringAttach(t *testing.T) {
	archive := pluginACI(t)
	asked := make(chan struct{}, 1)
	answer := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case asked <- struct{}{}:
		default:
		}
		select {
		case <-answer:
		case <-r.Context().Done():
			return
		}
		rw.Write(archive)
	}))
	defer srv.Close()
	sum := sha256.Sum256(archive)
	slow := fmt.Sprintf(`{"name":"slow","image":"%s/plugin.aci","digest":"sha256:%s","type":"test","mode":"ok","addr":"10.6.0.5/24","containerInterface":"eth1"}`,
		srv.URL, hex.EncodeToString(sum[:]))
	served := func(addr string) string {
		return `{"name":"served","image":"%MAINIMG%","type":"test","mode":"ok","addr":"` + addr + `","containerInterface":"eth0"}`
	}
	w := newWorld(t, "["+slow+","+served("10.4.0.5/24")+"]")
	ctx := context.Background()

	// Pod A is planned with the first config and waits for slow's image.
	a := w.pod()
	aDone := make(chan error, 1)
	go func() {
		_, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: "pod-a", NetNS: a.Path(), Networks: sel("slow", "served")})
		aDone <- err
	}()
	select {
	case <-asked:
	case err := <-aDone:
		t.Fatalf("attach of pod A did not wait for the image: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the image server was never asked")
	}

	// The reload changes served; pod B starts the new config's main exec.
	w.cfg.PodNetworks = netsJSON("[" + slow + "," + served("10.4.0.6/24") + "]")
	if err := w.d.ReloadPodNetworks(w.cfg); err != nil {
		t.Fatal(err)
	}
	b := w.pod()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: "pod-b", NetNS: b.Path(), Networks: sel("served")}); err != nil {
		t.Fatal(err)
	}
	if got := mainExecs(t); got != 1 {
		t.Fatalf("%d main execs after pod B's attach, want 1", got)
	}

	// Pod A goes on with the config it was planned with.
	close(answer)
	if err := <-aDone; err != nil {
		t.Fatalf("attach of pod A: %v", err)
	}
	if got := mainExecs(t); got != 1 {
		t.Errorf("%d main execs after pod A's attach, want 1 (the new config's)", got)
	}
	st, err := w.pods.Status(ctx, "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range st.Attachments {
		if at.Network == "served" && !strings.Contains(string(at.Config), "10.4.0.5/24") {
			t.Errorf("pod A's served was added with %s, want the config it was planned with", at.Config)
		}
	}
	// The new main exec still serves: a third pod attaches, nothing
	// restarts.
	c := w.pod()
	if _, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: "pod-c", NetNS: c.Path(), Networks: sel("served")}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(w.log.String(), `msg="main exec started" frontdoor=pods network=served`); got != 1 {
		t.Errorf("%d main execs started in all, want 1", got)
	}
	for id, ns := range map[string]*harness.NS{"pod-a": a, "pod-b": b, "pod-c": c} {
		if err := w.pods.Detach(ctx, id); err != nil {
			t.Fatal(err)
		}
		w.assertNothingLeft(id, ns)
	}
}

// pluginACI is the test plugin as an ACI archive (for http images).
func pluginACI(t *testing.T) []byte {
	t.Helper()
	needRoot(t)
	bin, err := os.ReadFile(pluginBin)
	if err != nil {
		t.Fatal(err)
	}
	man, _ := json.Marshal(map[string]any{"acKind": "ImageManifest", "acVersion": "0.8.11", "name": "skein.test/plugin"})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "manifest", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(man))})
	tw.Write(man)
	for _, d := range []string{"rootfs/", "rootfs/opt/", "rootfs/opt/network/", "rootfs/var/", "rootfs/var/lib/", "rootfs/var/lib/network/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	for _, f := range []string{"rootfs/opt/network/add", "rootfs/opt/network/del"} {
		tw.WriteHeader(&tar.Header{Name: f, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))})
		tw.Write(bin)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

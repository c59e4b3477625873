package image

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// startDistribution runs Debian's docker-registry (distribution 2.8) on a
// free 127.0.0.1 port with a config of its own: no auth, storage in a
// temporary directory. It returns host:port.
func startDistribution(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Skip("docker-registry is not installed (Debian package docker-registry); skipping the real-registry test")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config.yml")
	err = os.WriteFile(conf, []byte(fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "data"), addr)), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "serve", conf)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("docker-registry output:\n%s", logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("docker-registry on %s did not come up: %v\n%s", addr, err, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestDistributionRegistry: the real distribution registry serves a
// two-layer image (with a whiteout) by digest, and by tag only when tags
// are allowed.
func TestDistributionRegistry(t *testing.T) {
	host := startDistribution(t)
	l1 := mkTar(t, append(pluginEnts(), file("etc/old", "x"), file("etc/keep", "k"))...)
	l2 := mkTar(t, file("etc/.wh.old", ""), exe("bin/pause", "p"))
	img := mkImage(t, l1, l2)
	d := push(t, host+"/skein/plugin:v1", img)
	repo := "docker://" + host + "/skein/plugin"
	cache := newCache(t, Options{})

	got, release, err := acquire(t, cache, Source{Image: repo + "@" + d.String()})
	if err != nil {
		t.Fatal(err)
	}
	release()
	if got.Digest != d.String() || !slices.Equal(got.MainExec, []string{"/bin/pause", "net"}) {
		t.Errorf("got %+v", got)
	}
	if _, err := os.Lstat(filepath.Join(got.Root, "etc/old")); !os.IsNotExist(err) {
		t.Errorf("whited-out etc/old: %v", err)
	}
	if readFile(t, got.Root, "etc/keep") != "k" {
		t.Error("etc/keep lost")
	}
	if _, err := Parse(Source{Image: repo + ":v1"}); err == nil {
		t.Error("a tag was accepted without allowTags")
	}
	byTag, release, err := acquire(t, cache, Source{Image: repo + ":v1", AllowTags: true})
	if err != nil || byTag.Digest != d.String() {
		t.Fatalf("by tag: %+v %v", byTag, err)
	}
	release()
	if _, _, err := acquire(t, cache, Source{Image: repo + ":nope", AllowTags: true}); err == nil {
		t.Error("a missing tag was accepted")
	}
}

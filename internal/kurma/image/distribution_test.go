package image

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/skeinnet/skein/test/skeintest"
)

// TestDistributionRegistry: the real distribution registry serves a
// two-layer image (with a whiteout) by digest, and by tag only when tags
// are allowed.
func TestDistributionRegistry(t *testing.T) {
	host := skeintest.StartRegistry(t)
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

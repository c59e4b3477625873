package kubelet

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/skeinnet/skein/test/skeintest"
)

// The images the nodes have, all made here: nothing is pulled.
const (
	// SkeinImage is what deploy/kubernetes runs (make image's tag).
	SkeinImage = "skein:dev"
	// PauseImage is every pod's sandbox container (containerd's
	// sandbox_image): test/kubelet/pause.
	PauseImage = "skein.test/pause:1"
	// BusyboxImage is for test pods: busybox with every applet, PATH=/bin.
	BusyboxImage = "skein.test/busybox:1"
)

// images writes the three images as tarballs into dir and returns their
// paths: skein's by hack/mkimage from the built binaries, pause and
// busybox by this package.
func images(t testing.TB, dir, binDir, moduleRoot string) []string {
	t.Helper()
	skein := filepath.Join(dir, "skein-image.tar")
	cmd := exec.Command("go", "run", "./hack/mkimage", "-bin", binDir, "-out", skein, "-tag", SkeinImage)
	cmd.Dir = moduleRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make the skein image: %v\n%s", err, out)
	}

	pauseBin := filepath.Join(dir, "pause")
	cmd = exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", pauseBin, "./test/kubelet/pause")
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	pauseData, err := os.ReadFile(pauseBin)
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "pause", Mode: 0o755, Size: int64(len(pauseData))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(pauseData); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	pause := filepath.Join(dir, "pause-image.tar")
	if err := writeImage(pause, PauseImage, layer.Bytes(), v1.Config{Entrypoint: []string{"/pause"}}); err != nil {
		t.Fatal(err)
	}

	busybox := filepath.Join(dir, "busybox-image.tar")
	if err := writeImage(busybox, BusyboxImage, skeintest.BusyboxTar(t), v1.Config{
		Env: []string{"PATH=/bin"},
		Cmd: []string{"sh"},
	}); err != nil {
		t.Fatal(err)
	}
	return []string{skein, pause, busybox}
}

// writeImage writes an image of one layer (an uncompressed tar) with cfg
// as a tarball `ctr images import` reads.
func writeImage(out, ref string, layerTar []byte, cfg v1.Config) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if err := tarball.WriteToFile(out, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return nil
}

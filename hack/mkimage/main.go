// Command mkimage builds skein's container image without a container
// engine: one layer holding the static binaries under /usr/local/bin, on
// nothing (the Dockerfile's FROM scratch), written as an image tarball
// that `docker load`, `podman load`, `ctr images import` and
// `kind load image-archive` read. `make image` runs it; the Dockerfile
// builds the same image for those who have an engine.
//
// The image is reproducible: files are owned by root, dated
// SOURCE_DATE_EPOCH (else the epoch), and listed in a fixed order, so the
// same binaries give the same image digest.
package main

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Binaries are what the image holds: the daemons, the CLI, the CNI
// plugins and their installer, the Egress router (deploy/kubernetes and
// skein-controller run each of them).
var Binaries = []string{"skeind", "skein-controller", "skeinctl", "skein", "skein-cni", "skein-vm", "skein-vmwrapper", "skein-install", "skein-egress", "skein-sandbox-exec"}

// Dir is where the binaries are in the image.
const Dir = "/usr/local/bin"

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin", "bin", "directory of the built binaries (make build)")
	flag.StringVar(&o.out, "out", "bin/skein-image.tar", "image tarball to write")
	flag.StringVar(&o.tag, "tag", "skein:dev", "image name and tag")
	flag.StringVar(&o.arch, "arch", runtime.GOARCH, "architecture the binaries are built for")
	flag.StringVar(&o.version, "version", "", "org.opencontainers.image.version label")
	bins := flag.String("binaries", strings.Join(Binaries, ","), "comma-separated binaries to include")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mkimage: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	o.binaries = strings.Split(*bins, ",")
	o.mtime = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mkimage: invalid SOURCE_DATE_EPOCH %q: want seconds since 1970\n", s)
			os.Exit(2)
		}
		o.mtime = time.Unix(sec, 0).UTC()
	}
	digest, err := build(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %s\n", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s: %s %s\n", o.out, o.tag, digest)
}

type options struct {
	binDir, out, tag, arch, version string
	binaries                        []string
	mtime                           time.Time
}

// build writes the image tarball and returns the image's digest. On an
// error nothing is left at o.out.
func build(o options) (v1.Hash, error) {
	ref, err := name.NewTag(o.tag)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("invalid --tag %q: %w", o.tag, err)
	}
	// Every binary is checked before anything is written.
	for _, b := range o.binaries {
		if err := checkStatic(o.binDir, b); err != nil {
			return v1.Hash{}, err
		}
	}
	layerFile, err := os.CreateTemp(filepath.Dir(o.out), ".layer-*.tar")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write the layer: %w", err)
	}
	defer os.Remove(layerFile.Name())
	err = writeLayer(layerFile, o.binDir, o.binaries, o.mtime)
	if cerr := layerFile.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write the layer: %w", err)
	}
	layer, err := tarball.LayerFromFile(layerFile.Name())
	if err != nil {
		return v1.Hash{}, fmt.Errorf("read the layer back: %w", err)
	}
	img, err := image(layer, o)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("digest the image: %w", err)
	}
	// Written beside the destination, renamed over it when complete.
	tmp := o.out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("write %s: %w", o.out, err)
	}
	if err := os.Rename(tmp, o.out); err != nil {
		os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("write %s: %w", o.out, err)
	}
	return digest, nil
}

// image is layer on nothing, with the configuration the Dockerfile gives.
func image(layer v1.Layer, o options) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("add the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read the image configuration: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", o.arch
	cf.Created = v1.Time{Time: o.mtime}
	cf.Config.Env = []string{"PATH=" + Dir}
	// skeind is the default; the manifests name each component's binary.
	cf.Config.Entrypoint = []string{path.Join(Dir, "skeind")}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":  "skein",
		"org.opencontainers.image.source": "https://github.com/skeinnet/skein",
	}
	if o.version != "" {
		cf.Config.Labels["org.opencontainers.image.version"] = o.version
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set the image configuration: %w", err)
	}
	return img, nil
}

// checkStatic refuses a binary that is missing, not a file, or not a
// static ELF executable: an image FROM scratch has no dynamic loader or
// libc, so a binary linked against them would not start.
func checkStatic(dir, bin string) error {
	if bin == "" || strings.ContainsRune(bin, '/') {
		return fmt.Errorf("invalid binary name %q: want a file name in %s", bin, dir)
	}
	p := filepath.Join(dir, bin)
	f, err := elf.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: not built (run make build)", p)
		}
		return fmt.Errorf("%s: not an ELF executable: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: an image FROM scratch has no libc; build it with CGO_ENABLED=0 (make build does)", p)
		}
	}
	return nil
}

// writeLayer writes the layer's tar: /var/run as a link to /run, the
// directories down to Dir, then each binary, root-owned, mode 0755, dated
// mtime. Runtimes name pods' network namespaces by /var/run/netns/…
// (containerd, CRI-O) or /run/netns/… (podman) paths, and the DaemonSet
// mounts the host's directory once, at /run/netns: with the link both
// resolve, as on the host, where /var/run is the same link.
func writeLayer(w io.Writer, binDir string, bins []string, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "run/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX},
		{Typeflag: tar.TypeDir, Name: "var/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX},
		{Typeflag: tar.TypeSymlink, Name: "var/run", Linkname: "../run", Mode: 0o777, ModTime: mtime, Format: tar.FormatPAX},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	dir := ""
	for _, part := range strings.Split(strings.Trim(Dir, "/"), "/") {
		dir = path.Join(dir, part)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, b := range bins {
		if err := addFile(tw, filepath.Join(binDir, b), path.Join(dir, b), mtime); err != nil {
			return err
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, src, name string, mtime time.Time) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: fi.Size(), Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

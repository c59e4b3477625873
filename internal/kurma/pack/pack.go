package pack

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/skeinnet/skein/internal/kurma/image"
)

// ShimName is the shim's binary name, looked for beside skeinctl.
const ShimName = "skein-netplugin"

// DefaultTag names the image inside the archive.
const DefaultTag = "skein.dev/cni-netplugin:latest"

// PluginsLabel lists the packed plugins' names (comma-separated) in the
// image config.
const PluginsLabel = image.CNIPluginsLabel

// Paths inside the image.
const (
	AddPath   = "/opt/network/add"
	DelPath   = "/opt/network/del"
	PluginDir = "/opt/cni/bin"
	StateDir  = "/var/lib/network"
	CNIState  = "/var/lib/cni"
)

// Options say what to pack. Plugins and Shim are required.
type Options struct {
	// Plugins are host paths of CNI plugin executables; each is packed as
	// /opt/cni/bin/<base name>, which is the `type` a config names.
	Plugins []string
	// Shim is the host path of a statically linked skein-netplugin.
	Shim string
	// Tag names the image in the archive. Default DefaultTag.
	Tag string
	// LibDirs replace the default library search directories (the loader's:
	// /lib/<tuple>, /usr/lib/<tuple>, /lib64, /usr/lib64, /lib, /usr/lib).
	LibDirs []string
	// SysRoot, when set, is the directory libraries are read from instead
	// of / (their image paths stay the same).
	SysRoot string
}

// file is one regular file of the image.
type file struct {
	host string // read from here
	link string // or: a hard link to this image path
}

// Build returns the image. It reads every input; nothing is written.
func Build(o Options) (v1.Image, error) {
	files, plugins, arch, err := o.collect()
	if err != nil {
		return nil, err
	}
	layerTar, err := layer(files)
	if err != nil {
		return nil, err
	}
	l := static.NewLayer(layerTar, types.OCIUncompressedLayer)

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   l,
		History: v1.History{CreatedBy: "skeinctl image pack-cni", Created: v1.Time{Time: time.Unix(0, 0).UTC()}},
	})
	if err != nil {
		return nil, fmt.Errorf("add layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	// GOMAXPROCS=1: the shim and the plugins (Go programs, three per add
	// with host-local) live for milliseconds; starting one scheduler thread
	// per CPU only slows their start.
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GOMAXPROCS=1"}
	cf.Config.Labels = map[string]string{PluginsLabel: strings.Join(plugins, ",")}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// Write builds the image and writes it to w as a `docker save` archive.
func Write(w io.Writer, o Options) (v1.Image, error) {
	img, err := Build(o)
	if err != nil {
		return nil, err
	}
	tag := o.Tag
	if tag == "" {
		tag = DefaultTag
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return nil, fmt.Errorf("image tag %q: %w", tag, err)
	}
	if err := tarball.Write(ref, img, w); err != nil {
		return nil, fmt.Errorf("write image archive: %w", err)
	}
	return img, nil
}

// collect checks the inputs and lists the image's files by image path. It
// returns the plugin names, sorted, and the image's architecture.
func (o Options) collect() (map[string]file, []string, string, error) {
	if o.Shim == "" {
		return nil, nil, "", fmt.Errorf("no shim: give the path of %s", ShimName)
	}
	if len(o.Plugins) == 0 {
		return nil, nil, "", fmt.Errorf("no plugins to pack")
	}
	shim, err := readExecutable(o.Shim)
	if err != nil {
		return nil, nil, "", fmt.Errorf("shim: %w", err)
	}
	if shim.interp != "" || len(shim.needed) > 0 {
		return nil, nil, "", fmt.Errorf("shim %s is dynamically linked (interpreter %q); build it with CGO_ENABLED=0", o.Shim, shim.interp)
	}
	files := map[string]file{
		AddPath: {host: o.Shim},
		DelPath: {link: AddPath},
	}
	arch := shim.arch
	var names []string
	libs := map[string]string{}
	for _, p := range o.Plugins {
		n := filepath.Base(p)
		if n == "." || n == "/" || n == "" {
			return nil, nil, "", fmt.Errorf("plugin %q: not a file name", p)
		}
		dst := path.Join(PluginDir, n)
		if _, dup := files[dst]; dup {
			return nil, nil, "", fmt.Errorf("plugin %q: a plugin named %q is already packed", p, n)
		}
		b, err := readExecutable(p)
		if err != nil {
			return nil, nil, "", fmt.Errorf("plugin: %w", err)
		}
		if b.arch != arch {
			return nil, nil, "", fmt.Errorf("plugin %s is %s, the shim %s", p, b.arch, arch)
		}
		if err := o.resolveLibs(b, p, libs); err != nil {
			return nil, nil, "", fmt.Errorf("plugin: %w", err)
		}
		files[dst] = file{host: p}
		names = append(names, n)
	}
	for img, host := range libs {
		if f, ok := files[img]; ok && f.host != host {
			return nil, nil, "", fmt.Errorf("library %s collides with %s", img, f.host)
		}
		files[img] = file{host: host}
	}
	sort.Strings(names)
	return files, names, arch, nil
}

// readExecutable checks p is an executable regular file and reads it.
func readExecutable(p string) (binary, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return binary{}, err // names the path
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return binary{}, fmt.Errorf("%s is not an executable file", p)
	}
	return readBinary(p)
}

// epoch is every entry's time: the archive depends on content only.
var epoch = time.Unix(0, 0).UTC()

// layer writes the layer tar: the directories, then the files, each in
// sorted order, owned by root, dated epoch.
func layer(files map[string]file) ([]byte, error) {
	dirs := map[string]bool{
		"/opt/network": true, PluginDir: true, StateDir: true,
		"/proc": true, "/sys": true, "/dev": true, "/tmp": true, "/run": true,
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		for d = path.Dir(d); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		return tw.WriteHeader(h)
	}
	for _, d := range dirList {
		if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	// The state link: /var/lib/cni → network (relative, so it means the
	// same inside the sandbox's root and in the unpacked cache).
	if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: CNIState[1:], Linkname: path.Base(StateDir), Mode: 0o777}); err != nil {
		return nil, err
	}
	// Hard links after their targets.
	sort.SliceStable(paths, func(i, j int) bool { return files[paths[i]].link == "" && files[paths[j]].link != "" })
	for _, p := range paths {
		f := files[p]
		if f.link != "" {
			if err := hdr(&tar.Header{Typeflag: tar.TypeLink, Name: p[1:], Linkname: f.link[1:], Mode: 0o755}); err != nil {
				return nil, err
			}
			continue
		}
		b, err := os.ReadFile(f.host)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f.host, err)
		}
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: p[1:], Size: int64(len(b)), Mode: 0o755}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

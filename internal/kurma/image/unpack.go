package image

import (
	"archive/tar"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Format is the kind of image a reference led to.
type Format string

// The formats of images.
const (
	FormatRegistry   Format = "registry"       // docker:// from an OCI registry
	FormatOCILayout  Format = "oci-layout"     // an OCI image layout directory
	FormatOCIArchive Format = "oci-archive"    // a tar of an OCI image layout
	FormatDocker     Format = "docker-archive" // a `docker save` tar
	FormatACI        Format = "aci"            // an appc image
)

// meta is what meta.json beside an unpacked rootfs records.
type meta struct {
	Digest     string   `json:"digest"`
	Format     Format   `json:"format"`
	Source     string   `json:"source"`
	MainExec   []string `json:"mainExec,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	CNIPlugins []string `json:"cniPlugins,omitempty"`
	Bytes      int64    `json:"bytes"`
	Entries    int      `json:"entries"`
}

// applyImage applies the layers of an OCI or Docker image in order and
// returns what its config says about the main exec.
// check bounds the config before it is read.
func applyImage(ctx context.Context, img v1.Image, a *applier, check sizeCheck) (meta, error) {
	man, err := img.Manifest()
	if err != nil {
		return meta{}, fmt.Errorf("read image manifest: %w", err)
	}
	if err := check.check("image config", man.Config); err != nil {
		return meta{}, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return meta{}, fmt.Errorf("read image config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return meta{}, fmt.Errorf("list image layers: %w", err)
	}
	for i, l := range layers {
		if err := applyLayer(ctx, l, a); err != nil {
			return meta{}, fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
	}
	m := meta{}
	if cfg != nil {
		m.MainExec = append(append([]string(nil), cfg.Config.Entrypoint...), cfg.Config.Cmd...)
		m.Env = cfg.Config.Env
		m.WorkingDir = cfg.Config.WorkingDir
		m.CNIPlugins = cniPlugins(cfg.Config.Labels[CNIPluginsLabel])
	}
	return m, nil
}

// CNIPluginsLabel is the image label of `skeinctl image pack-cni`'s
// images: the names of the CNI plugins packed under /opt/cni/bin,
// comma-separated.
const CNIPluginsLabel = "dev.skein.cni-plugins"

// maxCNIPlugins bounds the names read from CNIPluginsLabel.
const maxCNIPlugins = 64

// cniPlugins parses a CNIPluginsLabel value: plain file names only; a
// label with anything else (a path, an empty name, too many) is ignored
// whole, and the image is then called through its /opt/network
// executables like any other.
func cniPlugins(label string) []string {
	if label == "" {
		return nil
	}
	names := strings.Split(label, ",")
	if len(names) > maxCNIPlugins {
		return nil
	}
	for _, n := range names {
		if !validPluginName(n) {
			return nil
		}
	}
	return names
}

// validPluginName: what CNI allows as a plugin type that is a file in
// CNI_PATH, and nothing that leaves the directory.
func validPluginName(n string) bool {
	if n == "" || len(n) > 128 || n == "." || n == ".." {
		return false
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

func applyLayer(ctx context.Context, l v1.Layer, a *applier) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	r := &capReader{r: ctxReader{ctx, rc}, left: a.lim.streamLeft, what: "decompressed layers"}
	defer func() { a.lim.streamLeft = r.left }()
	if err := applyTar(ctx, r, a, true); err != nil {
		return err
	}
	// Read to the end so that the layer's digest is checked (a registry
	// layer is verified when its stream reaches EOF); what follows the tar
	// end is bounded by the byte cap.
	n, err := io.CopyN(io.Discard, r, a.lim.maxBytes-a.lim.bytes+1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("verify layer: %w", err)
	}
	if n > a.lim.maxBytes-a.lim.bytes {
		return fmt.Errorf("trailing data after the tar: %w", ErrLimit)
	}
	return nil
}

// applyTar applies every entry of one tar stream.
func applyTar(ctx context.Context, r io.Reader, a *applier, whiteouts bool) error {
	a.startLayer(whiteouts)
	tr := tar.NewReader(ctxReader{ctx, r})
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := a.entry(hdr.Name, hdr, tr); err != nil {
			return err
		}
	}
}

// aciManifest is the part of an appc image manifest used here.
type aciManifest struct {
	ACKind string `json:"acKind"`
	Name   string `json:"name"`
	App    *struct {
		Exec        []string `json:"exec"`
		Environment []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"environment"`
		WorkingDirectory string `json:"workingDirectory"`
	} `json:"app"`
	Dependencies []json.RawMessage `json:"dependencies"`
}

// applyACI unpacks an ACI: a "manifest" file and a "rootfs" tree.
func applyACI(ctx context.Context, r io.Reader, a *applier) (meta, error) {
	a.startLayer(false)
	a.linkPrefix = "rootfs/"
	defer func() { a.linkPrefix = "" }()
	tr := tar.NewReader(ctxReader{ctx, r})
	var man *aciManifest
	for {
		if err := ctx.Err(); err != nil {
			return meta{}, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return meta{}, fmt.Errorf("read aci: %w", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			if err := a.entry("", hdr, tr); err != nil { // counted, skipped
				return meta{}, err
			}
			continue
		}
		p, err := cleanName(hdr.Name)
		if err != nil {
			return meta{}, err
		}
		switch {
		case p == "manifest":
			if err := a.lim.charge(hdr.Name, hdr.Size); err != nil {
				return meta{}, err
			}
			if hdr.Size > a.lim.maxMeta {
				return meta{}, fmt.Errorf("aci manifest: %d bytes, over %d: %w", hdr.Size, a.lim.maxMeta, ErrLimit)
			}
			man = new(aciManifest)
			if err := json.NewDecoder(io.LimitReader(tr, a.lim.maxMeta)).Decode(man); err != nil {
				return meta{}, fmt.Errorf("parse aci manifest: %w", err)
			}
		case p == "rootfs":
			if err := a.lim.charge(hdr.Name, hdr.Size); err != nil {
				return meta{}, err
			}
		case strings.HasPrefix(p, "rootfs/"):
			if err := a.entry(strings.TrimPrefix(p, "rootfs/"), hdr, tr); err != nil {
				return meta{}, err
			}
		default:
			// Anything else is not part of the image's file system, but
			// is read all the same.
			a.lim.entries++
			if a.lim.entries > a.lim.maxEntries {
				return meta{}, fmt.Errorf("more than %d entries: %w", a.lim.maxEntries, ErrLimit)
			}
			if err := a.lim.charge(hdr.Name, hdr.Size); err != nil {
				return meta{}, err
			}
		}
	}
	if man == nil {
		return meta{}, errors.New("aci has no manifest")
	}
	if man.ACKind != "ImageManifest" {
		return meta{}, fmt.Errorf("aci manifest: acKind %q, want ImageManifest", man.ACKind)
	}
	if len(man.Dependencies) > 0 {
		return meta{}, fmt.Errorf("aci %q has dependencies, which are not supported", man.Name)
	}
	m := meta{}
	if man.App != nil {
		m.MainExec = man.App.Exec
		m.WorkingDir = man.App.WorkingDirectory
		for _, e := range man.App.Environment {
			m.Env = append(m.Env, e.Name+"="+e.Value)
		}
	}
	return m, nil
}

// pickImage chooses the image of an index: the one whose digest is want
// (an image, or an index resolved for this platform), else the only one
// for this platform.
// Each manifest and index is bounded by check before it is read.
func pickImage(idx v1.ImageIndex, want v1.Hash, where string, check sizeCheck) (v1.Image, v1.Hash, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("%s: read index: %w", where, err)
	}
	type cand struct {
		img v1.Image
		d   v1.Hash
	}
	var cands []cand
	for _, desc := range im.Manifests {
		switch {
		case want.Hex != "" && desc.Digest != want:
		case desc.MediaType.IsImage():
			if want.Hex == "" && !platformOK(desc.Platform) {
				continue
			}
			if err := check.check(where+": manifest", desc); err != nil {
				return nil, v1.Hash{}, err
			}
			img, err := idx.Image(desc.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("%s: image %s: %w", where, desc.Digest, err)
			}
			cands = append(cands, cand{img, desc.Digest})
		case desc.MediaType.IsIndex():
			if err := check.check(where+": index", desc); err != nil {
				return nil, v1.Hash{}, err
			}
			child, err := idx.ImageIndex(desc.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("%s: index %s: %w", where, desc.Digest, err)
			}
			img, d, err := pickImage(child, v1.Hash{}, where, check)
			if err != nil {
				return nil, v1.Hash{}, err
			}
			if want.Hex != "" {
				d = want
			}
			cands = append(cands, cand{img, d})
		}
	}
	switch {
	case len(cands) == 1:
		return cands[0].img, cands[0].d, nil
	case want.Hex != "":
		return nil, v1.Hash{}, fmt.Errorf("%s: holds no manifest %s", where, want)
	case len(cands) == 0:
		return nil, v1.Hash{}, fmt.Errorf("%s: holds no image for linux/%s", where, runtime.GOARCH)
	default:
		return nil, v1.Hash{}, fmt.Errorf("%s: holds %d images; choose one with the digest field", where, len(cands))
	}
}

func platformOK(p *v1.Platform) bool {
	return p == nil || (p.OS == "" || p.OS == "linux") && (p.Architecture == "" || p.Architecture == runtime.GOARCH)
}

// openDecompressed opens an archive, undoing gzip or bzip2.
func openDecompressed(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var magic [6]byte
	n, _ := io.ReadFull(f, magic[:])
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	switch m := magic[:n]; {
	case len(m) >= 2 && m[0] == 0x1f && m[1] == 0x8b:
		z, err := gzip.NewReader(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return readCloser{z, f}, nil
	case len(m) >= 3 && string(m[:3]) == "BZh":
		return readCloser{bzip2.NewReader(f), f}, nil
	case len(m) >= 6 && string(m) == "\xfd7zXZ\x00":
		f.Close()
		return nil, errors.New("xz compression is not supported (use gzip or bzip2)")
	case len(m) >= 4 && string(m[:4]) == "\x28\xb5\x2f\xfd":
		f.Close()
		return nil, errors.New("zstd compression is not supported (use gzip or bzip2)")
	}
	return f, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

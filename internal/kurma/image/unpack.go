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
	Bytes      int64    `json:"bytes"`
	Entries    int      `json:"entries"`
}

// applyImage applies the layers of an OCI or Docker image in order and
// returns what its config says about the main exec.
func applyImage(ctx context.Context, img v1.Image, a *applier) (meta, error) {
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
	}
	return m, nil
}

func applyLayer(ctx context.Context, l v1.Layer, a *applier) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := applyTar(ctx, rc, a, true); err != nil {
		return err
	}
	// Read to the end so that the layer's digest is checked (a registry
	// layer is verified when its stream reaches EOF); what follows the tar
	// end is bounded by the byte cap.
	n, err := io.CopyN(io.Discard, rc, a.lim.maxBytes-a.lim.bytes+1)
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
	tr := tar.NewReader(r)
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
	tr := tar.NewReader(r)
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
			man = new(aciManifest)
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(man); err != nil {
				return meta{}, fmt.Errorf("parse aci manifest: %w", err)
			}
		case p == "rootfs":
		case strings.HasPrefix(p, "rootfs/"):
			if err := a.entry(strings.TrimPrefix(p, "rootfs/"), hdr, tr); err != nil {
				return meta{}, err
			}
		default:
			// Anything else is not part of the image's file system.
			a.lim.entries++
			if a.lim.entries > a.lim.maxEntries {
				return meta{}, fmt.Errorf("more than %d entries: %w", a.lim.maxEntries, ErrLimit)
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
func pickImage(idx v1.ImageIndex, want v1.Hash, where string) (v1.Image, v1.Hash, error) {
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
			img, err := idx.Image(desc.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("%s: image %s: %w", where, desc.Digest, err)
			}
			cands = append(cands, cand{img, desc.Digest})
		case desc.MediaType.IsIndex():
			child, err := idx.ImageIndex(desc.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("%s: index %s: %w", where, desc.Digest, err)
			}
			img, d, err := pickImage(child, v1.Hash{}, where)
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

// detect reads an archive's entry names to tell its format.
func detect(path string, maxEntries int) (Format, error) {
	rc, err := openDecompressed(path)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var docker, ociLayout, ociIndex, aciMan, aciRoot bool
	for n := 0; ; n++ {
		if n > maxEntries {
			return "", fmt.Errorf("more than %d entries: %w", maxEntries, ErrLimit)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("read archive (not a tar?): %w", err)
		}
		p := strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), "/")
		switch {
		case p == "manifest.json":
			docker = true
		case p == "oci-layout":
			ociLayout = true
		case p == "index.json":
			ociIndex = true
		case p == "manifest":
			aciMan = true
		case p == "rootfs" || strings.HasPrefix(p, "rootfs/"):
			aciRoot = true
		}
		// Stop at the first sure sign: the formats' marker files never
		// appear together in archives made by their tools, except that
		// Docker 25+ writes an OCI layout and manifest.json in one tar,
		// which both readers accept.
		switch {
		case docker:
			return FormatDocker, nil
		case ociLayout && ociIndex:
			return FormatOCIArchive, nil
		case aciMan && aciRoot:
			return FormatACI, nil
		}
	}
	return "", errors.New("archive is neither a docker save tar, an OCI layout tar nor an ACI")
}

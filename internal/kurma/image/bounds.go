package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Everything an image is read from is bounded before it is read: the
// archive's bytes (copyIn), its decompressed stream (capReader), each
// entry's size and their count (limits), and every manifest, index and
// config, which go-containerregistry reads whole into memory, by its
// declared size and, where it is a file, its real size (sizeCheck,
// scanArchive), before it is read. Every stream checks the context
// between reads (ctxReader), so a cancel stops within an entry.

// ctxReader fails its reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// capReader fails with ErrLimit once more than left bytes were read.
type capReader struct {
	r    io.Reader
	left int64
	what string
}

func (r *capReader) Read(p []byte) (int, error) {
	if r.left < 0 {
		return 0, fmt.Errorf("%s: %w", r.what, ErrLimit)
	}
	if int64(len(p)) > r.left+1 {
		p = p[:r.left+1]
	}
	n, err := r.r.Read(p)
	r.left -= int64(n)
	if r.left < 0 {
		return n, fmt.Errorf("%s: %w", r.what, ErrLimit)
	}
	return n, err
}

// sizeCheck checks a manifest's, index's or config's descriptor before
// go-containerregistry reads the blob it names: its declared size is
// within max and, for an image layout (dir set), the blob file is a
// regular file of that size.
type sizeCheck struct {
	max int64
	dir string
}

func (c sizeCheck) check(what string, d v1.Descriptor) error {
	if d.Size < 0 || d.Size > c.max {
		return fmt.Errorf("%s %s: %d bytes, over %d: %w", what, d.Digest, d.Size, c.max, ErrLimit)
	}
	if len(d.Data) > 0 || c.dir == "" {
		return nil
	}
	if _, err := ParseDigest(d.Digest.String()); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	fi, err := os.Lstat(filepath.Join(c.dir, "blobs", d.Digest.Algorithm, d.Digest.Hex))
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, d.Digest, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() != d.Size {
		return fmt.Errorf("%s %s: blob is a %s of %d bytes, its descriptor says %d", what, d.Digest, kindOf(fi), fi.Size(), d.Size)
	}
	return nil
}

// layoutIndexFile checks an image layout's index.json before it is read.
func (c sizeCheck) layoutIndexFile() error {
	fi, err := os.Lstat(filepath.Join(c.dir, "index.json"))
	if err != nil {
		return fmt.Errorf("not an OCI image layout: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Size() > c.max {
		return fmt.Errorf("index.json: a %s of %d bytes (at most %d): %w", kindOf(fi), fi.Size(), c.max, ErrLimit)
	}
	return nil
}

func kindOf(fi os.FileInfo) string {
	if fi.Mode().IsRegular() {
		return "file"
	}
	return kind(fi)
}

// manifestCap limits the body of every registry manifest response (a
// manifest or an index) to max bytes; go-containerregistry would read up
// to 100 MiB.
type manifestCap struct {
	next http.RoundTripper
	max  int64
}

func (m manifestCap) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := m.next.RoundTrip(req)
	if err != nil || !strings.Contains(req.URL.Path, "/manifests/") {
		return resp, err
	}
	if resp.ContentLength > m.max {
		resp.Body.Close()
		return nil, fmt.Errorf("manifest %s: %d bytes, over %d: %w", req.URL.Redacted(), resp.ContentLength, m.max, ErrLimit)
	}
	resp.Body = readCloser{&capReader{r: resp.Body, left: m.max, what: "manifest " + req.URL.Redacted()}, resp.Body}
	return resp, nil
}

// archiveEntry is what a scan keeps of an archive entry.
type archiveEntry struct {
	size     int64
	typeflag byte
	link     string
}

// scan is what scanArchive learned.
type scan struct {
	format Format
	// entries by cleaned name, the first of each name (as
	// go-containerregistry's tarball reader finds them).
	entries map[string]archiveEntry
	// dockerManifest is manifest.json, when within the cap.
	dockerManifest []byte
}

// scanArchive reads an archive's entry headers to tell its format, with
// the archive's caps: its decompressed bytes (maxStream), its entries,
// and manifest.json's size (maxMeta).
func scanArchive(ctx context.Context, file string, maxStream int64, maxEntries int, maxMeta int64) (scan, error) {
	rc, err := openDecompressed(file)
	if err != nil {
		return scan{}, err
	}
	defer rc.Close()
	tr := tar.NewReader(&capReader{r: ctxReader{ctx, rc}, left: maxStream, what: "decompressed archive"})
	s := scan{entries: map[string]archiveEntry{}}
	var docker, ociLayout, ociIndex, aciMan, aciRoot bool
	for n := 0; ; n++ {
		if n > maxEntries {
			return scan{}, fmt.Errorf("more than %d entries: %w", maxEntries, ErrLimit)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, ErrLimit) || ctx.Err() != nil {
				return scan{}, err
			}
			return scan{}, fmt.Errorf("read archive (not a tar?): %w", err)
		}
		p := strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), "/")
		clean := path.Clean(hdr.Name)
		if _, seen := s.entries[clean]; !seen {
			s.entries[clean] = archiveEntry{size: hdr.Size, typeflag: hdr.Typeflag, link: hdr.Linkname}
		}
		switch {
		case p == "manifest.json":
			docker = true
			if s.dockerManifest == nil && hdr.Size <= maxMeta {
				if s.dockerManifest, err = io.ReadAll(io.LimitReader(tr, maxMeta)); err != nil {
					return scan{}, fmt.Errorf("read manifest.json: %w", err)
				}
			}
		case p == "oci-layout":
			ociLayout = true
		case p == "index.json":
			ociIndex = true
		case p == "manifest":
			aciMan = true
		case p == "rootfs" || strings.HasPrefix(p, "rootfs/"):
			aciRoot = true
		}
	}
	// The formats' marker files never appear together in archives made by
	// their tools, except that Docker 25+ writes an OCI layout and
	// manifest.json in one tar, which both readers accept.
	switch {
	case docker:
		s.format = FormatDocker
	case ociLayout && ociIndex:
		s.format = FormatOCIArchive
	case aciMan && aciRoot:
		s.format = FormatACI
	default:
		return scan{}, errors.New("archive is neither a docker save tar, an OCI layout tar nor an ACI")
	}
	return s, nil
}

// checkDocker checks, before go-containerregistry reads them whole, that
// a docker save archive's manifest.json and the config it names are within
// max bytes.
func (s scan) checkDocker(max int64) error {
	e, ok := s.entries["manifest.json"]
	if !ok || s.dockerManifest == nil {
		return fmt.Errorf("manifest.json: %d bytes, over %d: %w", e.size, max, ErrLimit)
	}
	var man []struct {
		Config string `json:"Config"`
	}
	if err := json.Unmarshal(s.dockerManifest, &man); err != nil {
		return fmt.Errorf("parse manifest.json: %w", err)
	}
	if len(man) != 1 {
		return fmt.Errorf("manifest.json lists %d images, want 1", len(man))
	}
	name := path.Clean(man[0].Config)
	// The reader follows links (at most as many as there are entries).
	for hops := 0; ; hops++ {
		e, ok := s.entries[name]
		switch {
		case !ok:
			return fmt.Errorf("config %q is not in the archive", man[0].Config)
		case hops > len(s.entries):
			return fmt.Errorf("config %q: link loop", man[0].Config)
		case e.typeflag == tar.TypeSymlink || e.typeflag == tar.TypeLink:
			name = path.Join(path.Dir(name), path.Clean(e.link))
			continue
		case e.size > max:
			return fmt.Errorf("config %q: %d bytes, over %d: %w", man[0].Config, e.size, max, ErrLimit)
		}
		return nil
	}
}

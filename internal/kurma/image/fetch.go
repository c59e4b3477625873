package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ErrDigestMismatch is wrapped by the error for content whose digest is
// not the one the reference pinned.
var ErrDigestMismatch = errors.New("digest mismatch")

// unpackFunc writes an image into a.root; tmp is a scratch directory of
// the same file system that is removed afterwards.
type unpackFunc func(ctx context.Context, tmp string, a *applier) (meta, error)

// resolved is a reference whose digest is known, and how to unpack it.
type resolved struct {
	digest v1.Hash
	format Format
	unpack unpackFunc
}

// resolve finds a reference's digest, fetching only what that takes: for
// a pinned reference nothing, for a file archive its bytes (hashed), for a
// layout directory its index, for a registry tag one manifest request.
func (c *Cache) resolve(ctx context.Context, ref Ref) (resolved, error) {
	switch ref.Scheme {
	case SchemeFile:
		return c.resolveFile(ref)
	case SchemeHTTP:
		return resolved{digest: ref.Digest, unpack: c.unpackHTTP(ref)}, nil
	case SchemeDocker:
		return c.resolveDocker(ctx, ref)
	}
	return resolved{}, fmt.Errorf("image %q: reference not parsed", ref.Original)
}

func (c *Cache) resolveFile(ref Ref) (resolved, error) {
	fi, err := os.Stat(ref.Path)
	if err != nil {
		return resolved{}, fmt.Errorf("image %q: %w", ref.Original, err)
	}
	if fi.IsDir() {
		check := sizeCheck{max: c.o.MaxManifest, dir: ref.Path}
		if err := check.layoutIndexFile(); err != nil {
			return resolved{}, fmt.Errorf("image %q: %w", ref.Original, err)
		}
		p, err := layout.FromPath(ref.Path)
		if err != nil {
			return resolved{}, fmt.Errorf("image %q: not an OCI image layout: %w", ref.Original, err)
		}
		idx, err := p.ImageIndex()
		if err != nil {
			return resolved{}, fmt.Errorf("image %q: %w", ref.Original, err)
		}
		img, d, err := pickImage(idx, ref.Digest, "image "+ref.String(), check)
		if err != nil {
			return resolved{}, err
		}
		return resolved{digest: d, format: FormatOCILayout, unpack: func(ctx context.Context, _ string, a *applier) (meta, error) {
			return applyImage(ctx, img, a, check)
		}}, nil
	}
	// The archive is hashed again as it is copied into the unpack's own
	// directory, and unpacked from that copy: what is unpacked is what was
	// hashed, whatever happens to the file meanwhile. A pinned digest
	// needs no hashing before that; an unpinned one is the cache key, so
	// it is taken first and the copy must match it.
	d := ref.Digest
	if !ref.Pinned() {
		if d, err = fileDigest(ref.Path, c.o.MaxDownload); err != nil {
			return resolved{}, fmt.Errorf("image %q: %w", ref.Original, err)
		}
	}
	return resolved{digest: d, unpack: func(ctx context.Context, tmp string, a *applier) (meta, error) {
		f, err := os.Open(ref.Path)
		if err != nil {
			return meta{}, err
		}
		defer f.Close()
		payload := filepath.Join(tmp, "payload")
		if err := c.copyIn(ctx, f, payload, d); err != nil {
			return meta{}, err
		}
		defer os.Remove(payload)
		return c.unpackArchive(ctx, payload, tmp, a)
	}}, nil
}

// fileDigest hashes a file of at most max bytes.
func fileDigest(path string, max int64) (v1.Hash, error) {
	f, err := os.Open(path)
	if err != nil {
		return v1.Hash{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, max+1))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("hash %s: %w", path, err)
	}
	if n > max {
		return v1.Hash{}, fmt.Errorf("hash %s: passes %d bytes: %w", path, max, ErrLimit)
	}
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}, nil
}

// copyIn copies at most MaxDownload bytes of src to a new file dst,
// hashing them, and checks the hash against want.
func (c *Cache) copyIn(ctx context.Context, src io.Reader, dst string, want v1.Hash) error {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, src}, c.o.MaxDownload+1))
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if n > c.o.MaxDownload {
		return fmt.Errorf("passes %d bytes: %w", c.o.MaxDownload, ErrLimit)
	}
	if got := (v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}); got != want {
		return fmt.Errorf("content has %s, want %s: %w", got, want, ErrDigestMismatch)
	}
	return f.Close()
}

// unpackArchive detects an archive's format and unpacks it.
func (c *Cache) unpackArchive(ctx context.Context, path, tmp string, a *applier) (meta, error) {
	maxStream := c.o.MaxDownload + int64(c.o.MaxEntries)<<10
	s, err := scanArchive(ctx, path, maxStream, c.o.MaxEntries, c.o.MaxManifest)
	if err != nil {
		return meta{}, err
	}
	format := s.format
	var m meta
	switch format {
	case FormatDocker:
		// go-containerregistry reads manifest.json and the config whole,
		// at once: checked first.
		if err := s.checkDocker(c.o.MaxManifest); err != nil {
			return meta{}, fmt.Errorf("docker archive: %w", err)
		}
		img, err := tarball.Image(func() (io.ReadCloser, error) {
			rc, err := openDecompressed(path)
			if err != nil {
				return nil, err
			}
			return readCloser{&capReader{r: ctxReader{ctx, rc}, left: maxStream, what: "decompressed archive"}, rc}, nil
		}, nil)
		if err != nil {
			return meta{}, fmt.Errorf("read docker archive: %w", err)
		}
		m, err = applyImage(ctx, img, a, sizeCheck{max: c.o.MaxManifest})
		if err != nil {
			return meta{}, err
		}
	case FormatOCIArchive:
		m, err = c.unpackOCIArchive(ctx, path, tmp, a)
		if err != nil {
			return meta{}, err
		}
	case FormatACI:
		rc, err := openDecompressed(path)
		if err != nil {
			return meta{}, err
		}
		defer rc.Close()
		m, err = applyACI(ctx, &capReader{r: rc, left: maxStream, what: "decompressed archive"}, a)
		if err != nil {
			return meta{}, err
		}
	}
	m.Format = format
	return m, nil
}

// unpackOCIArchive unpacks the layout held by a tar into tmp (with the
// same checks and caps as an image), then applies the image it holds.
func (c *Cache) unpackOCIArchive(ctx context.Context, path, tmp string, a *applier) (meta, error) {
	dir := filepath.Join(tmp, "layout")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return meta{}, err
	}
	defer os.RemoveAll(dir)
	root, err := os.OpenRoot(dir)
	if err != nil {
		return meta{}, err
	}
	defer root.Close()
	rc, err := openDecompressed(path)
	if err != nil {
		return meta{}, err
	}
	defer rc.Close()
	la := newApplier(root, c.limits(c.o.MaxDownload))
	r := &capReader{r: rc, left: la.lim.streamLeft, what: "decompressed archive"}
	if err := applyTar(ctx, r, la, false); err != nil {
		return meta{}, fmt.Errorf("unpack oci archive: %w", err)
	}
	if err := la.finish(); err != nil {
		return meta{}, err
	}
	check := sizeCheck{max: c.o.MaxManifest, dir: dir}
	if err := check.layoutIndexFile(); err != nil {
		return meta{}, fmt.Errorf("oci archive: %w", err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return meta{}, fmt.Errorf("oci archive: %w", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return meta{}, fmt.Errorf("oci archive: %w", err)
	}
	img, _, err := pickImage(idx, v1.Hash{}, "oci archive", check)
	if err != nil {
		return meta{}, err
	}
	return applyImage(ctx, img, a, check)
}

// unpackHTTP downloads the payload into tmp, checks its digest before
// reading anything in it, then unpacks it as an archive.
func (c *Cache) unpackHTTP(ref Ref) unpackFunc {
	return func(ctx context.Context, tmp string, a *applier) (meta, error) {
		payload := filepath.Join(tmp, "payload")
		if err := c.download(ctx, ref, payload); err != nil {
			return meta{}, err
		}
		defer os.Remove(payload)
		return c.unpackArchive(ctx, payload, tmp, a)
	}
}

func (c *Cache) download(ctx context.Context, ref Ref, dst string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ref.URL, nil)
	if err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("image %q: http status %s", ref.Original, resp.Status)
	}
	if err := c.copyIn(ctx, resp.Body, dst, ref.Digest); err != nil {
		return fmt.Errorf("image %q: download: %w", ref.Original, err)
	}
	return nil
}

func (c *Cache) remoteOptions(ctx context.Context, ref Ref) []remote.Option {
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(httpGuard{next: manifestCap{next: c.o.Transport, max: c.o.MaxManifest}, insecure: ref.Insecure}),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
	}
	if c.o.Keychain != nil {
		opts = append(opts, remote.WithAuthFromKeychain(c.o.Keychain))
	}
	return opts
}

func (c *Cache) resolveDocker(ctx context.Context, ref Ref) (resolved, error) {
	n := ref.Name
	d := ref.Digest
	if !ref.Pinned() {
		// A tag (allowed by the config): one manifest request pins it.
		desc, err := remote.Head(n, c.remoteOptions(ctx, ref)...)
		if err != nil {
			g, gerr := remote.Get(n, c.remoteOptions(ctx, ref)...)
			if gerr != nil {
				return resolved{}, fmt.Errorf("image %q: resolve tag: %w", ref.Original, err)
			}
			desc = &g.Descriptor
		}
		d = desc.Digest
		n = n.Context().Digest(d.String())
	}
	return resolved{digest: d, format: FormatRegistry, unpack: func(ctx context.Context, _ string, a *applier) (meta, error) {
		img, err := remote.Image(n, c.remoteOptions(ctx, ref)...)
		if err != nil {
			return meta{}, fmt.Errorf("image %q: %w", ref.Original, err)
		}
		m, err := applyImage(ctx, img, a, sizeCheck{max: c.o.MaxManifest})
		if err != nil {
			return meta{}, fmt.Errorf("image %q: %w", ref.Original, err)
		}
		return m, nil
	}}, nil
}

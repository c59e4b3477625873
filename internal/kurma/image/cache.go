package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// ErrNotPlugin is wrapped by the error for an image without executable
// /opt/network/add and /opt/network/del.
var ErrNotPlugin = errors.New("not a network plugin image")

// ErrNotCached is returned by Lookup for a digest that is not unpacked.
var ErrNotCached = errors.New("image not in the cache")

// Options configures a Cache.
type Options struct {
	// Dir is the cache directory, e.g. <stateDir>/images. Required; it is
	// created (0700) if missing.
	Dir string
	// MaxBytes caps the file bytes of one unpacked image; zero means 1 GiB.
	MaxBytes int64
	// MaxEntries caps the tar entries of one image, all layers together;
	// zero means 100000.
	MaxEntries int
	// MaxDepth caps the number of components of an entry's path; zero
	// means 64.
	MaxDepth int
	// MaxDownload caps an archive's bytes (an http(s) download, a
	// file:// archive) and an OCI archive's blobs; an archive's
	// decompressed stream may have MaxDownload bytes plus 1 KiB per
	// allowed entry (headers). Zero means MaxBytes.
	MaxDownload int64
	// MaxManifest caps each manifest, index and image config (and a
	// docker archive's manifest.json, an ACI's manifest): they are read
	// whole into memory. Zero means 4 MiB.
	MaxManifest int64
	// Keychain gives registry credentials; nil means anonymous.
	Keychain authn.Keychain
	// Transport carries registry and http(s) requests; nil means
	// go-containerregistry's remote.DefaultTransport.
	Transport http.RoundTripper
}

// Image is an unpacked plugin image.
type Image struct {
	// Digest is "sha256:<hex>" (see the package doc for what it hashes).
	Digest string
	// Root is the absolute path of the unpacked root file system. Treat it
	// as read-only.
	Root   string
	Format Format
	// MainExec is the image's Entrypoint followed by its Cmd (ACI:
	// app.exec); empty when the image names none.
	MainExec []string
	// Env and WorkingDir come from the image config.
	Env        []string
	WorkingDir string
	// CNIPlugins are the CNI plugins a pack-cni image packs under
	// /opt/cni/bin (its CNIPluginsLabel): skeind runs them directly, as
	// the image's shim would. Empty for other images.
	CNIPlugins []string
}

// Cache keeps unpacked images, one per digest. Its methods are safe for
// concurrent use.
type Cache struct {
	o      Options
	client *http.Client

	mu sync.Mutex
	// refs counts the unreleased Acquires per digest.
	refs map[string]int
	// inflight holds the unpacks under way per digest.
	inflight map[string]*call
}

type call struct {
	done chan struct{}
	err  error
}

// Open opens (creating) the cache directory and removes what a crash left:
// temporary unpack directories and half-removed images.
func Open(o Options) (*Cache, error) {
	if o.Dir == "" {
		return nil, errors.New("image cache: no directory")
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 30
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = 100000
	}
	if o.MaxDepth <= 0 {
		o.MaxDepth = 64
	}
	if o.MaxDownload <= 0 {
		o.MaxDownload = o.MaxBytes
	}
	if o.MaxManifest <= 0 {
		o.MaxManifest = 4 << 20
	}
	if o.Transport == nil {
		o.Transport = remote.DefaultTransport
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("image cache %q: %w", o.Dir, err)
	}
	o.Dir = dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	c := &Cache{o: o, client: &http.Client{Transport: o.Transport}, refs: map[string]int{}, inflight: map[string]*call{}}
	if err := c.removeLeftovers(); err != nil {
		return nil, err
	}
	return c, nil
}

// Dir is the cache directory.
func (c *Cache) Dir() string { return c.o.Dir }

func keyOf(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// digestOfKey turns "sha256-<hex>" into "sha256:<hex>", or "" if the name
// is not an image directory.
func digestOfKey(key string) string {
	d := strings.Replace(key, "-", ":", 1)
	if _, err := ParseDigest(d); err != nil {
		return ""
	}
	return d
}

// removeLeftovers removes temporary directories of unpacks that are not
// under way (all of them at Open) and trash of interrupted removals.
func (c *Cache) removeLeftovers() error {
	ents, err := os.ReadDir(c.o.Dir)
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		var busy bool
		switch {
		case strings.HasPrefix(n, ".trash-"):
		case strings.HasPrefix(n, ".tmp-"):
			k, _, _ := strings.Cut(strings.TrimPrefix(n, ".tmp-"), ".")
			c.mu.Lock()
			busy = c.inflight[digestOfKey(k)] != nil
			c.mu.Unlock()
		default:
			continue
		}
		if busy {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.o.Dir, n)); err != nil {
			return fmt.Errorf("image cache: remove leftover %s: %w", n, err)
		}
	}
	return nil
}

// Acquire returns the unpacked image ref names, fetching and unpacking it
// if this digest is not in the cache yet (once, however many callers ask
// at the same time), and a function that releases it (call it once; more
// calls do nothing). A released image stays until Prune.
func (c *Cache) Acquire(ctx context.Context, ref Ref) (Image, func(), error) {
	if ref.Pinned() {
		if img, release, err := c.Lookup(ref.Digest.String()); err == nil {
			return img, release, nil
		}
	}
	r, err := c.resolve(ctx, ref)
	if err != nil {
		return Image{}, nil, err
	}
	d := r.digest.String()
	for {
		c.mu.Lock()
		img, err := c.load(d)
		if err == nil {
			c.refs[d]++
			c.mu.Unlock()
			return img, c.releaser(d), nil
		}
		if !errors.Is(err, ErrNotCached) {
			c.mu.Unlock()
			return Image{}, nil, err
		}
		if cl := c.inflight[d]; cl != nil {
			c.mu.Unlock()
			select {
			case <-cl.done:
			case <-ctx.Done():
				return Image{}, nil, fmt.Errorf("image %q: %w", ref.Original, ctx.Err())
			}
			// The unpack we waited for failed: give its error, unless it
			// was its caller's context ending, then try ourselves.
			if cl.err != nil && !errors.Is(cl.err, context.Canceled) && !errors.Is(cl.err, context.DeadlineExceeded) {
				return Image{}, nil, cl.err
			}
			continue
		}
		cl := &call{done: make(chan struct{})}
		c.inflight[d] = cl
		c.mu.Unlock()

		cl.err = c.unpack(ctx, ref, r)

		c.mu.Lock()
		delete(c.inflight, d)
		close(cl.done)
		c.mu.Unlock()
		if cl.err != nil {
			return Image{}, nil, cl.err
		}
	}
}

// Lookup returns an image already in the cache by digest ("sha256:<hex>"),
// fetching nothing; ErrNotCached if it is not there. The attachment
// records of a restarted daemon find their images this way.
func (c *Cache) Lookup(digest string) (Image, func(), error) {
	if _, err := ParseDigest(digest); err != nil {
		return Image{}, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	img, err := c.load(digest)
	if err != nil {
		return Image{}, nil, err
	}
	c.refs[digest]++
	return img, c.releaser(digest), nil
}

// Hold takes another reference to an image this process already holds
// (Acquire or Lookup), without reading it again: false when nothing holds
// it (then Lookup).
func (c *Cache) Hold(digest string) (func(), bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refs[digest] <= 0 {
		return nil, false
	}
	c.refs[digest]++
	return c.releaser(digest), true
}

// load reads an unpacked image's meta.json; c.mu is held so that Prune
// cannot move it meanwhile.
func (c *Cache) load(digest string) (Image, error) {
	dir := filepath.Join(c.o.Dir, keyOf(digest))
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, fmt.Errorf("%s: %w", digest, ErrNotCached)
	}
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", digest, err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Image{}, fmt.Errorf("image %s: meta.json: %w", digest, err)
	}
	return Image{Digest: digest, Root: filepath.Join(dir, "rootfs"), Format: m.Format,
		MainExec: m.MainExec, Env: m.Env, WorkingDir: m.WorkingDir, CNIPlugins: m.CNIPlugins}, nil
}

func (c *Cache) releaser(digest string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.refs[digest]--; c.refs[digest] <= 0 {
				delete(c.refs, digest)
			}
		})
	}
}

// unpack fetches and unpacks one image into a temporary directory beside
// its final place, checks it, flushes it and renames it into place. On any
// failure the temporary directory is removed.
func (c *Cache) unpack(ctx context.Context, ref Ref, r resolved) (err error) {
	key := keyOf(r.digest.String())
	tmp, err := os.MkdirTemp(c.o.Dir, ".tmp-"+key+".")
	if err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()

	lim := c.limits(c.o.MaxBytes)
	a := newApplier(root, lim)
	m, err := r.unpack(ctx, tmp, a)
	if err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	if err := a.finish(); err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	if err := checkPlugin(root); err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	m.Digest, m.Source, m.Bytes, m.Entries = r.digest.String(), ref.Original, lim.bytes, lim.entries
	if r.format != "" {
		m.Format = r.format
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "meta.json"), b, 0o644); err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	if err := syncTree(tmp); err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	final := filepath.Join(c.o.Dir, key)
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, "meta.json")); serr == nil {
			// Another process put the same digest in place first.
			os.RemoveAll(tmp)
			return nil
		}
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	if err := syncDir(c.o.Dir); err != nil {
		return fmt.Errorf("image %q: %w", ref.Original, err)
	}
	return nil
}

// checkPlugin checks the Kurma contract: /opt/network/add and
// /opt/network/del are executable regular files (a link to one inside the
// image will do).
func checkPlugin(root *os.Root) error {
	for _, p := range []string{"opt/network/add", "opt/network/del"} {
		fi, err := root.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("no /%s: %w", p, ErrNotPlugin)
		case err != nil:
			return fmt.Errorf("/%s: %v: %w", p, err, ErrNotPlugin)
		case !fi.Mode().IsRegular():
			return fmt.Errorf("/%s is not a regular file: %w", p, ErrNotPlugin)
		case fi.Mode()&0o111 == 0:
			return fmt.Errorf("/%s is not executable: %w", p, ErrNotPlugin)
		}
	}
	return nil
}

// limits are the caps of one image whose files may have maxBytes bytes:
// its layers' decompressed streams together may have that and 1 KiB per
// allowed entry (headers).
func (c *Cache) limits(maxBytes int64) *limits {
	return &limits{maxBytes: maxBytes, maxEntries: c.o.MaxEntries, maxDepth: c.o.MaxDepth, maxMeta: c.o.MaxManifest,
		streamLeft: maxBytes + int64(c.o.MaxEntries)<<10}
}

// Prune removes the unpacked images that no Acquire in this process holds
// and whose digest is not in inUse ("sha256:<hex>" keys: the digests the
// caller's attachment records name), and leftover temporary directories.
// It returns the digests removed.
func (c *Cache) Prune(inUse map[string]bool) ([]string, error) {
	ents, err := os.ReadDir(c.o.Dir)
	if err != nil {
		return nil, fmt.Errorf("prune images: %w", err)
	}
	var removed []string
	for _, e := range ents {
		d := digestOfKey(e.Name())
		if d == "" || inUse[d] {
			continue
		}
		c.mu.Lock()
		if c.refs[d] > 0 || c.inflight[d] != nil {
			c.mu.Unlock()
			continue
		}
		// Move it out of sight under the lock, remove it outside.
		trash := filepath.Join(c.o.Dir, ".trash-"+e.Name()+"."+randHex())
		err := os.Rename(filepath.Join(c.o.Dir, e.Name()), trash)
		c.mu.Unlock()
		if err != nil {
			return removed, fmt.Errorf("prune image %s: %w", d, err)
		}
		if err := os.RemoveAll(trash); err != nil {
			return removed, fmt.Errorf("prune image %s: %w", d, err)
		}
		removed = append(removed, d)
	}
	if err := c.removeLeftovers(); err != nil {
		return removed, err
	}
	return removed, nil
}

func randHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

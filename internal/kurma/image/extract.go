package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// ErrUnsafeEntry is wrapped by the error for an entry that could write
// outside the image or create something an image may not hold.
var ErrUnsafeEntry = errors.New("unsafe image entry")

// ErrLimit is wrapped by the error for an image over a cap of Options.
var ErrLimit = errors.New("image over a limit")

const whiteoutPrefix = ".wh."
const opaqueMarker = ".wh..wh..opq"

// limits counts what an image has written against its caps; one is shared
// by all the layers of one image.
type limits struct {
	maxBytes   int64
	maxEntries int
	maxDepth   int
	maxMeta    int64 // a manifest or config read whole
	bytes      int64
	entries    int
	// streamLeft is what the decompressed streams may still have.
	streamLeft int64
}

// charge counts an entry's content against the byte cap; every entry's
// is counted, whatever is done with it (a whiteout's, a directory's, an
// ACI's files outside rootfs/): the tar reader reads it all the same.
func (l *limits) charge(name string, size int64) error {
	if size < 0 || size > l.maxBytes-l.bytes {
		return fmt.Errorf("entry %q: %d bytes would pass the image cap of %d: %w", name, size, l.maxBytes, ErrLimit)
	}
	l.bytes += size
	return nil
}

// applier writes tar entries into an image root. Before each write it
// checks, against what is on disk, that every parent of the entry is a
// real directory, so nothing is ever written through a symlink; os.Root
// enforces the same underneath.
type applier struct {
	root *os.Root
	lim  *limits
	// whiteouts is true for OCI layers; in an ACI a ".wh." file is a file.
	whiteouts bool
	// dirs caches paths known to be real directories; any removal resets
	// it because a removal can change what a cached path is.
	dirs map[string]bool
	// dirModes holds each directory's mode, applied at the end so that a
	// read-only directory can still be filled first.
	dirModes map[string]fs.FileMode
	// layer holds the paths the current layer wrote, which an opaque
	// marker of the same layer must keep.
	layer map[string]bool
	// linkPrefix is the archive prefix of the image root that hard link
	// targets carry ("rootfs/" in an ACI).
	linkPrefix string
}

func newApplier(root *os.Root, lim *limits) *applier {
	return &applier{root: root, lim: lim, dirs: map[string]bool{}, dirModes: map[string]fs.FileMode{}}
}

// startLayer begins a new layer (OCI) or the single tree (ACI).
func (a *applier) startLayer(whiteouts bool) {
	a.whiteouts = whiteouts
	a.layer = map[string]bool{}
}

// finish applies the directory modes.
func (a *applier) finish() error {
	for p, m := range a.dirModes {
		if err := a.root.Chmod(p, m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("set mode of %q: %w", p, err)
		}
	}
	return nil
}

func unsafeEntry(name, reason string) error {
	return fmt.Errorf("entry %q: %s: %w", name, reason, ErrUnsafeEntry)
}

// cleanName turns a tar name into a slash path relative to the image root
// ("" is the root itself). It refuses absolute names and any ".." rather
// than resolving them.
func cleanName(name string) (string, error) {
	p, reason := cleanPath(name)
	if reason != "" {
		return "", unsafeEntry(name, reason)
	}
	return p, nil
}

func cleanPath(name string) (p, reason string) {
	if name == "" {
		return "", "empty name"
	}
	if strings.HasPrefix(name, "/") {
		return "", "absolute path"
	}
	var out []string
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "", ".":
		case "..":
			return "", `path has a ".." component`
		default:
			out = append(out, c)
		}
	}
	return strings.Join(out, "/"), ""
}

func kind(fi fs.FileInfo) string {
	switch t := fi.Mode().Type(); {
	case t == fs.ModeSymlink:
		return "symlink"
	case t == 0:
		return "file"
	default:
		return t.String()
	}
}

func depth(p string) int {
	if p == "" {
		return 0
	}
	return strings.Count(p, "/") + 1
}

// entry applies one tar entry whose name has already been mapped into the
// image (for an ACI, without its "rootfs/" prefix).
func (a *applier) entry(name string, hdr *tar.Header, r io.Reader) error {
	a.lim.entries++
	if a.lim.entries > a.lim.maxEntries {
		return fmt.Errorf("more than %d entries: %w", a.lim.maxEntries, ErrLimit)
	}
	if err := a.lim.charge(name, hdr.Size); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	p, err := cleanName(name)
	if err != nil {
		return err
	}
	if d := depth(p); d > a.lim.maxDepth {
		return fmt.Errorf("entry %q: depth %d over %d: %w", name, d, a.lim.maxDepth, ErrLimit)
	}
	if p == "" {
		return nil // the root directory itself keeps its mode
	}
	if a.whiteouts {
		base := path.Base(p)
		if base == opaqueMarker {
			return a.opaque(name, path.Dir(p))
		}
		if strings.HasPrefix(base, whiteoutPrefix) {
			return a.whiteout(name, path.Dir(p), strings.TrimPrefix(base, whiteoutPrefix))
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return a.dir(name, p, hdr)
	case tar.TypeReg, '\x00':
		return a.file(name, p, hdr, r)
	case tar.TypeSymlink:
		return a.symlink(name, p, hdr.Linkname)
	case tar.TypeLink:
		return a.hardlink(name, p, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock:
		return unsafeEntry(name, "device node")
	case tar.TypeFifo:
		return unsafeEntry(name, "fifo")
	default:
		return unsafeEntry(name, fmt.Sprintf("unsupported entry type %q", hdr.Typeflag))
	}
}

// parents makes sure every parent of p is a real directory, creating the
// missing ones. A parent that is a symlink or a file is refused: writing
// through it could land anywhere.
func (a *applier) parents(name, p string) error {
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		q := p[:i]
		a.layer[q] = true
		if a.dirs[q] {
			continue
		}
		fi, err := a.root.Lstat(q)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := a.root.Mkdir(q, 0o755); err != nil {
				return fmt.Errorf("entry %q: create %q: %w", name, q, err)
			}
		case err != nil:
			return fmt.Errorf("entry %q: %w", name, err)
		case !fi.IsDir():
			return unsafeEntry(name, fmt.Sprintf("parent %q is a %s, not a directory", q, kind(fi)))
		}
		a.dirs[q] = true
	}
	return nil
}

// existingParent reports whether every parent of p exists as a real
// directory, without creating any (for whiteouts and link targets).
func (a *applier) existingParent(name, p string) (bool, error) {
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		q := p[:i]
		if a.dirs[q] {
			continue
		}
		fi, err := a.root.Lstat(q)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("entry %q: %w", name, err)
		case !fi.IsDir():
			return false, unsafeEntry(name, fmt.Sprintf("parent %q is a %s, not a directory", q, kind(fi)))
		}
		a.dirs[q] = true
	}
	return true, nil
}

// replace prepares p for a new non-directory entry: its parents exist and
// whatever was at p is gone.
func (a *applier) replace(name, p string) error {
	if err := a.parents(name, p); err != nil {
		return err
	}
	a.layer[p] = true
	fi, err := a.root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	return a.remove(name, p, fi.IsDir())
}

func (a *applier) remove(name, p string, isDir bool) error {
	var err error
	if isDir {
		err = a.root.RemoveAll(p)
		clear(a.dirs)
		delete(a.dirModes, p)
		for q := range a.dirModes {
			if strings.HasPrefix(q, p+"/") {
				delete(a.dirModes, q)
			}
		}
	} else {
		err = a.root.Remove(p)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("entry %q: remove %q: %w", name, p, err)
	}
	return nil
}

func (a *applier) dir(name, p string, hdr *tar.Header) error {
	if err := a.parents(name, p); err != nil {
		return err
	}
	a.layer[p] = true
	fi, err := a.root.Lstat(p)
	switch {
	case err == nil && fi.IsDir():
	case err == nil:
		if err := a.remove(name, p, false); err != nil {
			return err
		}
		fallthrough
	case errors.Is(err, fs.ErrNotExist):
		if err := a.root.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("entry %q: %w", name, err)
		}
	default:
		return fmt.Errorf("entry %q: %w", name, err)
	}
	a.dirs[p] = true
	m := fs.FileMode(hdr.Mode) & 0o777
	if hdr.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	a.dirModes[p] = m
	return nil
}

func (a *applier) file(name, p string, hdr *tar.Header, r io.Reader) error {
	if err := a.replace(name, p); err != nil {
		return err
	}
	f, err := a.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	_, err = io.CopyN(f, r, hdr.Size)
	if err == nil {
		// Setuid, setgid and sticky bits are dropped: 0o777 only.
		err = f.Chmod(fs.FileMode(hdr.Mode) & 0o777)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	return nil
}

// symlinkTarget checks a symlink's target and returns the one to store.
// A relative target may start with a run of ".." no longer than the
// link's depth, and have no ".." after it (after a component that may be
// a symlink, ".." is no longer lexical). An absolute target meant the
// image root: it is rewritten relative to the link, so that no link leads
// out of the cache whoever follows it.
func symlinkTarget(name, p, target string) (string, error) {
	if target == "" {
		return "", unsafeEntry(name, "empty symlink target")
	}
	abs := strings.HasPrefix(target, "/")
	var comps []string
	ups, leading := 0, true
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			if abs || !leading {
				return "", unsafeEntry(name, fmt.Sprintf("symlink target %q has a \"..\" after a name", target))
			}
			ups++
		default:
			leading = false
		}
		comps = append(comps, c)
	}
	linkDepth := depth(p) - 1
	if ups > linkDepth {
		return "", unsafeEntry(name, fmt.Sprintf("symlink target %q leads outside the image", target))
	}
	if abs {
		up := make([]string, linkDepth, linkDepth+len(comps))
		for i := range up {
			up[i] = ".."
		}
		comps = append(up, comps...)
	}
	if len(comps) == 0 {
		return ".", nil
	}
	return strings.Join(comps, "/"), nil
}

func (a *applier) symlink(name, p, target string) error {
	t, err := symlinkTarget(name, p, target)
	if err != nil {
		return err
	}
	if err := a.replace(name, p); err != nil {
		return err
	}
	if err := a.root.Symlink(t, p); err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	return nil
}

func (a *applier) hardlink(name, p, target string) error {
	if strings.HasPrefix(target, "/") {
		return unsafeEntry(name, fmt.Sprintf("hard link to absolute path %q", target))
	}
	t, reason := cleanPath(target)
	if reason != "" {
		return unsafeEntry(name, fmt.Sprintf("hard link target %q: %s", target, reason))
	}
	if a.linkPrefix != "" {
		if !strings.HasPrefix(t+"/", a.linkPrefix) {
			return unsafeEntry(name, fmt.Sprintf("hard link to %q, outside the image root", target))
		}
		t = strings.TrimPrefix(strings.TrimPrefix(t, strings.TrimSuffix(a.linkPrefix, "/")), "/")
	}
	if t == "" || t == p {
		return unsafeEntry(name, fmt.Sprintf("hard link to %q", target))
	}
	ok, err := a.existingParent(name, t)
	if err != nil {
		return err
	}
	var fi fs.FileInfo
	if ok {
		fi, err = a.root.Lstat(t)
	}
	if !ok || errors.Is(err, fs.ErrNotExist) {
		return unsafeEntry(name, fmt.Sprintf("hard link to %q, which is not in the image", target))
	}
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	if fi.IsDir() {
		return unsafeEntry(name, fmt.Sprintf("hard link to directory %q", target))
	}
	// A hard link to a symlink would move the link to another depth, where
	// its leading ".." could climb out of the image.
	if fi.Mode().Type() == fs.ModeSymlink {
		return unsafeEntry(name, fmt.Sprintf("hard link to symlink %q", target))
	}
	if err := a.replace(name, p); err != nil {
		return err
	}
	if err := a.root.Link(t, p); err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	return nil
}

// whiteout removes dir/base, left by a lower layer.
func (a *applier) whiteout(name, dir, base string) error {
	if base == "" || base == "." || base == ".." {
		return unsafeEntry(name, fmt.Sprintf("whiteout of %q", base))
	}
	if dir == "." {
		dir = ""
	}
	p := path.Join(dir, base)
	ok, err := a.existingParent(name, p)
	if err != nil || !ok {
		return err
	}
	fi, err := a.root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	return a.remove(name, p, fi.IsDir())
}

// opaque empties dir of what lower layers put there, keeping what this
// layer wrote.
func (a *applier) opaque(name, dir string) error {
	if dir == "." {
		dir = ""
	}
	if dir != "" {
		ok, err := a.existingParent(name, dir+"/x")
		if err != nil || !ok {
			return err
		}
		fi, err := a.root.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("entry %q: %w", name, err)
		}
		if !fi.IsDir() {
			return unsafeEntry(name, fmt.Sprintf("opaque marker in %q, which is not a directory", dir))
		}
	}
	d := dir
	if d == "" {
		d = "."
	}
	f, err := a.root.Open(d)
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name())
		if a.layer[p] {
			continue
		}
		if err := a.remove(name, p, e.IsDir()); err != nil {
			return err
		}
	}
	return nil
}

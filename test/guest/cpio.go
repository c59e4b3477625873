package guest

import (
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// An archive is the initramfs being assembled: a tree of directories,
// files and symlinks written out as a "newc" cpio archive, the format the
// kernel unpacks into its rootfs. Parent directories are added on demand;
// entries come out sorted by path, so parents precede their children.
type archive struct {
	entries map[string]entry
}

type entry struct {
	mode uint32 // file type and permission bits
	data []byte // file contents, or a symlink's target
}

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeLink = 0o120000
)

func newArchive() *archive { return &archive{entries: map[string]entry{}} }

// clean turns a guest path into the archive's relative spelling ("bin/sh").
func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

func (a *archive) dir(p string) {
	p = clean(p)
	for p != "" && p != "." {
		if _, ok := a.entries[p]; ok {
			return
		}
		a.entries[p] = entry{mode: modeDir | 0o755}
		p = path.Dir(p)
	}
}

func (a *archive) file(p string, perm uint32, data []byte) {
	p = clean(p)
	a.dir(path.Dir(p))
	a.entries[p] = entry{mode: modeFile | perm&0o7777, data: data}
}

func (a *archive) symlink(p, target string) {
	p = clean(p)
	a.dir(path.Dir(p))
	a.entries[p] = entry{mode: modeLink | 0o777, data: []byte(target)}
}

// writeTo writes the archive in the newc format: per entry a 110-byte
// ASCII header (magic 070701 and thirteen 8-digit hex fields), the name
// with its NUL, padding to 4 bytes, the data, padding to 4 bytes; then the
// TRAILER!!! entry.
func (a *archive) writeTo(w io.Writer) error {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var off int64
	put := func(b []byte) error {
		n, err := w.Write(b)
		off += int64(n)
		return err
	}
	pad := func() error {
		if r := off % 4; r != 0 {
			return put(make([]byte, 4-r))
		}
		return nil
	}
	record := func(ino int, name string, e entry) error {
		nlink := 1
		if e.mode&0o170000 == modeDir {
			nlink = 2
		}
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, 0, 0, len(name)+1, 0)
		if err := put([]byte(hdr + name + "\x00")); err != nil {
			return err
		}
		if err := pad(); err != nil {
			return err
		}
		if err := put(e.data); err != nil {
			return err
		}
		return pad()
	}
	for i, n := range names {
		if err := record(i+1, n, a.entries[n]); err != nil {
			return fmt.Errorf("write %s to the initramfs: %w", n, err)
		}
	}
	if err := record(0, "TRAILER!!!", entry{}); err != nil {
		return fmt.Errorf("write the initramfs trailer: %w", err)
	}
	return nil
}

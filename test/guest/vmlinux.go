package guest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// Under TCG the bzImage's own decompressor (xz, for Debian's kernels) runs
// emulated and costs seconds of every boot. qemu boots an uncompressed ELF
// vmlinux directly through its PVH entry point (a Xen ELF note, present
// when the kernel has CONFIG_PVH) and skips that. vmlinuxFor extracts the
// ELF once, with the host's xz, into the user's cache directory; when
// anything in that is missing it returns the bzImage, which boots slower
// but the same.

// xzMagic starts an xz stream.
var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}

// xenNotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY, the PVH entry point note.
const xenNotePhys32Entry = 18

// BootImage is what to pass to qemu -kernel: the uncompressed ELF when it
// can be had (extracted once per process at most), else Image; note says
// why not ("" when it could).
func (k *Kernel) BootImage() (image, note string) {
	k.bootOnce.Do(func() { k.bootImage, k.bootNote = vmlinuxFor(k) })
	return k.bootImage, k.bootNote
}

// vmlinuxFor returns an image to pass to qemu -kernel for k: the cached
// uncompressed ELF if it can be had, else k.Image; note says why not.
func vmlinuxFor(k *Kernel) (image, note string) {
	base, err := os.UserCacheDir()
	if err != nil {
		return k.Image, fmt.Sprintf("booting the compressed image (no cache directory: %v)", err)
	}
	st, err := os.Stat(k.Image)
	if err != nil {
		return k.Image, fmt.Sprintf("booting the compressed image: %v", err)
	}
	// Size and mtime name the image: a different kernel under the same
	// version (a rebuilt cache) gets a fresh extraction.
	out := filepath.Join(base, "skein", "guest", fmt.Sprintf("vmlinux-%s-%d-%d", k.Version, st.Size(), st.ModTime().Unix()))
	if hasPVHNote(out) == nil {
		return out, ""
	}
	if err := extractVmlinux(k.Image, out); err != nil {
		return k.Image, fmt.Sprintf("booting the compressed image (slower): %v", err)
	}
	return out, ""
}

// extractVmlinux decompresses the xz payload of bzImage into out (via a
// temporary file and a rename, so concurrent test processes do not see a
// half-written image) and checks that it can boot through PVH.
func extractVmlinux(bzImage, out string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	off := bytes.Index(data, xzMagic)
	if off < 0 {
		return fmt.Errorf("%s holds no xz stream", bzImage)
	}
	xz, err := exec.LookPath("xz")
	if err != nil {
		return fmt.Errorf("xz (xz-utils) is not installed: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp" + strconv.Itoa(os.Getpid())
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	// The payload is followed by the rest of the bzImage: --single-stream
	// stops at the end of the stream and ignores what follows.
	cmd := exec.Command(xz, "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(data[off:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("xz -d of the payload of %s: %w: %s", bzImage, err, stderr.String())
	}
	if err := hasPVHNote(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// hasPVHNote checks that path is an ELF kernel with the PVH entry note.
func hasPVHNote(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes := make([]byte, p.Filesz)
		if _, err := p.ReadAt(notes, 0); err != nil {
			return fmt.Errorf("read the notes of %s: %w", path, err)
		}
		// Each note: namesz, descsz, type (4 bytes each), then the name
		// and the descriptor, each padded to 4 bytes.
		for len(notes) >= 12 {
			namesz := int(binary.LittleEndian.Uint32(notes[0:]))
			descsz := int(binary.LittleEndian.Uint32(notes[4:]))
			typ := binary.LittleEndian.Uint32(notes[8:])
			nameEnd := 12 + (namesz+3)&^3
			end := nameEnd + (descsz+3)&^3
			if end > len(notes) || namesz > len(notes) {
				break
			}
			if typ == xenNotePhys32Entry && bytes.Equal(bytes.TrimRight(notes[12:12+namesz], "\x00"), []byte("Xen")) {
				return nil
			}
			notes = notes[end:]
		}
	}
	return errors.New("the kernel has no PVH entry note (CONFIG_PVH)")
}

package pack

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
)

// binary is what packing needs to know of one ELF executable or library.
type binary struct {
	arch   string   // GOARCH
	interp string   // PT_INTERP, "" for a static binary
	needed []string // DT_NEEDED
	rpath  []string // DT_RUNPATH or DT_RPATH entries (absolute ones only)
}

// archOf maps ELF machines to GOARCH and Debian's multiarch tuple.
var archOf = map[elf.Machine]struct{ goarch, tuple string }{
	elf.EM_X86_64:  {"amd64", "x86_64-linux-gnu"},
	elf.EM_AARCH64: {"arm64", "aarch64-linux-gnu"},
	elf.EM_386:     {"386", "i386-linux-gnu"},
	elf.EM_ARM:     {"arm", "arm-linux-gnueabihf"},
	elf.EM_RISCV:   {"riscv64", "riscv64-linux-gnu"},
	elf.EM_PPC64:   {"ppc64le", "powerpc64le-linux-gnu"},
	elf.EM_S390:    {"s390x", "s390x-linux-gnu"},
}

// readBinary reads the dynamic-linking facts of an ELF file.
func readBinary(p string) (binary, error) {
	f, err := elf.Open(p)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return binary{}, fmt.Errorf("%s: not an ELF executable (scripts need an interpreter the image does not have)", p)
		}
		return binary{}, fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	a, ok := archOf[f.Machine]
	if !ok {
		return binary{}, fmt.Errorf("%s: unsupported machine %s", p, f.Machine)
	}
	b := binary{arch: a.goarch}
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		buf := make([]byte, prog.Filesz)
		if _, err := prog.ReadAt(buf, 0); err != nil {
			return binary{}, fmt.Errorf("%s: read its interpreter: %w", p, err)
		}
		b.interp = strings.TrimRight(string(buf), "\x00")
	}
	if f.Section(".dynamic") == nil {
		return b, nil
	}
	if b.needed, err = f.ImportedLibraries(); err != nil {
		return binary{}, fmt.Errorf("%s: read its libraries: %w", p, err)
	}
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, _ := f.DynString(tag)
		for _, v := range vals {
			for _, d := range strings.Split(v, ":") {
				// $ORIGIN and relative entries mean the binary's own
				// place, which the image does not reproduce.
				if path.IsAbs(d) {
					b.rpath = append(b.rpath, path.Clean(d))
				}
			}
		}
	}
	return b, nil
}

// tupleOf is the multiarch tuple of a GOARCH.
func tupleOf(goarch string) string {
	for _, a := range archOf {
		if a.goarch == goarch {
			return a.tuple
		}
	}
	return ""
}

// defaultLibDirs is where the dynamic loader looks without a cache, in its
// order, for Debian (multiarch) and other distributions (lib64).
func defaultLibDirs(goarch string) []string {
	var dirs []string
	if t := tupleOf(goarch); t != "" {
		dirs = append(dirs, "/lib/"+t, "/usr/lib/"+t)
	}
	return append(dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib")
}

// resolveLibs finds the files a dynamically linked binary needs at run
// time: its interpreter and, transitively, its libraries. It returns image
// path → host path, the image path being where the loader will look for
// it (the host path may be a symlink; its content is what gets packed).
func (o Options) resolveLibs(bin binary, from string, into map[string]string) error {
	if bin.interp == "" {
		return nil
	}
	if !path.IsAbs(bin.interp) {
		return fmt.Errorf("%s: interpreter %q is not an absolute path", from, bin.interp)
	}
	if err := o.addLib(bin.interp, into); err != nil {
		return fmt.Errorf("%s: interpreter: %w", from, err)
	}
	dirs := o.LibDirs
	if len(dirs) == 0 {
		dirs = defaultLibDirs(bin.arch)
	}
	queue := []struct {
		b    binary
		from string
	}{{bin, from}}
	seen := map[string]bool{}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, lib := range cur.b.needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			imgPath, err := o.findLib(lib, append(append([]string{}, cur.b.rpath...), dirs...))
			if err != nil {
				return fmt.Errorf("%s needs %s: %w", cur.from, lib, err)
			}
			if err := o.addLib(imgPath, into); err != nil {
				return err
			}
			lb, err := readBinary(o.hostPath(imgPath))
			if err != nil {
				return err
			}
			if lb.arch != bin.arch {
				return fmt.Errorf("%s: %s library for a %s binary", imgPath, lb.arch, bin.arch)
			}
			queue = append(queue, struct {
				b    binary
				from string
			}{lb, imgPath})
		}
	}
	return nil
}

// findLib returns the first dir/name that exists.
func (o Options) findLib(name string, dirs []string) (string, error) {
	if strings.Contains(name, "/") {
		if path.IsAbs(name) {
			return path.Clean(name), nil
		}
		return "", fmt.Errorf("relative library path %q", name)
	}
	for _, d := range dirs {
		p := path.Join(d, name)
		if fi, err := os.Stat(o.hostPath(p)); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(dirs, ", "))
}

// addLib records a library (or the interpreter) at its image path.
func (o Options) addLib(imgPath string, into map[string]string) error {
	fi, err := os.Stat(o.hostPath(imgPath))
	if err != nil {
		return fmt.Errorf("stat %s: %w", imgPath, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", imgPath)
	}
	into[imgPath] = o.hostPath(imgPath)
	return nil
}

// hostPath is where an absolute library path is read on this machine
// (under Options.SysRoot when set).
func (o Options) hostPath(p string) string {
	if o.SysRoot == "" {
		return p
	}
	return path.Join(o.SysRoot, p)
}

package guest

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/skeinnet/skein/test/tools"
)

// Kernel is a cached Debian kernel: its image and its modules, indexed by
// name. The package has no modules.dep (the tree is extracted from the
// .deb, depmod never ran), so dependencies are read from each module's
// .modinfo section.
type Kernel struct {
	// Image is boot/vmlinuz-<version>.
	Image string
	// Version is the release the modules are built for.
	Version string
	// modules maps a module's name (dashes folded to underscores) to its
	// .ko file.
	modules map[string]string
	// builtin holds the names of modules compiled into the image.
	builtin map[string]bool
	// aliases maps an alias (no wildcards) to the modules declaring it;
	// built on first need (reading every module's .modinfo).
	aliasOnce sync.Once
	aliases   map[string][]string
	aliasErr  error
	// bootImage is the image qemu boots (BootImage).
	bootOnce            sync.Once
	bootImage, bootNote string
}

// modName folds a module name or file name to the kernel's spelling:
// underscores, no .ko suffix.
func modName(s string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(s), ".ko"), "-", "_")
}

// LoadKernel indexes the kernel under root (<cache>/current). A missing
// image or module tree is an error naming the path.
func LoadKernel(root string) (*Kernel, error) {
	images, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(images) == 0 {
		return nil, fmt.Errorf("no kernel image %s: %w", filepath.Join(root, "boot", "vmlinuz-*"), fs.ErrNotExist)
	}
	k := &Kernel{
		Image:   images[0],
		Version: strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-"),
		modules: map[string]string{},
		builtin: map[string]bool{},
	}
	dir := filepath.Join(root, "lib", "modules", k.Version)
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			k.modules[modName(p)] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index modules of kernel %s: %w", k.Version, err)
	}
	if f, err := os.Open(filepath.Join(dir, "modules.builtin")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" {
				k.builtin[modName(line)] = true
			}
		}
		f.Close()
	}
	return k, nil
}

// Module is one module to load: its name and .ko file. An optional module
// is a soft dependency (a "softdep=pre:" of another): the guest goes on if
// it does not load (e.g. crc32c-intel on a CPU without SSE4.2, with
// crc32c_generic loaded beside it).
type Module struct {
	Name, Path string
	Optional   bool
}

// Resolve orders the named modules and everything they depend on so that
// each module comes after its dependencies, each once, in the order asked
// where the dependencies allow. Hard dependencies ("depends=") are
// required; soft ones ("softdep=pre:", names or aliases such as crc32c)
// come first as optional modules, every module providing them. Modules
// built into the image are left out. An unknown module is an error naming
// it (and who needed it).
func (k *Kernel) Resolve(names []string) ([]Module, error) {
	var out []Module
	index := map[string]int{} // name -> position in out
	visiting := map[string]bool{}
	var visit func(name, neededBy string, optional bool) error
	visit = func(name, neededBy string, optional bool) error {
		name = modName(name)
		if i, ok := index[name]; ok {
			if !optional {
				out[i].Optional = false
			}
			return nil
		}
		if k.builtin[name] {
			return nil
		}
		if visiting[name] {
			return fmt.Errorf("module %s: dependency cycle", name)
		}
		path, ok := k.modules[name]
		if !ok {
			if neededBy != "" {
				return fmt.Errorf("module %s (needed by %s) is not in kernel %s", name, neededBy, k.Version)
			}
			return fmt.Errorf("module %s is not in kernel %s", name, k.Version)
		}
		visiting[name] = true
		info, err := readModinfo(path)
		if err != nil {
			return err
		}
		for _, soft := range info.softPre {
			providers, err := k.provide(soft)
			if err != nil {
				return err
			}
			for _, p := range providers {
				if err := visit(p, name, true); err != nil {
					return err
				}
			}
		}
		for _, d := range info.depends {
			if err := visit(d, name, optional); err != nil {
				return err
			}
		}
		visiting[name] = false
		index[name] = len(out)
		out = append(out, Module{Name: name, Path: path, Optional: optional})
		return nil
	}
	for _, n := range names {
		if strings.TrimSpace(n) == "" {
			return nil, errors.New("empty module name")
		}
		if err := visit(strings.TrimSpace(n), "", false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// provide returns the modules a soft dependency names: the module of that
// name, else every module declaring it as an alias (none: nothing to load,
// as modprobe would skip it too).
func (k *Kernel) provide(name string) ([]string, error) {
	if k.builtin[modName(name)] {
		return nil, nil
	}
	if _, ok := k.modules[modName(name)]; ok {
		return []string{name}, nil
	}
	k.aliasOnce.Do(func() {
		k.aliases = map[string][]string{}
		for n, p := range k.modules {
			info, err := readModinfo(p)
			if err != nil {
				k.aliasErr = err
				return
			}
			for _, a := range info.aliases {
				if !strings.ContainsAny(a, "*?[") {
					k.aliases[a] = append(k.aliases[a], n)
				}
			}
		}
		for _, ms := range k.aliases {
			sort.Strings(ms)
		}
	})
	return k.aliases[name], k.aliasErr
}

// modinfo is what Resolve needs of a module's .modinfo section.
type modinfo struct {
	depends []string // depends=a,b
	softPre []string // softdep=pre: a b post: c
	aliases []string // alias=x, one entry each
}

// readModinfo reads the .modinfo section of a module: NUL-separated
// key=value strings.
func readModinfo(path string) (modinfo, error) {
	var mi modinfo
	f, err := elf.Open(path)
	if err != nil {
		return mi, fmt.Errorf("read module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return mi, fmt.Errorf("module %s has no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return mi, fmt.Errorf("read .modinfo of %s: %w", path, err)
	}
	for _, kv := range strings.Split(string(data), "\x00") {
		key, v, _ := strings.Cut(kv, "=")
		switch key {
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.depends = append(mi.depends, d)
				}
			}
		case "softdep":
			pre := false
			for _, w := range strings.Fields(v) {
				switch w {
				case "pre:":
					pre = true
				case "post:":
					pre = false
				default:
					if pre {
						mi.softPre = append(mi.softPre, w)
					}
				}
			}
		case "alias":
			mi.aliases = append(mi.aliases, v)
		}
	}
	return mi, nil
}

// CurrentKernel is the cached kernel scripts/deps.d/vm.sh installed
// (<cache>/current), indexed once per process.
func CurrentKernel() (*Kernel, error) {
	return cachedKernel(filepath.Join(tools.KernelCache(), "current"))
}

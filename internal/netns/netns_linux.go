package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	// ErrNotExist: the namespace path does not exist.
	ErrNotExist = errors.New("network namespace path does not exist")
	// ErrNotNetNS: the path exists but is not a namespace file.
	ErrNotNetNS = errors.New("path is not a network namespace")
)

// IsNetNS reports whether path names a network namespace: nil if it does, an
// error wrapping ErrNotExist if nothing is there, one wrapping ErrNotNetNS if
// it is some other file. Like pkg/ns it checks the filesystem magic: a pinned
// namespace lives on nsfs, /proc/<pid>/ns/net on procfs.
func IsNetNS(path string) error {
	if path == "" {
		return fmt.Errorf("netns path %q: %w", path, ErrNotExist)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("netns %q: %w", path, ErrNotExist)
		}
		return fmt.Errorf("statfs netns %q: %w", path, err)
	}
	switch st.Type {
	case unix.NSFS_MAGIC, unix.PROC_SUPER_MAGIC:
		return nil
	}
	return fmt.Errorf("netns %q (fs magic %#x): %w", path, st.Type, ErrNotNetNS)
}

// Do runs fn on a locked OS thread inside the namespace at path and returns
// its error. An empty path runs fn directly in the caller's namespace. See the
// package comment for what fn may and may not do.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	if err := IsNetNS(path); err != nil {
		return err
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

// Handle returns a netlink route handle whose socket was created inside the
// namespace at path (the current namespace if path is empty), and a function
// that closes it. The handle may be used from any goroutine afterwards.
//
// The socket is created inside Do rather than with netlink.NewHandleAt so
// that this package stays the only one that switches namespaces (NewHandleAt
// unlocks its thread even when it fails to switch back).
func Handle(path string) (*netlink.Handle, func(), error) {
	var h *netlink.Handle
	err := Do(path, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("netlink handle in %q: %w", path, err)
	}
	return h, h.Close, nil
}

// WriteSysctl writes value to /proc/sys/<name> inside the namespace at nsPath.
// Like sysctl(8), name is dotted ("net.ipv4.conf.eth0.proxy_arp") unless it
// contains a slash, in which case it is taken as a path below /proc/sys as is
// ("net/ipv4/conf/eth0.100/proxy_arp": the form for interface names with
// dots). Files under /proc/sys/net resolve against the namespace of the
// thread that opens them, so the open happens inside Do; nsPath "" writes in
// the current namespace without switching.
func WriteSysctl(nsPath, name, value string) error {
	file := sysctlPath(name)
	return Do(nsPath, func() error {
		if err := os.WriteFile(file, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
		}
		return nil
	})
}

// WriteSysctls writes several sysctls (name, value pairs named as in
// WriteSysctl) with a single namespace switch, in order, stopping at the
// first error.
func WriteSysctls(nsPath string, kv ...[2]string) error {
	return Do(nsPath, func() error {
		for _, p := range kv {
			if err := os.WriteFile(sysctlPath(p[0]), []byte(p[1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s: %w", p[0], p[1], err)
			}
		}
		return nil
	})
}

// sharedPinDir reports whether dir is the pin directory other tools bind
// over themselves (/run/netns, also reached as /var/run/netns).
func sharedPinDir(dir string) bool {
	want, err := filepath.EvalSymlinks("/run")
	if err != nil {
		want = "/run"
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(filepath.Clean(dir)))
	if err != nil {
		parent = filepath.Dir(filepath.Clean(dir))
	}
	return filepath.Base(filepath.Clean(dir)) == "netns" && parent == want
}

func sysctlPath(name string) string {
	if !strings.Contains(name, "/") {
		name = strings.ReplaceAll(name, ".", "/")
	}
	return filepath.Join("/proc/sys", name)
}

// Create makes a new, empty network namespace and pins it by bind-mounting it
// onto path (created if missing; its directory is created too). When the
// directory is the one iproute2, podman and the CNI runtimes share
// (/run/netns), it is prepared with PrepareDir first, since those tools bind
// it over itself on first use; a directory of the caller's own (a test's
// temporary one) is left a plain directory, so removing it stays possible.
// The namespace lives until Remove(path) and until no process, socket or
// open file refers to it. The caller's namespace is not changed.
func Create(path string) error {
	dir := filepath.Dir(path)
	if sharedPinDir(dir) {
		if err := PrepareDir(dir); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns mount point: %w", err)
	}
	f.Close()
	tmp, err := ns.TempNetNS()
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("create netns: %w", err)
	}
	defer tmp.Close()
	src := fmt.Sprintf("/proc/self/fd/%d", tmp.Fd())
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("pin netns at %q: %w", path, err)
	}
	return nil
}

// Remove unpins a namespace made by Create (or by `ip netns add`) and deletes
// the mount point. It is idempotent: a path that is already gone, or a file
// that is no longer a mount point, is not an error. A directory is refused.
// The kernel destroys the namespace (and the veth peers inside it)
// asynchronously once nothing else refers to it.
//
// The mounts on path are detached lazily (MNT_DETACH: a process still inside
// the namespace does not make Remove fail). If the file still cannot be
// deleted (EBUSY), an earlier mount of the pin is hidden under a later mount
// of its directory (see PrepareDir); Remove then deletes the file from a
// private copy of the mount table, which takes the hidden mount away too.
func Remove(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove netns %q: %w", path, err)
	}
	if st.IsDir() {
		return fmt.Errorf("remove netns %q: is a directory, not a namespace pin", path)
	}
	// A pin may be mounted more than once (a recursive bind of its
	// directory copies it); take off every layer.
	for i := 0; i < maxLayers; i++ {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmount netns %q: %w", path, err)
		}
	}
	err = os.Remove(path)
	if errors.Is(err, unix.EBUSY) {
		err = removeHidden(path)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %q: %w", path, err)
	}
	return nil
}

// ID identifies a network namespace: the device and inode of the file
// that names it. Two paths (a pinned file, /proc/<pid>/ns/net) name the
// same namespace exactly when their IDs are equal.
type ID struct{ Dev, Ino uint64 }

// IDOf returns the ID of the namespace at path (following symlinks, as
// opening it would).
func IDOf(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ID{}, fmt.Errorf("stat netns %q: %w", path, err)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

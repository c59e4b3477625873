package sandboxinit

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The parts of /proc and /sys a plugin has no business with, as runc's
// defaults list them. A plugin keeps CAP_SYS_ADMIN (it must enter pod
// network namespaces), so these mounts only hold because the seccomp filter
// the sandbox installs refuses mount, umount and their kin.
var (
	// maskedPaths are hidden: /dev/null over a file, an empty read-only
	// tmpfs over a directory. Missing ones are skipped.
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap",
	}
	// readOnlyPaths are bound read-only over themselves. /proc/sys is among
	// them, but /proc/sys/net stays writable: a network plugin sets
	// forwarding and per-link sysctls, and that directory shows the
	// network namespace of whoever opens a file in it (the node's or a
	// pod's), never the host's kernel settings (/proc/sys/kernel,
	// /proc/sys/vm...).
	readOnlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sysrq-trigger"}
)

// protectProc masks and write-protects those paths inside the new root.
func protectProc(rootFD int) error {
	// /proc/sys read-only but /proc/sys/net writable: bind net onto
	// itself, then /proc/sys recursively (which carries the net bind
	// along) and remount only the top read-only.
	if err := bindSelf(rootFD, "/proc/sys/net", false, 0); err != nil {
		return err
	}
	if err := bindSelf(rootFD, "/proc/sys", true, unix.MS_RDONLY); err != nil {
		return err
	}
	for _, p := range readOnlyPaths {
		if err := bindSelf(rootFD, p, false, unix.MS_RDONLY); err != nil {
			return err
		}
	}
	null, err := openIn(rootFD, "/dev/null")
	if err != nil {
		return fmt.Errorf("mask: %w", err)
	}
	defer unix.Close(null)
	for _, p := range maskedPaths {
		fd, err := openIn(rootFD, p)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		at := fdPath(fd)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.Mount("skein-sandbox", at, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=1,mode=0555")
		} else if err == nil {
			err = unix.Mount(fdPath(null), at, "", unix.MS_BIND, "")
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	return nil
}

// bindSelf binds p over itself (recursively with rec) and remounts that
// bind with flags (plus nosuid, nodev, noexec). A missing p is skipped.
func bindSelf(rootFD int, p string, rec bool, flags uintptr) error {
	fd, err := openIn(rootFD, p)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	bind := uintptr(unix.MS_BIND)
	if rec {
		bind |= unix.MS_REC
	}
	err = unix.Mount(fdPath(fd), fdPath(fd), "", bind, "")
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	// Look it up again to reach the new mount rather than what it covers.
	if fd, err = openIn(rootFD, p); err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	defer unix.Close(fd)
	const nsx = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("", fdPath(fd), "", unix.MS_REMOUNT|unix.MS_BIND|nsx|flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", p, err)
	}
	return nil
}

// openIn opens p (a file or directory, not followed if a symlink) inside
// the tree at rootFD as an O_PATH descriptor.
func openIn(rootFD int, p string) (int, error) {
	return unix.Openat2(rootFD, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
}

func fdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

package harness

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// WatchedDirs are the host directories that the real runtimes the tests and
// the demo start (dockerd, containerd and its shims, runc, podman, cnitool)
// write outside the temporary directories they are given. Host.Paths lists
// each one's existence and its entries two levels down, so a run that leaves
// something there fails the host check.
var WatchedDirs = []string{
	"/etc/docker", "/run/docker", "/var/lib/docker",
	"/run/containerd", "/var/lib/containerd",
	"/etc/cni", "/var/lib/cni",
}

// FirstRunPaths are what those runtimes create on the first run ever on a
// machine, whatever directories they are told to use: dockerd writes its
// trust key to /etc/docker/key.json, containerd's shims put their sockets
// under /run/containerd/s, cnitool caches results under /var/lib/cni/results
// (not configurable; the tests delete their own entries), and podman's CNI
// backend leaves its lock in /etc/cni/net.d, and skeind serving Docker
// makes /run/docker/plugins for its socket (dockerd's own first start
// would). A machine where they ran before keeps them; a fresh one did not
// have them. Deepest first: TidyFirstRun removes them in this order.
var FirstRunPaths = []string{
	"/etc/docker/key.json", "/etc/docker",
	"/run/docker/plugins", "/run/docker",
	"/run/containerd/s", "/run/containerd",
	"/var/lib/cni/results", "/var/lib/cni",
	"/etc/cni/net.d/cni.lock",
}

// Existing returns which of paths exist now.
func Existing(paths []string) map[string]bool {
	out := map[string]bool{}
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			out[p] = true
		}
	}
	return out
}

// TidyFirstRun removes the FirstRunPaths that did not exist before a run
// (existed is Existing(FirstRunPaths) taken before it) and exist now: what
// that run created, and nothing else. A directory goes only when it is
// empty, so anything else a run left in it still shows in the host check.
// It returns what it removed.
func TidyFirstRun(existed map[string]bool) ([]string, error) {
	var removed []string
	var errs []error
	for _, p := range FirstRunPaths {
		if existed[p] {
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			if ents, err := os.ReadDir(p); err != nil || len(ents) > 0 {
				continue // not empty: left for the host check to show
			}
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s (created by this run): %w", p, err))
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// readPaths describes WatchedDirs: "dir <path>" for each that exists and
// "path <path> <type>" for every entry up to two levels below it.
func readPaths() []string {
	var out []string
	for _, d := range WatchedDirs {
		if _, err := os.Lstat(d); err != nil {
			continue
		}
		out = append(out, "dir "+d)
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || p == d {
				return nil
			}
			out = append(out, fmt.Sprintf("path %s %v", p, e.Type()))
			if rel, _ := filepath.Rel(d, p); e.IsDir() && depth(rel) >= 2 {
				return filepath.SkipDir
			}
			return nil
		})
	}
	slices.Sort(out)
	return out
}

// depth is the number of elements of a relative path.
func depth(rel string) int {
	n := 1
	for _, c := range rel {
		if c == filepath.Separator {
			n++
		}
	}
	return n
}

// TidyNetNSDir undoes what the first namespace pinned on a machine does to
// NetNSDir (made, then bind-mounted onto itself, as iproute2 and podman
// do), when the directory did not exist before a run (existed false) and
// nothing is pinned there any more: its mounts of itself go and so does
// the directory. It reports whether it removed the directory. With pins
// left, or a directory that existed, it does nothing.
func TidyNetNSDir(existed bool) (bool, error) {
	if existed {
		return false, nil
	}
	ents, err := os.ReadDir(NetNSDir)
	if err != nil || len(ents) > 0 {
		return false, nil
	}
	for i := 0; i < 16; i++ {
		if err := unix.Unmount(NetNSDir, unix.MNT_DETACH); err != nil {
			break // EINVAL: not a mount point any more
		}
	}
	if err := os.Remove(NetNSDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove %s (created by this run): %w", NetNSDir, err)
	}
	return true, nil
}

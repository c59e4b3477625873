package netns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// maxLayers bounds the loops that take stacked mounts off one path.
const maxLayers = 16

// PrepareDir makes dir (created if missing) a mount point of its own with
// shared propagation, exactly as `ip netns add` and podman do to /run/netns
// on first use. Create calls it before every pin; it is idempotent, does its
// work once per directory and process, and the mount stays, as theirs does.
//
// Why it matters: before their first pin, iproute2 and podman try
// `mount --make-shared` on the directory; when that fails because it is no
// mount point (EINVAL), they bind-mount it onto itself, recursively, and try
// again. That bind covers the directory. Every namespace pinned there before
// it is hidden under the new mount: its copy on top can be unmounted, but the
// hidden original keeps the file busy, so the file can no longer be removed
// ("device or resource busy") and the namespace stays alive. On a fresh
// machine the first podman run of a test session did exactly that to the
// namespaces the tests had made before it. Once the directory is a mount
// point, those tools only make it shared again and cover nothing.
//
// When PrepareDir itself has to make the bind and the directory already holds
// pins made by others (containerd, for one, pins without preparing), it
// detaches the originals the bind hides, through descriptors opened before
// the bind; their copies on the new mount stay. So PrepareDir never hides a
// pin. Callers in several processes are serialized by an flock on dir; tools
// that do not take it can still race with the first preparation, as they race
// with each other.
func PrepareDir(dir string) error {
	// Once per directory and process: making a tree shared again walks
	// every pin below it, which would make n Creates cost n² (benchmarks
	// pin thousands).
	if _, done := prepared.Load(dir); done {
		return nil
	}
	if err := prepareDir(dir); err != nil {
		return err
	}
	prepared.Store(dir, true)
	return nil
}

// prepared holds the directories PrepareDir has prepared in this process.
var prepared sync.Map

func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns directory: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open netns directory: %w", err)
	}
	defer d.Close() // releases the lock
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock netns directory %s: %w", dir, err)
	}
	err = makeShared(dir)
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	// Not a mount point yet: bind it onto itself, carrying the pins below
	// it over, then detach the originals the bind hides.
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("resolve netns directory: %w", err)
	}
	below, err := openMountsBelow(resolved)
	defer func() {
		for _, f := range below {
			f.Close()
		}
	}()
	if err != nil {
		return err
	}
	if err := unix.Mount(resolved, resolved, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind netns directory %s onto itself: %w", resolved, err)
	}
	for _, f := range below {
		// Through the descriptor the path resolves to the original, now
		// under the bind; EINVAL: detached with a parent already.
		err := unix.Unmount(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.MNT_DETACH)
		if err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detach %s hidden by the bind of %s: %w", f.Name(), resolved, err)
		}
	}
	if err := makeShared(resolved); err != nil {
		return fmt.Errorf("make netns directory %s shared after binding it: %w", resolved, err)
	}
	return nil
}

func makeShared(dir string) error {
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make netns directory %s shared: %w", dir, err)
	}
	return err
}

// openMountsBelow opens (O_PATH) every mount point strictly below dir, as
// listed in this process's mountinfo.
func openMountsBelow(dir string) ([]*os.File, error) {
	table, err := MountTable()
	if err != nil {
		return nil, err
	}
	var out []*os.File
	for _, m := range table {
		p := m.Point
		if !strings.HasPrefix(p, dir+"/") {
			continue
		}
		fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return out, fmt.Errorf("open mount point %s: %w", p, err)
		}
		out = append(out, os.NewFile(uintptr(fd), p))
	}
	return out, nil
}

// Mount is one entry of a mount table, paths unescaped.
type Mount struct {
	Root   string // the mounted directory's path inside its file system
	Point  string // where it is mounted
	FSType string
	Source string
}

// MountTable reads /proc/self/mountinfo: the mounts of the calling
// thread's mount namespace, hidden ones included, in the kernel's order.
func MountTable() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - type source superopts
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || sep+2 >= len(fields) {
			return nil, fmt.Errorf("read mount table: unexpected line %q", sc.Text())
		}
		out = append(out, Mount{
			Root: unescapeMountinfo(fields[3]), Point: unescapeMountinfo(fields[4]),
			FSType: fields[sep+1], Source: unescapeMountinfo(fields[sep+2]),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) in a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeHidden deletes path whose pin is hidden under a later mount of its
// directory. The hidden mount cannot be reached by path, and unlink(2)
// refuses a file that is a mount point anywhere in the caller's mount
// namespace. So a locked thread takes a private copy of the mount table,
// uncovers the file there (detaching, in the copy only, the mounts on top of
// it and of its directory) and unlinks it. Deleting the file makes the
// kernel detach every mount on it in every mount namespace: the hidden
// original in the real table goes too.
func removeHidden(path string) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread leaves the process's mount namespace,
		// so it must end with this goroutine instead of running others.
		runtime.LockOSThread()
		errc <- unlinkUncovered(path)
	}()
	return <-errc
}

func unlinkUncovered(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return fmt.Errorf("private mount table: %w", err)
	}
	// The copy's mounts are peers of the real ones until made private:
	// nothing below may propagate back.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mount table: %w", err)
	}
	dir := filepath.Dir(path)
	for i := 0; i < maxLayers; i++ {
		err := unix.Unlink(path)
		if !errors.Is(err, unix.EBUSY) {
			return err
		}
		// Take off the top layer: the file's own mount if it has one,
		// else the mount covering its directory.
		err = unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) {
			err = unix.Unmount(dir, unix.MNT_DETACH)
		}
		if err != nil {
			return fmt.Errorf("uncover %s: %w", path, err)
		}
	}
	return fmt.Errorf("still a mount point after %d layers: %w", maxLayers, unix.EBUSY)
}

package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"
)

// A network's state directory is the one place a plugin writes that
// outlives its call, and it is a host directory: left alone, a plugin could
// fill the host's disk through it. So the sandbox mounts a tmpfs of
// Options.StateSize bytes and Options.StateInodes files over each state
// directory the first time a call uses it, in the daemon's mount namespace
// (the host's, for a daemon on the host), and binds that into every call as
// before. Its pages are charged to the memory cgroup of the call that
// wrote them.
//
// What it keeps, and for how long:
//   - between calls and across main exec restarts: everything, as before;
//   - across a daemon restart: everything. Close leaves the mounts; a new
//     Sandbox finds a tmpfs already mounted on the directory and adopts it
//     (remounted with the current limits);
//   - across a reboot (or the end of a pod's mount namespace, for a daemon
//     in a container without bidirectional propagation on the state
//     directory): nothing. After a reboot no pod network exists, and
//     plugins' del of an unknown container succeeds;
//   - what the directory held on disk when it was first mounted is copied
//     into the tmpfs and removed from the disk (so that a reboot does not
//     bring back a stale copy). An upgrade from an unlimited state
//     directory keeps its state that way.
//
// ReleaseState unmounts one (the network's state is then gone).

type stateMounts struct {
	mu   sync.Mutex
	seen map[string]bool // directories mounted or adopted by this Sandbox
}

// prepareState makes sure dir is a size-limited tmpfs.
func (s *Sandbox) prepareState(dir string) error {
	if s.opts.StateSize < 0 {
		return nil
	}
	s.state.mu.Lock()
	defer s.state.mu.Unlock()
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if mounted && s.state.seen[dir] {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	opts := fmt.Sprintf("mode=%o,size=%d,nr_inodes=%d", st.Mode&0o7777, s.opts.StateSize, s.opts.StateInodes)
	const flags = unix.MS_NOSUID | unix.MS_NODEV
	if mounted {
		// A daemon before this one mounted it: adopt it, with today's
		// limits.
		var fsst unix.Statfs_t
		if err := unix.Statfs(dir, &fsst); err != nil {
			return err
		}
		if fsst.Type != unix.TMPFS_MAGIC {
			return fmt.Errorf("state directory %s: a mount point, but not a tmpfs the sandbox made", dir)
		}
		if err := unix.Mount("", dir, "", unix.MS_REMOUNT|flags, opts); err != nil {
			return fmt.Errorf("state directory %s: apply limits: %w", dir, err)
		}
	} else if err := mountState(dir, flags, opts); err != nil {
		return err
	}
	if s.state.seen == nil {
		s.state.seen = map[string]bool{}
	}
	s.state.seen[dir] = true
	return nil
}

// mountState mounts the tmpfs over dir and moves dir's contents into it.
func mountState(dir string, flags uintptr, opts string) (err error) {
	// A descriptor opened before the mount keeps naming the directory
	// underneath it.
	under, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer under.Close()
	if err := unix.Mount("skein-state", dir, "tmpfs", flags, opts); err != nil {
		return fmt.Errorf("state directory %s: mount tmpfs: %w", dir, err)
	}
	defer func() {
		if err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	}()
	old := fmt.Sprintf("/proc/self/fd/%d", under.Fd())
	if err := os.CopyFS(dir, os.DirFS(old)); err != nil {
		return fmt.Errorf("state directory %s: move its contents into the tmpfs: %w", dir, err)
	}
	ents, err := os.ReadDir(old)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(old, e.Name())); err != nil {
			return fmt.Errorf("state directory %s: remove the copied contents from the disk: %w", dir, err)
		}
	}
	return nil
}

// ReleaseState unmounts the tmpfs the sandbox made over a state directory:
// what the network's plugins kept there is gone. For a network removed for
// good (and for tests). A directory that is not mounted is left alone.
func (s *Sandbox) ReleaseState(dir string) error {
	// Inits prepared with the directory bound would keep its tmpfs alive.
	if s.prepared != nil {
		s.prepared.forget(func(l *sandboxinit.Spec) bool { return l.StateDir == dir })
	}
	s.state.mu.Lock()
	defer s.state.mu.Unlock()
	delete(s.state.seen, dir)
	mounted, err := isMountPoint(dir)
	if err != nil || !mounted {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("release state directory %s: %w", dir, err)
	}
	return nil
}

// isMountPoint reports whether dir is the root of a mount (on another
// device than its parent, or the same file system mounted there again).
func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

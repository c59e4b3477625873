// Package unixsock makes skein's UNIX sockets: mode 0600 from the moment
// anyone but their owner could reach them, never chmod'ed after the fact.
//
// bind(2) creates a socket file with the process's umask, and a chmod
// after it leaves a window in which anyone may connect (skeind's sockets
// hand out addresses and tap descriptors). Changing the umask around
// bind would be process-wide and race other goroutines' files. So the
// socket is bound in a fresh directory of mode 0700 beside its final path,
// given mode 0600 there, and renamed into place, which also replaces a
// stale socket atomically.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
)

// Listener is a listening UNIX socket at a path. Close also removes the
// socket file, unless another socket has replaced it since.
type Listener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
}

// Listen listens on network ("unix" or "unixpacket") at path with mode
// 0600. The directory is created (0755) if missing. A socket already at
// path (a stale one) is replaced; anything else there is an error and is
// left alone.
func Listen(network, path string) (_ *Listener, err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != fs.ModeSocket {
		return nil, fmt.Errorf("%s exists and is not a socket (%v): not replacing it", path, fi.Mode().Type())
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	private, err := os.MkdirTemp(dir, ".s") // mode 0700
	if err != nil {
		return nil, fmt.Errorf("private directory for socket %s: %w", path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	l, err := net.ListenUnix(network, &net.UnixAddr{Name: tmp, Net: network})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false) // its name moves; Close removes the final one
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	// Nobody but the owner can reach tmp inside the 0700 directory.
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("move socket into place at %s: %w", path, err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return &Listener{UnixListener: l, path: path, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// Path is where the socket is.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket file if it is still this
// listener's.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	var st syscall.Stat_t
	if syscall.Lstat(l.path, &st) == nil && uint64(st.Dev) == l.dev && st.Ino == l.ino {
		_ = os.Remove(l.path)
	}
	return err
}

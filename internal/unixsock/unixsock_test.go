package unixsock

import (
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
)

// withUmask runs the test with a permissive umask, the worst case: a
// socket bound in place would be 0777.
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func TestListen(t *testing.T) {
	withUmask(t, 0)
	dir := t.TempDir()
	for _, network := range []string{"unix", "unixpacket"} {
		path := filepath.Join(dir, network+".sock")
		l, err := Listen(network, path)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want a socket of mode 0600", network, err, fi.Mode())
		}
		c, err := net.Dial(network, path)
		if err != nil {
			t.Fatalf("%s: dial: %v", network, err)
		}
		c.Close()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("%s: socket left after Close: %v", network, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".s*")); len(left) != 0 {
		t.Errorf("private directories left: %v", left)
	}
}

// TestNeverLooser watches the socket path while sockets are made there
// over and over: it must never be seen with any permission for group or
// others. Listening in place and chmod'ing afterwards (what skeind did)
// is caught here thousands of times in 300 rounds.
func TestNeverLooser(t *testing.T) {
	withUmask(t, 0)
	path := filepath.Join(t.TempDir(), "s.sock")
	var stop atomic.Bool
	var loose atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			if fi, err := os.Lstat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
				loose.Add(1)
			}
		}
	}()
	for range 300 {
		l, err := Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	stop.Store(true)
	<-done
	if n := loose.Load(); n > 0 {
		t.Fatalf("the socket was seen %d times with group or other permissions", n)
	}
}

// TestReplace: a stale socket is replaced; a file that is not a socket is
// refused and left alone; Close of a replaced listener leaves the new
// socket in place.
func TestReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	old, err := Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen("unix", path)
	if err != nil {
		t.Fatalf("replacing a stale socket: %v", err)
	}
	old.Close()
	if c, err := net.Dial("unix", path); err != nil {
		t.Fatalf("the new socket went with the old listener: %v", err)
	} else {
		c.Close()
	}
	l.Close()

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix", file); err == nil {
		t.Fatal("a regular file was replaced by a socket")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Fatalf("the regular file changed: %q, %v", b, err)
	}
}

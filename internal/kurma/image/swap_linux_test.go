package image

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestPinnedFileUnpacksWhatItHashed: a pinned file:// archive that is
// rewritten in place after its first open (fanotify holds every open of it
// until the test has rewritten it: the file changed between the hash and
// the unpack) is unpacked from the bytes that were hashed, never the new
// content under the pinned digest.
func TestPinnedFileUnpacksWhatItHashed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fanotify permission events need root")
	}
	top := t.TempDir()
	path := writeACI(t, filepath.Join(top, "image.aci"), append(pluginEnts(), file("which", "good")), false)
	good := readAll(t, path)
	evil := readAll(t, writeACI(t, filepath.Join(top, "evil.aci"), append(pluginEnts(), file("which", "evil")), false))
	opens := rewriteAfterFirstOpen(t, path, evil)

	img, release, err := acquire(t, newCache(t, Options{}), Source{Image: "file://" + path, Digest: sha256Bytes(good)})
	t.Logf("the archive was opened %d times", opens.Load())
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := readFile(t, img.Root, "which"); got != "good" {
		t.Fatalf("unpacked the %q archive under the digest of the good one", got)
	}
}

// rewriteAfterFirstOpen holds each open of path (a fanotify permission
// event) and, from the second on, replaces its content with b before
// letting the open go on. It returns the count of opens.
func rewriteAfterFirstOpen(t *testing.T, path string, b []byte) *atomic.Int64 {
	t.Helper()
	fan, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDWR)
	if err != nil {
		t.Fatalf("fanotify: %v", err)
	}
	if err := unix.FanotifyMark(fan, unix.FAN_MARK_ADD, unix.FAN_OPEN_PERM, unix.AT_FDCWD, path); err != nil {
		unix.Close(fan)
		t.Fatalf("fanotify mark: %v", err)
	}
	var opens atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			select {
			case <-stop:
				return
			default:
			}
			fds := []unix.PollFd{{Fd: int32(fan), Events: unix.POLLIN}}
			if n, _ := unix.Poll(fds, 50); n <= 0 {
				continue
			}
			n, err := unix.Read(fan, buf)
			if err != nil {
				continue
			}
			const metaLen = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))
			for off := 0; off+metaLen <= n; {
				ev := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
				if ev.Fd >= 0 {
					if opens.Add(1) > 1 {
						unix.Ftruncate(int(ev.Fd), 0)
						unix.Pwrite(int(ev.Fd), b, 0)
					}
					resp := make([]byte, 8)
					binary.NativeEndian.PutUint32(resp[0:], uint32(ev.Fd))
					binary.NativeEndian.PutUint32(resp[4:], unix.FAN_ALLOW)
					unix.Write(fan, resp)
					unix.Close(int(ev.Fd))
				}
				off += int(ev.Event_len)
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		unix.Close(fan)
	})
	return &opens
}

func readAll(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha256Bytes(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

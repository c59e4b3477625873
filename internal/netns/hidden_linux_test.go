package netns_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// The tests here mount and unmount things in the directories they pin
// namespaces in. Each runs again in a child process with a mount namespace
// of its own (private propagation: Go's exec makes / rprivate when it
// unshares CLONE_NEWNS), so nothing they do reaches the host's mount table,
// also when they fail half-way.

const (
	childEnv = "SKEIN_NETNS_TEST_CHILD"
	dirEnv   = "SKEIN_NETNS_TEST_DIR" // the parent's temporary directory
)

// inPrivateMounts reports whether the calling test is the copy running in
// the child. In the parent it runs the child, fails the test if the child
// did not pass, and returns false: the caller returns at once.
func inPrivateMounts(t *testing.T) bool {
	t.Helper()
	harness.RequireRoot(t)
	if os.Getenv(childEnv) == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	// The parent owns the directory: it removes it after the child (and
	// with it every mount the child made) is gone, also if the child fails.
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), dirEnv+"="+t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s in a private mount namespace: %v\n%s", t.Name(), err, out)
	}
	return false
}

// pinDir is the shared pin directory, /run/netns, as a fresh machine has
// it: the child covers /run with an empty tmpfs of its own (its mounts are
// private, the host's /run is untouched), so /run/netns is a plain
// directory and no mount point yet. Every layer is unmounted when the
// child's test ends.
func pinDir(t *testing.T) string {
	t.Helper()
	// The host's own /run/netns mounts (copies in this private namespace)
	// would still be listed under the tmpfs: take them off here first.
	for i := 0; i < 8 && unix.Unmount("/run/netns", unix.MNT_DETACH) == nil; i++ {
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("cover /run in the child: %v", err)
	}
	dir := "/run/netns"
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 8 && unix.Unmount(dir, unix.MNT_DETACH) == nil; i++ {
		}
		_ = unix.Unmount("/run", unix.MNT_DETACH)
	})
	return dir
}

// mountsAt returns the mountinfo lines of the mounts whose mount point is
// path (in this process's mount namespace, hidden ones included).
func mountsAt(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == path {
			out = append(out, sc.Text())
		}
	}
	return out
}

// podmanPrepare does to dir what podman (containers/common pkg/netns) and
// `ip netns add` do to /run/netns before their first pin: make it shared,
// and if it is no mount point yet (EINVAL), bind it onto itself, with
// everything mounted below, first.
func podmanPrepare(t *testing.T, dir string) {
	t.Helper()
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatalf("bind %s onto itself: %v", dir, err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		t.Fatalf("make %s shared: %v", dir, err)
	}
}

// assertGone checks that nothing is left of a removed pin: no file, no
// mount at its path (not even one hidden under a later mount).
func assertGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Remove (lstat: %v)", path, err)
	}
	if m := mountsAt(t, path); len(m) > 0 {
		t.Errorf("mounts left at %s after Remove:\n%s", path, strings.Join(m, "\n"))
	}
}

// TestRemoveAfterPodmanPrepare is the fresh-machine failure: a pin made
// before podman's (or iproute2's) first run in the same directory must
// stay removable. Before netns.Create prepared the directory itself, the
// bind hid the pin and Remove failed with "device or resource busy".
func TestRemoveAfterPodmanPrepare(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	dir := pinDir(t)
	early := filepath.Join(dir, "early")
	if err := netns.Create(early); err != nil {
		t.Fatal(err)
	}
	podmanPrepare(t, dir)
	late := filepath.Join(dir, "late")
	if err := netns.Create(late); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{early, late} {
		if err := netns.IsNetNS(p); err != nil {
			t.Errorf("after podman's preparation: %v", err)
		}
		if err := netns.Remove(p); err != nil {
			t.Errorf("Remove: %v", err)
		}
		assertGone(t, p)
	}
}

// TestRemoveHiddenPin: even when something binds the directory onto
// itself regardless (a tool that does not check first), Remove takes the
// pin away, the hidden original included.
func TestRemoveHiddenPin(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	dir := pinDir(t)
	p := filepath.Join(dir, "hidden")
	if err := netns.Create(p); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // twice: one recursive copy on top of another
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := netns.Remove(p); err != nil {
		t.Fatalf("Remove of a pin under two binds of its directory: %v", err)
	}
	assertGone(t, p)
	if err := netns.Remove(p); err != nil {
		t.Errorf("Remove again: %v", err)
	}
}

// TestPrepareKeepsForeignPins: a pin another tool made before the
// directory was prepared (containerd pins without preparing) stays
// removable by that tool's plain umount and unlink after netns.Create has
// prepared the directory.
func TestPrepareKeepsForeignPins(t *testing.T) {
	if !inPrivateMounts(t) {
		return
	}
	dir := pinDir(t)
	foreign := filepath.Join(dir, "foreign")
	if err := os.WriteFile(foreign, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/net", foreign, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	ours := filepath.Join(dir, "ours")
	if err := netns.Create(ours); err != nil {
		t.Fatal(err)
	}
	if err := netns.IsNetNS(foreign); err != nil {
		t.Errorf("the foreign pin after Create prepared its directory: %v", err)
	}
	if err := unix.Unmount(foreign, 0); err != nil {
		t.Errorf("umount of the foreign pin: %v", err)
	}
	if err := unix.Unlink(foreign); err != nil {
		t.Errorf("unlink of the foreign pin (as its owner would, without netns.Remove): %v", err)
	}
	assertGone(t, foreign)
	if err := netns.Remove(ours); err != nil {
		t.Error(err)
	}
	assertGone(t, ours)
}

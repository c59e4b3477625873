package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// newPreparedEnv is an env whose calls must take an init prepared for
// their layout.
func newPreparedEnv(t *testing.T, o Options) *testEnv {
	t.Helper()
	o.Prestart = 1
	e := newEnv(t, o)
	e.start = "prepared"
	return e
}

// waitPrepared primes spec's layout and waits until an init is prepared
// for it; it returns the layout's key.
func (e *testEnv) waitPrepared(t *testing.T, spec Spec) string {
	t.Helper()
	key := e.sb.prime(spec)
	if key == "" {
		t.Fatal("spec has no layout")
	}
	for end := time.Now().Add(5 * time.Second); e.sb.prepared.count(key) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no init prepared after 5 s")
		}
	}
	return key
}

// preparedInits returns the inits prepared for key.
func (e *testEnv) preparedInits(key string) []*warmInit {
	e.sb.prepared.mu.Lock()
	defer e.sb.prepared.mu.Unlock()
	if li := e.sb.prepared.layouts[key]; li != nil {
		return append([]*warmInit(nil), li.ready...)
	}
	return nil
}

// waitExited waits until every init of ws has been waited for.
func waitExited(t *testing.T, ws []*warmInit) {
	t.Helper()
	for _, w := range ws {
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(w.cmd.Process.Pid))); errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("prepared init %d still runs", w.cmd.Process.Pid)
			}
		}
	}
}

// startedAs runs spec with e.sb.Run and says how it started.
func (e *testEnv) startedAs(t *testing.T, spec Spec) (*Result, string) {
	t.Helper()
	c, w, p := e.sb.pool.cold.Load(), e.sb.pool.warm.Load(), e.sb.pool.prep.Load()
	res, err := e.sb.Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case e.sb.pool.prep.Load() > p:
		return res, "prepared"
	case e.sb.pool.warm.Load() > w:
		return res, "warm"
	case e.sb.pool.cold.Load() > c:
		return res, "cold"
	}
	t.Fatal("the call counted no start")
	return nil, ""
}

// TestPreparedImageReplaced: an image unpacked again at the same path
// after an init was prepared for it is a new layout. The call runs the new
// image, not the one the init built on.
func TestPreparedImageReplaced(t *testing.T) {
	e := newPreparedEnv(t, Options{})
	spec := e.spec(`{"mode":"probe","secret":"/marker"}`)
	key := e.waitPrepared(t, spec)
	old := e.preparedInits(key)

	// The new image: a copy of the old with a marker file.
	if err := os.Rename(e.rootfs, e.rootfs+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(e.rootfs, os.DirFS(e.rootfs+".old")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"opt/network/add", "opt/network/del", "bin/main"} {
		os.Chmod(filepath.Join(e.rootfs, p), 0o755)
	}
	os.Remove(filepath.Join(e.rootfs, "var/run"))
	os.Symlink("/run", filepath.Join(e.rootfs, "var/run"))
	if err := os.WriteFile(filepath.Join(e.rootfs, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res, how := e.startedAs(t, spec)
	var r probeReport
	if err := json.Unmarshal(res.Stdout, &r); err != nil {
		t.Fatal(err)
	}
	if r.Secret == nil || *r.Secret != "" {
		got := "no report"
		if r.Secret != nil {
			got = *r.Secret
		}
		t.Errorf("the call found no /marker (%s): it ran on the old image (started %s)", got, how)
	}
	if how == "prepared" {
		t.Error("the call took an init prepared for the old image")
	}
	// The old image's init is still there, unused, until the layout idles
	// out; the new layout gets its own.
	if e.sb.prepared.count(key) != len(old) {
		t.Errorf("the old layout has %d inits, want %d untouched", e.sb.prepared.count(key), len(old))
	}
	e.waitPrepared(t, spec)
	if _, how := e.startedAs(t, spec); how != "prepared" {
		t.Errorf("the second call of the new image started %s, want prepared", how)
	}
}

// TestPreparedStateReleased: releasing a state directory ends the inits
// prepared with it bound (they would keep its tmpfs alive), and the next
// call gets the directory as it is now.
func TestPreparedStateReleased(t *testing.T) {
	e := newPreparedEnv(t, Options{})
	spec := e.spec(`{"mode":"probe"}`)
	key := e.waitPrepared(t, spec)
	ws := e.preparedInits(key)
	if err := os.WriteFile(filepath.Join(e.state, "old"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.sb.ReleaseState(e.state); err != nil {
		t.Fatal(err)
	}
	if n := e.sb.prepared.count(key); n != 0 {
		t.Errorf("%d inits still prepared with the released state directory", n)
	}
	waitExited(t, ws)
	// The next call mounts a fresh tmpfs: the old file is gone with the
	// old one, and the call does not see it.
	if _, err := e.run(t, context.Background(), e.spec(`{"mode":"probe"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.state, "old")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released tmpfs's file is still visible: %v", err)
	}
}

// TestPreparedStaleView: a namespace pinned after an init was prepared, in
// a directory whose mounts do not propagate, is not what that init would
// show at the path. The call notices, starts another way and sees the
// namespace.
func TestPreparedStaleView(t *testing.T) {
	e := newPreparedEnv(t, Options{})
	priv := privateDir(t, e)
	early := filepath.Join(priv, "early")
	if err := netns.Create(early); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(early) })
	p := Plugin{Rootfs: e.rootfs, Config: []byte(`{"mode":"probe"}`), StateDir: e.state}
	e.waitPrepared(t, p.Call(OpAdd, early, "uuid", "eth0"))

	late := filepath.Join(priv, "late")
	if err := netns.Create(late); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(late) })
	var st unix.Stat_t
	if err := unix.Stat(late, &st); err != nil {
		t.Fatal(err)
	}
	res, how := e.startedAs(t, p.Call(OpAdd, late, "uuid", "eth0"))
	var r probeReport
	if err := json.Unmarshal(res.Stdout, &r); err != nil {
		t.Fatal(err)
	}
	if r.NetNSMagic != unix.NSFS_MAGIC || r.NetNSIno != st.Ino {
		t.Errorf("the call (started %s) saw %s as magic %#x ino %d, want the namespace (ino %d)", how, late, r.NetNSMagic, r.NetNSIno, st.Ino)
	}
	if how == "prepared" {
		t.Error("the call took the init prepared before the pin")
	}
}

// TestPreparedBounded: at most maxLayouts layouts keep inits, the least
// recently used go first, and a layout unused for the idle time loses its
// inits; the inits dropped exit.
func TestPreparedBounded(t *testing.T) {
	e := newPreparedEnv(t, Options{})
	var keys []string
	var first []*warmInit
	for i := range maxLayouts + 2 {
		dir := filepath.Join(e.dir, "state-"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.sb.ReleaseState(dir) })
		spec := e.spec(`{"mode":"ok"}`)
		spec.StateDir = dir
		keys = append(keys, e.waitPrepared(t, spec))
		if i == 0 {
			first = e.preparedInits(keys[0])
		}
	}
	e.sb.prepared.mu.Lock()
	n := len(e.sb.prepared.layouts)
	e.sb.prepared.mu.Unlock()
	if n != maxLayouts {
		t.Errorf("%d layouts kept, want %d", n, maxLayouts)
	}
	if e.sb.prepared.count(keys[0]) != 0 || e.sb.prepared.count(keys[1]) != 0 {
		t.Error("the least recently used layouts kept their inits")
	}
	waitExited(t, first)

	// Idle: the layouts left go once unused for the idle time.
	e.sb.prepared.mu.Lock()
	e.sb.prepared.idle = 100 * time.Millisecond
	e.sb.prepared.mu.Unlock()
	last := e.preparedInits(keys[len(keys)-1])
	spec := e.spec(`{"mode":"ok"}`)
	spec.StateDir = filepath.Join(e.dir, "state-"+strconv.Itoa(len(keys)-1))
	e.sb.prime(spec) // re-arms the layout's timer with the short idle
	time.Sleep(500 * time.Millisecond)
	if c := e.sb.prepared.count(keys[len(keys)-1]); c != 0 {
		t.Errorf("an idle layout kept %d inits", c)
	}
	waitExited(t, last)
}

// TestPreparedBuildFails: a layout that cannot be built (an image whose
// /proc is a file) fails its calls with a setup error, and is not prepared
// again and again in the background.
func TestPreparedBuildFails(t *testing.T) {
	e := newPreparedEnv(t, Options{})
	if err := os.WriteFile(filepath.Join(e.rootfs, "proc"), []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := e.spec(`{"mode":"ok"}`)
	for range 5 {
		_, err := e.sb.Run(context.Background(), spec)
		if !errors.Is(err, ErrSetup) {
			t.Fatalf("err = %v, want a setup error", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := e.sb.prepared.attempts.Load(); n > 1 {
		t.Errorf("the layout was prepared %d times; want at most once until a call of it works", n)
	}
}

// TestPreparedNice: a prepared init builds and waits at aheadNice, so
// refilling after a burst does not compete with the burst's calls; the
// call it serves runs at the default priority.
func TestPreparedNice(t *testing.T) {
	e := newPreparedEnv(t, Options{})
	if !e.sb.canNice {
		t.Skip("this process cannot lower a nice value here (no CAP_SYS_NICE in the initial user namespace, or already at 19): inits started ahead are not reniced")
	}
	spec := e.spec(`{"mode":"probe"}`)
	key := e.waitPrepared(t, spec)
	for _, w := range e.preparedInits(key) {
		n, err := unix.Getpriority(unix.PRIO_PROCESS, w.cmd.Process.Pid)
		// The raw system call answers 20 - nice.
		if err != nil || 20-n != aheadNice {
			t.Errorf("prepared init %d: nice %d (%v), want %d", w.cmd.Process.Pid, 20-n, err, aheadNice)
		}
	}
	own := ownNice(t)
	for i := range 3 {
		res, how := e.startedAs(t, spec)
		if how != "prepared" {
			t.Fatalf("call %d started %s, want prepared", i, how)
		}
		var r probeReport
		if err := json.Unmarshal(res.Stdout, &r); err != nil {
			t.Fatal(err)
		}
		if r.Nice != own {
			t.Errorf("call %d ran at nice %d, want %d as this process", i, r.Nice, own)
		}
		e.waitPrepared(t, spec)
	}
}

// ownNice is the nice value of the calling thread, which the threads that
// start inits share.
func ownNice(t *testing.T) int {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	return 20 - prio
}

// TestCanLowerNiceInUserNamespace: inside a user namespace the capability
// set says CAP_SYS_NICE but the kernel refuses to lower a nice value, and
// canLowerNice must say no (every claim of a reniced init would fail).
func TestCanLowerNiceInUserNamespace(t *testing.T) {
	if os.Getenv("SANDBOX_TEST_CANNICE") != "" {
		// The child, in its user namespace.
		if canLowerNice() {
			os.Exit(3)
		}
		os.Exit(0)
	}
	if !canLowerNice() {
		t.Skip("this process cannot lower a nice value even outside a user namespace")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestCanLowerNiceInUserNamespace$")
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_CANNICE=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 3:
		t.Fatal("in a user namespace canLowerNice said yes; the kernel refuses it there")
	case err != nil:
		t.Fatalf("child in a user namespace: %v\n%s", err, out)
	}
}

// TestPreparedNiceEveryThread: a claimed init gets its nice value back on
// every thread, not only the main one: exec waits for the Go runtime's
// other threads to exit. Waiting, every thread is at aheadNice: the init
// is forked from a thread at that value, so each of its threads is born
// there.
func TestPreparedNiceEveryThread(t *testing.T) {
	// The Go init's threads (skein-sandbox-exec has one).
	e := newPreparedEnv(t, Options{ExecPath: "-"})
	if !e.sb.canNice {
		t.Skip("this process cannot lower a nice value here (no CAP_SYS_NICE in the initial user namespace, or already at 19): inits started ahead are not reniced")
	}
	spec := e.spec(`{"mode":"probe"}`)
	key := e.waitPrepared(t, spec)
	nices := func(pid int) map[int]int {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]int{}
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			if prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil {
				out[tid] = 20 - prio
			}
		}
		return out
	}
	own := ownNice(t)
	inits := e.preparedInits(key)
	if len(inits) == 0 {
		t.Fatal("no prepared init")
	}
	for _, w := range inits {
		pid := w.cmd.Process.Pid
		before := nices(pid)
		if len(before) < 2 {
			t.Fatalf("init %d has %d thread(s): nothing to check beyond the main one", pid, len(before))
		}
		for tid, n := range before {
			if n != aheadNice {
				t.Errorf("waiting init %d, thread %d: nice %d, want %d", pid, tid, n, aheadNice)
			}
		}
		if err := w.restoreNice(); err != nil {
			t.Fatal(err)
		}
		for tid, n := range nices(pid) {
			if n != own {
				t.Errorf("claimed init %d, thread %d: nice %d, want %d as this process", pid, tid, n, own)
			}
		}
	}
}

package sandbox

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

func (e *testEnv) mainSpec(cfg string) Spec {
	return Spec{Rootfs: e.rootfs, Path: "/bin/main", Stdin: []byte(cfg), StateDir: e.state,
		NetNSDirs: []string{filepath.Dir(e.netns)}}
}

// starts reads the start times the main exec recorded.
func (e *testEnv) starts(t *testing.T) []time.Time {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.state, "starts"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []time.Time
	for _, l := range strings.Fields(string(b)) {
		n, _ := strconv.ParseInt(l, 10, 64)
		out = append(out, time.Unix(0, n))
	}
	return out
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestSupervisorRestartsWithBackoff: a main exec that dies 100 ms after
// each start is restarted after 200, 400, 800, 800 ms (capped); while it is
// down Err explains it, while it runs Err is nil.
func TestSupervisorRestartsWithBackoff(t *testing.T) {
	e := newEnv(t, Options{})
	sv, err := e.sb.Supervise(SupervisorOptions{Network: "net1", Spec: e.mainSpec(`{"mode":"die-after","ms":100}`),
		MinBackoff: 200 * time.Millisecond, MaxBackoff: 800 * time.Millisecond, StableAfter: 10 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	var sawUp, sawDown bool
	var downErr error
	for end := time.Now().Add(3200 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		err := sv.Err()
		if (err == nil) != sv.Up() {
			// Racing a change of state; try again.
			continue
		}
		if err == nil {
			sawUp = true
		} else {
			sawDown, downErr = true, err
		}
	}
	if !sawUp || !sawDown {
		t.Fatalf("saw up %v, down %v; want both", sawUp, sawDown)
	}
	if !errors.Is(downErr, ErrMainExecDown) {
		t.Errorf("down error %v does not wrap ErrMainExecDown", downErr)
	}
	msg := downErr.Error()
	for _, w := range []string{`main exec of network "net1" is down (restarting in `, "last exit: /bin/main: exit status 3", "boom: main exec giving up"} {
		if !strings.Contains(msg, w) {
			t.Errorf("down error %q lacks %q", msg, w)
		}
	}
	// Stopped first, so that no restart races the counts below.
	sv.Close()
	st := e.starts(t)
	if len(st) < 4 {
		t.Fatalf("%d starts in 3.2 s, want at least 4", len(st))
	}
	// Gap = 100 ms run + backoff (+ start overhead; generous for a loaded
	// machine, still short of the next doubling: 1700 ms uncapped).
	want := []time.Duration{300, 500, 900, 900}
	for i := 1; i < len(st) && i <= len(want); i++ {
		gap := st[i].Sub(st[i-1])
		lo, hi := want[i-1]*time.Millisecond, (want[i-1]+700)*time.Millisecond
		if gap < lo || gap > hi {
			t.Errorf("restart %d came %v after the previous start, want %v..%v", i, gap, lo, hi)
		}
	}
	// The supervisor counts a start when the process starts; the main exec
	// records it once it has read its stdin, so a start the Close cut short
	// may be counted and not recorded.
	if s := sv.Status(); s.Starts != len(st) && s.Starts != len(st)+1 {
		t.Errorf("status counts %d starts, the main exec recorded %d", s.Starts, len(st))
	}
}

// TestSupervisorRecovers: a main exec failing its first two starts is up
// after the backoffs, and stays up; Close stops it and Err says so.
func TestSupervisorRecovers(t *testing.T) {
	e := newEnv(t, Options{})
	sv, err := e.sb.Supervise(SupervisorOptions{Network: "net2", Spec: e.mainSpec(`{"mode":"die-until","n":2}`),
		MinBackoff: 100 * time.Millisecond, StopGrace: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for sv.Status().Starts < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if err := sv.Err(); err != nil || !sv.Up() {
		t.Fatalf("after two failed runs: up %v, err %v; want up", sv.Up(), err)
	}
	if s := sv.Status(); s.Starts != 3 || s.PID == 0 || !strings.Contains(s.LastExit, "start 2 fails") {
		t.Errorf("status %+v: want 3 starts, a pid, the last failure remembered", s)
	}
	sv.Close()
	if err := sv.Err(); err == nil || !strings.Contains(err.Error(), `main exec of network "net2" is stopped`) {
		t.Errorf("after Close: err %v", err)
	}
}

// TestSupervisorCloseKillsTree: Close ends a main exec that ignores SIGTERM
// and the grandchild it forked, at once: as PID 1 of its namespace it
// would never see the SIGTERM, so waiting out the grace is pointless.
func TestSupervisorCloseKillsTree(t *testing.T) {
	e := newEnv(t, Options{})
	token := fmt.Sprintf("main-token-%d-%d", os.Getpid(), time.Now().UnixNano())
	sv, err := e.sb.Supervise(SupervisorOptions{Network: "net3", Spec: e.mainSpec(`{"mode":"ignore-term","token":"` + token + `"}`),
		StopGrace: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for len(processesWith(t, token)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(processesWith(t, token)) == 0 {
		t.Fatal("the main exec's grandchild never showed up")
	}
	begin := time.Now()
	sv.Close()
	if d := time.Since(begin); d > time.Second {
		t.Errorf("Close took %v, want a kill at once, not the 2 s grace", d)
	}
	if p := processesWith(t, token); len(p) > 0 {
		t.Errorf("processes survived Close: %v", p)
	}
	if n := sv.Status().Starts; n != 1 {
		t.Errorf("%d starts; Close must not restart it", n)
	}
	sv.Close() // twice is fine
}

// TestSupervisorCloseTermsHandler: a main exec with a SIGTERM handler
// gets the SIGTERM (and exits on it, well within the grace).
func TestSupervisorCloseTermsHandler(t *testing.T) {
	e := newEnv(t, Options{})
	sv, err := e.sb.Supervise(SupervisorOptions{Network: "net5", Spec: e.mainSpec(`{"mode":"handle-term"}`),
		StopGrace: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); len(e.starts(t)) == 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // past signal.Notify
	begin := time.Now()
	sv.Close()
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Close took %v: the handler did not get SIGTERM", d)
	}
	if _, err := os.Stat(filepath.Join(e.state, "term")); err != nil {
		t.Errorf("the main exec saw no SIGTERM: %v", err)
	}
}

// TestSupervisorBadSpec: a main exec that cannot start at all is an error
// at once, and nothing keeps retrying it.
func TestSupervisorBadSpec(t *testing.T) {
	e := newEnv(t, Options{})
	spec := e.mainSpec(`{}`)
	spec.Path = "/bin/missing"
	_, err := e.sb.Supervise(SupervisorOptions{Network: "net4", Spec: spec, Logger: quiet})
	if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), `start main exec of network "net4": /bin/missing: sandbox setup failed`) {
		t.Fatalf("err = %v, want a setup error", err)
	}
}

// TestMainExecSeesNewPins: a main exec bound to a shared pin directory
// (as /run/netns is) sees namespaces pinned after it started, as
// namespaces, and stops seeing removed ones: the host's mounts reach the
// sandbox (slave propagation), which fully private copies would not do.
func TestMainExecSeesNewPins(t *testing.T) {
	e := newEnv(t, Options{})
	dir := filepath.Join(e.dir, "shared-netns")
	if err := netns.PrepareDir(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	early := filepath.Join(dir, "early")
	if err := netns.Create(early); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(early) })
	spec := e.mainSpec(`{"mode":"watch","dir":"` + dir + `"}`)
	spec.NetNSDirs = []string{dir}
	sv, err := e.sb.Supervise(SupervisorOptions{Network: "net5", Spec: spec, StopGrace: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	seen := func(want string) {
		t.Helper()
		var got string
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			b, _ := os.ReadFile(filepath.Join(e.state, "seen"))
			if got = string(b); got == want {
				return
			}
		}
		t.Fatalf("the main exec sees\n%s\nwant\n%s", got, want)
	}
	seen("early nsfs\n")
	late := filepath.Join(dir, "late")
	if err := netns.Create(late); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(late) })
	seen("early nsfs\nlate nsfs\n")
	if err := netns.Remove(early); err != nil {
		t.Fatal(err)
	}
	seen("late nsfs\n")
}

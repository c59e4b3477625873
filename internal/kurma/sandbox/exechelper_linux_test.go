package sandbox

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"
	"github.com/skeinnet/skein/test/harness"
)

// helperRun starts skein-sandbox-exec on its own (no sandbox around it:
// the protocol only) with the three descriptors a prepared init leaves it,
// writes call to its call pipe and closes it, and returns what it said on
// the ready and status pipes, its stdout and how it exited.
func helperRun(t *testing.T, call []byte) (ready, status, stdout string, code int) {
	t.Helper()
	pipe := func() (r, w *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		return r, w
	}
	statusR, statusW := pipe()
	callR, callW := pipe()
	readyR, readyW := pipe()
	parent, child := []*os.File{statusR, callW, readyR}, []*os.File{statusW, callR, readyW}
	cmd := exec.Command(execBin)
	cmd.Env = []string{}
	cmd.ExtraFiles = child // fds 3, 4, 5
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, f := range child {
		f.Close()
	}
	r, _ := io.ReadAll(readyR)
	callW.Write(call)
	callW.Close()
	s, _ := io.ReadAll(statusR)
	err := cmd.Wait()
	for _, f := range parent {
		f.Close()
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	return string(r), string(s), out.String(), code
}

// TestExecHelperProtocol: skein-sandbox-exec says ready at once, execs a
// well-formed call with exactly its arguments and environment, exits
// quietly on an empty call (the sandbox no longer needs it), and refuses
// anything else with a reason on the status pipe and status 127, without
// exec'ing.
func TestExecHelperProtocol(t *testing.T) {
	needExecHelper(t)
	// The executable: a shell printing what it got; a marker file proves
	// it ran.
	dir := t.TempDir()
	script := filepath.Join(dir, "show")
	ran := filepath.Join(dir, "ran")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch "+ran+"\necho \"$0|$*|$FOO|$(ls /proc/self/fd | tr '\\n' ' ')\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var self unix.Stat_t
	if err := unix.Stat(script, &self); err != nil {
		t.Fatal(err)
	}
	call := func(mut func(is *sandboxinit.Spec)) []byte {
		is := &sandboxinit.Spec{Path: script, Args: []string{"a b", ""}, Env: []string{"FOO=bar baz"},
			Expect: []sandboxinit.FileID{{Path: script, Dev: self.Dev, Ino: self.Ino}}}
		if mut != nil {
			mut(is)
		}
		raw, err := encodeCall(is)
		if err != nil {
			t.Fatal(err)
		}
		return append(raw, sandboxinit.GoMsg...)
	}
	good := call(nil)

	t.Run("exec", func(t *testing.T) {
		ready, status, out, code := helperRun(t, good)
		if ready != sandboxinit.ReadyMsg || status != "" || code != 0 {
			t.Fatalf("ready %q, status %q, exit %d", ready, status, code)
		}
		// argv[0] is the path; "a b" and "" are two arguments; only 0, 1,
		// 2 and the shell's own listing descriptor are open.
		if want := script + "|a b |bar baz|0 1 2 3 \n"; out != want {
			t.Errorf("the executable printed %q, want %q", out, want)
		}
	})
	t.Run("many arguments", func(t *testing.T) {
		count := filepath.Join(dir, "count")
		if err := os.WriteFile(count, []byte("#!/bin/sh\necho $#\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		raw, err := encodeCall(&sandboxinit.Spec{Path: count, Args: make([]string, 70000)})
		if err != nil {
			t.Fatal(err)
		}
		_, status, out, code := helperRun(t, append(raw, sandboxinit.GoMsg...))
		if status != "" || code != 0 || out != "70000\n" {
			t.Errorf("status %q, exit %d, out %q; want 70000 arguments", status, code, out)
		}
	})
	t.Run("empty", func(t *testing.T) {
		os.Remove(ran)
		ready, status, out, code := helperRun(t, nil)
		if ready != sandboxinit.ReadyMsg || status != "" || out != "" || code != 0 {
			t.Fatalf("ready %q, status %q, out %q, exit %d; want a quiet exit", ready, status, out, code)
		}
	})

	bad := []struct {
		name string
		call []byte
		want string
	}{
		{"no go", good[:len(good)-len(sandboxinit.GoMsg)], "closed the call without a go"},
		{"half a go", good[:len(good)-1], "want the go"},
		{"something after the go", append(append([]byte{}, good...), 'x'), "want the go"},
		{"something instead of the go", append(good[:len(good)-len(sandboxinit.GoMsg):len(good)-len(sandboxinit.GoMsg)], "\nstop\n"...), "want the go"},
		{"device not a number", []byte("skein-call/1\x00/bin/true\x000\x000\x001\x00/x\x00d\x001\x00" + sandboxinit.GoMsg), "not a number"},
		{"inode negative", []byte("skein-call/1\x00/bin/true\x000\x000\x001\x00/x\x001\x00-1\x00" + sandboxinit.GoMsg), "not a number"},
		{"wrong magic", append([]byte("skein-call/2"), good[len("skein-call/1"):]...), "not a call this init knows"},
		{"missing fields", []byte("skein-call/1\x00/bin/true\x003\x00a\x00" + sandboxinit.GoMsg), "ends early"},
		{"count not a number", []byte("skein-call/1\x00/bin/true\x00-1\x000\x000\x00" + sandboxinit.GoMsg), "not a number"},
		{"count too large", []byte("skein-call/1\x00/bin/true\x0099999999999999999999\x000\x000\x00" + sandboxinit.GoMsg), "out of range"},
		{"count with junk", []byte("skein-call/1\x00/bin/true\x001x\x00" + sandboxinit.GoMsg), "out of range"},
		{"unterminated field", []byte("skein-call/1\x00/bin/true" + sandboxinit.GoMsg), "not terminated"},
		{"trailing field", []byte("skein-call/1\x00/bin/true\x000\x000\x000\x00extra\x00" + sandboxinit.GoMsg), "more after the call's last field"},
		{"stale file", call(func(is *sandboxinit.Spec) { is.Expect[0].Ino++ }), sandboxinit.StaleView + script + " is another file here"},
		{"missing file", call(func(is *sandboxinit.Spec) { is.Expect[0].Path = dir + "/gone" }), sandboxinit.StaleView + dir + "/gone: errno 2"},
		{"exec fails", call(func(is *sandboxinit.Spec) { is.Path = dir }), "exec " + dir + ": errno 13"},
		{"too long", append(make([]byte, 4<<20+1), sandboxinit.GoMsg...), "too long"},
		{"count over the bytes left", []byte("skein-call/1\x00/bin/true\x0050\x00a\x00" + sandboxinit.GoMsg), "out of range"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(ran)
			ready, status, out, code := helperRun(t, c.call)
			if ready != sandboxinit.ReadyMsg || code != 127 || !strings.Contains(status, c.want) || out != "" {
				t.Errorf("ready %q, status %q, out %q, exit %d; want %q and 127", ready, status, out, code, c.want)
			}
			if _, err := os.Stat(ran); err == nil {
				t.Error("the executable ran")
			}
		})
	}
}

// TestWordErrno: the helper's numbers read as the Go init's words.
func TestWordErrno(t *testing.T) {
	for in, want := range map[string]string{
		"exec /x: errno 2":            "exec /x: " + syscall.ENOENT.Error(),
		"stale view of /y: errno 13":  "stale view of /y: " + syscall.EACCES.Error(),
		"exec /x: no such file":       "exec /x: no such file",
		"exec /x: errno 99999":        "exec /x: errno 99999",
		"exec /x: errno 2 and more":   "exec /x: errno 2 and more",
		"exec /errno 5/x: errno 8":    "exec /errno 5/x: " + syscall.ENOEXEC.Error(),
		"read spec: errno 0":          "read spec: errno 0",
		"the call ends early: errno ": "the call ends early: errno ",
	} {
		if got := wordErrno(in); got != want {
			t.Errorf("wordErrno(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestEncodeCallRefusesNUL: a NUL cannot reach exec, and would shift every
// later field for the helper.
func TestEncodeCallRefusesNUL(t *testing.T) {
	for _, is := range []*sandboxinit.Spec{
		{Path: "/bin/x\x00y"},
		{Path: "/bin/x", Args: []string{"a\x00"}},
		{Path: "/bin/x", Env: []string{"A=\x00"}},
		{Path: "/bin/x", Expect: []sandboxinit.FileID{{Path: "/p\x00"}}},
	} {
		if raw, err := encodeCall(is); err == nil {
			t.Errorf("encodeCall(%+v) = %q, want an error", is, raw)
		}
	}
}

// TestExecHelperMustBeStatic: the Sandbox uses a helper only when it is a
// static program for this machine. A dynamically linked one would have
// its ELF interpreter loaded from the plugin's image (the tenant's code,
// run before the call and without the go); a script, a program for
// another machine or a missing file are no helper either. Each is logged,
// and prepared inits exec calls themselves.
func TestExecHelperMustBeStatic(t *testing.T) {
	needExecHelper(t)
	dir := t.TempDir()
	dynamic := filepath.Join(dir, "dynamic")
	if out, err := exec.Command(cmp.Or(os.Getenv("CC"), "cc"), "-O2", "-o", dynamic, "../../../cmd/skein-sandbox-exec/exec.c").CombinedOutput(); err != nil {
		t.Fatalf("build a dynamic helper: %v\n%s", err, out)
	}
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, want string
	}{
		{"static", execBin, ""},
		{"dynamic", dynamic, "dynamically linked"},
		{"script", script, "not an ELF program"},
		{"missing", filepath.Join(dir, "missing"), "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log strings.Builder
			sb, err := New(Options{ScratchDir: filepath.Join(dir, "scratch-"+c.name), Prestart: -1, ExecPath: c.path,
				Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if used := sb.execFile != nil; used != (c.want == "") || !strings.Contains(log.String(), c.want) {
				t.Errorf("helper used: %v; log %q, want it to say %q", used, log.String(), c.want)
			}
		})
	}
	f, err := os.Open(execBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	other := map[bool]string{true: "arm64", false: "amd64"}[runtime.GOARCH == "amd64"]
	if err := staticFor(f, other); err == nil || !strings.Contains(err.Error(), "not for "+other) {
		t.Errorf("the helper passes for %s: %v", other, err)
	}
}

// TestExecHelperFailsToExec: a helper that passes the checks but cannot be
// exec'd (not executable here) fails the preparation that tries it once:
// the Sandbox says so and prepares its inits without it from then on, and
// calls run.
func TestExecHelperFailsToExec(t *testing.T) {
	needExecHelper(t)
	broken := filepath.Join(t.TempDir(), DefaultExecName)
	copyFile(t, execBin, broken)
	if err := os.Chmod(broken, 0o644); err != nil {
		t.Fatal(err)
	}
	var log harness.SyncBuffer
	e := newPreparedEnv(t, Options{ExecPath: broken, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if e.sb.execFile == nil {
		t.Fatal("the Sandbox refused the helper before trying it")
	}
	spec := e.spec(`{"mode":"ok"}`)
	e.sb.prime(spec)
	// The switch is set before the warning is written: wait for both.
	said := func() bool { return strings.Contains(log.String(), "could not exec the exec helper") }
	for end := time.Now().Add(5 * time.Second); !e.sb.execOff.Load() || !said(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after 5 s: helper turned off %v, log %q", e.sb.execOff.Load(), log.String())
		}
	}
	// The failed layout is tried again after a call of it succeeds.
	if _, err := e.sb.Run(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	attempts := e.sb.prepared.attempts.Load()
	for range 3 {
		if _, err := e.run(t, context.Background(), spec); err != nil { // prepared, without the helper
			t.Fatal(err)
		}
	}
	if e.sb.pool.viaHelper.Load() != 0 {
		t.Errorf("%d calls went through the broken helper", e.sb.pool.viaHelper.Load())
	}
	if n := e.sb.prepared.attempts.Load() - attempts; n > 4 {
		t.Errorf("%d preparations for 3 calls", n)
	}
}

package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The hostile-image tests: each runs a plugin that tries one way out of the
// sandbox (testdata/plugin, mode "hostile") and checks that it fails and
// that the host is as it was. Each of them passes a plugin through the
// sandbox before its confinement (issue 19) only when the probe succeeds,
// i.e. each fails against that code.

// hostile runs probe and decodes its report.
func (e *testEnv) hostile(t *testing.T, probe string, extra string) map[string]any {
	t.Helper()
	res, err := e.run(t, context.Background(), e.spec(`{"mode":"hostile","probe":"`+probe+`"`+extra+`}`))
	if err != nil {
		t.Fatalf("probe %s: %v", probe, err)
	}
	r := map[string]any{}
	if err := json.Unmarshal(res.Stdout, &r); err != nil {
		t.Fatalf("probe %s: %v\n%s", probe, err, res.Stdout)
	}
	t.Logf("probe %s: %v", probe, r)
	return r
}

// assertNoCgroups checks that no cgroup of this process's calls is left
// once sb is closed.
func assertNoCgroups(t *testing.T, sb *Sandbox) {
	t.Helper()
	if sb.cgroups == nil {
		t.Fatal("the sandbox runs without cgroups")
	}
	// Close stops the warm inits (each waits in cgroups of its own) and
	// waits for the removals running in the background.
	sb.Close()
	for _, c := range sb.cgroups.ctrls {
		ents, _ := os.ReadDir(c.parent)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), fmt.Sprintf("%d-", os.Getpid())) {
				t.Errorf("cgroup %s left behind", filepath.Join(c.parent, e.Name()))
			}
		}
	}
}

func wantErr(t *testing.T, r map[string]any, key, want string) {
	t.Helper()
	got, _ := r[key].(string)
	if !strings.Contains(got, want) {
		t.Errorf("%s: error %q, want %q", key, got, want)
	}
}

// TestHostileCorePattern: the kernel's settings under /proc/sys (the
// core_pattern a core dump would pipe to, as root on the host) do not open
// for writing; the network ones, which plugins set, do; /proc's
// information leaks are masked.
func TestHostileCorePattern(t *testing.T) {
	before, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil {
		t.Fatal(err)
	}
	bothStarts(t, Options{}, func(t *testing.T, e *testEnv) {
		r := e.hostile(t, "core_pattern", "")
		wantErr(t, r, "corePattern", "read-only file system")
		wantErr(t, r, "sysVM", "read-only file system")
		if r["netSysctl"] != "" {
			t.Errorf("/proc/sys/net is not writable: %v", r["netSysctl"])
		}
		for _, k := range []string{"kcore", "keys", "timerList"} {
			if got, _ := r[k].(string); !strings.HasPrefix(got, "0 bytes") {
				t.Errorf("/proc %s not masked: read %s", k, got)
			}
		}
		if got, _ := r["acpi"].(string); !strings.HasPrefix(got, "0 entries") {
			t.Errorf("/proc/acpi not masked: %s", got)
		}
	})
	if after, _ := os.ReadFile("/proc/sys/kernel/core_pattern"); string(after) != string(before) {
		t.Errorf("core_pattern changed: %q → %q", before, after)
	}
}

// TestHostileShocker: open_by_handle_at with a made-up handle (inode 2, the
// root of the ext4 file system the state directory lives on) does not
// reach the host's file system.
func TestHostileShocker(t *testing.T) {
	bothStarts(t, Options{}, func(t *testing.T, e *testEnv) {
		r := e.hostile(t, "shocker", "")
		wantErr(t, r, "openByHandle", "operation not permitted")
		if r["reached"] != nil {
			t.Errorf("the plugin listed the host file system's root: %v", r["reached"])
		}
	})
}

// TestHostileForkBomb: 200 processes are capped at the call's pids limit,
// and all of them die with the call: no process, no cgroup left.
func TestHostileForkBomb(t *testing.T) {
	bothStarts(t, Options{PidsLimit: 32}, func(t *testing.T, e *testEnv) {
		token := fmt.Sprintf("forkbomb-token-%d-%d", os.Getpid(), time.Now().UnixNano())
		r := e.hostile(t, "forkbomb", `,"n":200,"token":"`+token+`"`)
		if n, _ := r["started"].(float64); n >= 32 || n < 1 {
			t.Errorf("started %v processes; want at least one and fewer than the limit of 32 tasks", n)
		}
		wantErr(t, r, "err", "resource temporarily unavailable")
		if p := processesWith(t, token); len(p) > 0 {
			t.Errorf("processes survived the call: %v", p)
		}
		assertNoCgroups(t, e.sb)
	})
}

// TestHostileMemory: a plugin allocating past the call's memory limit is
// OOM-killed inside its own cgroup; the caller (skeind, here the test) goes
// on, and the cgroup is gone.
func TestHostileMemory(t *testing.T) {
	bothStarts(t, Options{MemoryLimit: 64 << 20}, func(t *testing.T, e *testEnv) {
		_, err := e.run(t, context.Background(), e.spec(`{"mode":"hostile","probe":"memory","mb":512}`))
		var se *Error
		if !errors.As(err, &se) || !errors.Is(err, ErrExit) || se.Signal != "killed" {
			t.Fatalf("err = %v; want the plugin killed (SIGKILL by the OOM killer)", err)
		}
		// The sandbox still works.
		if _, err := e.run(t, context.Background(), e.spec(`{"mode":"ok"}`)); err != nil {
			t.Errorf("a call after the OOM kill: %v", err)
		}
		assertNoCgroups(t, e.sb)
	})
}

// TestHostileTerminal: a daemon started from a shell has a controlling
// terminal; a call must not, else a plugin could open it through /dev/tty
// and, with CAP_SYS_ADMIN, push input into the administrator's shell
// (TIOCSTI). The test gives a child daemon a pseudo-terminal of its own.
func TestHostileTerminal(t *testing.T) {
	e := newEnv(t, Options{Prestart: -1})
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here (/dev/ptmx: %v)", err)
	}
	defer ptmx.Close()
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pts.Close()
	raw, err := json.Marshal(e.spec(`{"mode":"hostile","probe":"tty"}`))
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), ttyParentEnv+"="+string(raw), ttyParentEnv+"_SCRATCH="+filepath.Join(e.dir, "tty-scratch"))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Run(); err != nil {
		t.Fatalf("the daemon with a terminal: %v\n%s", err, errOut.String())
	}
	r := map[string]any{}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	t.Logf("probe tty: %v", r)
	if r["ttyNr"] != "0" {
		t.Errorf("the call has a controlling terminal (tty_nr %v)", r["ttyNr"])
	}
	wantErr(t, r, "devTty", "no such device or address")
}

// TestHostilePrivileges: no module loading, mounting, unmounting the masks,
// host name changes, user namespaces or device nodes; no_new_privs and the
// seccomp filter are on, and the capability sets (a program the plugin
// execs included) are PluginCapabilities. The call runs in its own
// cgroups.
func TestHostilePrivileges(t *testing.T) {
	bothStarts(t, Options{}, func(t *testing.T, e *testEnv) {
		r := e.hostile(t, "privs", "")
		for _, k := range []string{"finitModule", "initModule", "deleteModule", "mount", "umountProc", "sethostname", "unshareUser", "mknod"} {
			wantErr(t, r, k, "operation not permitted")
		}
		if r["NoNewPrivs"] != "1" || r["Seccomp"] != "2" {
			t.Errorf("NoNewPrivs %v, Seccomp %v; want 1 and 2 (filter)", r["NoNewPrivs"], r["Seccomp"])
		}
		want := fmt.Sprintf("%016x", capMask(PluginCapabilities))
		for _, k := range []string{"CapPrm", "CapEff", "CapBnd", "childCapEff"} {
			if r[k] != want {
				t.Errorf("%s = %v, want %s", k, r[k], want)
			}
		}
		for _, k := range []string{"CapInh", "CapAmb"} {
			if r[k] != "0000000000000000" {
				t.Errorf("%s = %v, want none", k, r[k])
			}
		}
		cg, _ := r["cgroup"].(string)
		for _, c := range []string{"pids", "memory"} {
			if !strings.Contains(cg, ":"+c+":") || !strings.Contains(cg, "/"+DefaultCgroupName+"/"+fmt.Sprint(os.Getpid())+"-") {
				t.Errorf("the call's %s cgroup is not its own:\n%s", c, cg)
			}
		}
		assertNoCgroups(t, e.sb)
	})
}

// TestHostileFillState: writing past the state directory's size fails with
// ENOSPC inside the call and the host's disk gets nothing. The directory is
// a tmpfs that keeps what plugins wrote across calls and across a new
// Sandbox (a daemon restart), and took over what the directory held.
func TestHostileFillState(t *testing.T) {
	e := newEnv(t, Options{Prestart: -1, StateSize: 4 << 20})
	if err := e.sb.ReleaseState(e.state); err != nil { // newEnv mounted it
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.state, "before"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.hostile(t, "fillstate", `,"mb":64`)
	wantErr(t, r, "err", "no space left on device")
	if n, _ := r["writtenMB"].(float64); n > 4 {
		t.Errorf("wrote %v MiB into a 4 MiB state directory", n)
	}
	// A new Sandbox (skeind restarted) adopts the tmpfs: the files are
	// still there, and so is the limit.
	sb2, err := New(Options{ScratchDir: e.sb.opts.ScratchDir, Prestart: -1, StateSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	res, err := sb2.Run(context.Background(), e.spec(`{"mode":"hostile","probe":"fillstate","mb":1,"token":"-after-restart"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Stdout), "no space left on device") {
		t.Errorf("after a restart the state directory is not full any more: %s", res.Stdout)
	}
	if b, err := os.ReadFile(filepath.Join(e.state, "before")); err != nil || string(b) != "kept" {
		t.Errorf("the state directory's earlier contents: %q, %v", b, err)
	}
	var fsst syscallStatfs
	if err := statfs(e.state, &fsst); err != nil || fsst.Type != tmpfsMagic {
		t.Errorf("state directory is not a tmpfs (type %#x, %v)", fsst.Type, err)
	}
	// Released, the disk directory underneath holds nothing of it.
	if err := e.sb.ReleaseState(e.state); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(e.state)
	if len(ents) != 0 {
		t.Errorf("host disk directory holds %d entries after the release, want none", len(ents))
	}
}

type syscallStatfs = unix.Statfs_t

const tmpfsMagic = unix.TMPFS_MAGIC

func statfs(p string, st *unix.Statfs_t) error { return unix.Statfs(p, st) }

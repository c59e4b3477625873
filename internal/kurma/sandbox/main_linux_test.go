package sandbox

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/netns"
)

// pluginBin is the test plugin (testdata/plugin) built static for the run;
// initBin is cmd/skein-sandbox-init, built the way make builds it; execBin
// is cmd/skein-sandbox-exec, built the way make builds it ("" without a C
// compiler: see needExecHelper).
var pluginBin, initBin, execBin string

// execBuildErr says why execBin could not be built.
var execBuildErr string

func TestMain(m *testing.M) {
	// The package's init already ran the hook; saying it here documents
	// that this binary doubles as the sandbox init.
	MaybeRunInit()
	if raw := os.Getenv(parentEnv); raw != "" {
		os.Exit(dyingParent(raw))
	}
	if raw := os.Getenv(ttyParentEnv); raw != "" {
		os.Exit(ttyParent(raw))
	}
	os.Exit(run(m))
}

// parentEnv makes the test binary a parent that starts a sandbox call (the
// Spec in the variable, as JSON) and is SIGKILLed 500 ms later, as skeind
// could be.
const parentEnv = "SANDBOX_TEST_DYING_PARENT"

func dyingParent(raw string) int {
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sb, err := New(Options{ScratchDir: os.Getenv(parentEnv + "_SCRATCH")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Its warm inits must die with it too: say which they are.
	for end := time.Now().Add(5 * time.Second); len(sb.pool.ready) < DefaultPrestart && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	sb.pool.mu.Lock()
	for range len(sb.pool.ready) {
		w := <-sb.pool.ready
		fmt.Printf("warm %d\n", w.cmd.Process.Pid)
		sb.pool.ready <- w
	}
	sb.pool.mu.Unlock()
	time.AfterFunc(500*time.Millisecond, func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
	_, err = sb.Run(context.Background(), spec)
	fmt.Fprintln(os.Stderr, "the call returned before the parent died:", err)
	return 1
}

// ttyParentEnv makes the test binary a daemon with a controlling
// terminal (skeind started from a shell) that runs one call, the Spec in
// the variable, and prints its output.
const ttyParentEnv = "SANDBOX_TEST_TTY_PARENT"

func ttyParent(raw string) int {
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sb, err := New(Options{ScratchDir: os.Getenv(ttyParentEnv + "_SCRATCH"), Prestart: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer sb.Close()
	res, err := sb.Run(context.Background(), spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Stdout.Write(res.Stdout)
	return 0
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "sandbox tests need root (mount and PID namespaces)")
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "sandbox-plugin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pluginBin = filepath.Join(dir, "plugin")
	initBin = filepath.Join(dir, DefaultInitName)
	for bin, pkg := range map[string]string{pluginBin: "./testdata/plugin", initBin: "../../../cmd/skein-sandbox-init"} {
		build := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
			return 1
		}
	}
	execBin = filepath.Join(dir, DefaultExecName)
	cc := cmp.Or(os.Getenv("CC"), "cc")
	if out, err := exec.Command(cc, "-O2", "-Wall", "-Wextra", "-Werror", "-static", "-o", execBin, "../../../cmd/skein-sandbox-exec/exec.c").CombinedOutput(); err != nil {
		execBin, execBuildErr = "", fmt.Sprintf("%s: %v\n%s", cc, err, out)
	}
	return m.Run()
}

// needExecHelper skips a test that needs skein-sandbox-exec where no C
// compiler with a static libc could build it (make build needs one too,
// and scripts/install-deps.sh installs it).
func needExecHelper(t testing.TB) {
	t.Helper()
	needRoot(t)
	if execBin == "" {
		t.Skipf("skein-sandbox-exec could not be built (no C compiler with a static libc?): %s", execBuildErr)
	}
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 || pluginBin == "" {
		t.Skip("needs root")
	}
}

// env is one test's world: an image rootfs holding the test plugin, a state
// directory, a scratch directory and a pinned pod namespace, all under the
// test's temporary directory, plus the host mount table to compare at the
// end.
type testEnv struct {
	dir, rootfs, state, netns string
	sb                        *Sandbox
	// start is how e.run's calls must start: "cold" (the default), "warm"
	// or "prepared".
	start string
}

func newEnv(t testing.TB, o Options) *testEnv {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	e := &testEnv{dir: dir, rootfs: filepath.Join(dir, "rootfs"), state: filepath.Join(dir, "state"),
		netns: filepath.Join(dir, "netns", "pod1")}
	for _, p := range []string{"opt/network", "bin", "var"} {
		if err := os.MkdirAll(filepath.Join(e.rootfs, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"opt/network/add", "opt/network/del", "bin/main"} {
		copyFile(t, pluginBin, filepath.Join(e.rootfs, p))
	}
	// As in Debian images: /var/run is an absolute link to /run.
	if err := os.Symlink("/run", filepath.Join(e.rootfs, "var/run")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(e.state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := netns.Create(e.netns); err != nil {
		t.Fatal(err)
	}
	if o.ScratchDir == "" {
		o.ScratchDir = filepath.Join(dir, "scratch")
	}
	if o.ExecPath == "" {
		// As installed: prepared inits exec calls through the helper
		// (needExecHelper's tests say when it could not be built).
		o.ExecPath = cmp.Or(execBin, "-")
	}
	before := mountTable(t)
	// The state directory's tmpfs is mounted on a network's first call, so
	// warm inits started before it hold a stale view and that call starts
	// cold; the tests that count warm starts want it there from the start.
	if err := (&Sandbox{opts: o.withDefaults()}).prepareState(e.state); err != nil {
		t.Fatal(err)
	}
	sb, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.sb = sb
	t.Cleanup(func() { sb.Close() })
	t.Cleanup(func() {
		// The state directory's tmpfs outlives the Sandbox by design.
		if err := sb.ReleaseState(e.state); err != nil {
			t.Error(err)
		}
		assertMountsUnchanged(t, before, mountTable(t), dir)
		if err := netns.Remove(e.netns); err != nil {
			t.Error(err)
		}
	})
	return e
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// spec is a call of /opt/network/add with config cfg in the env's pod.
func (e *testEnv) spec(cfg string) Spec {
	p := Plugin{Rootfs: e.rootfs, Config: []byte(cfg), StateDir: e.state}
	return p.Call(OpAdd, e.netns, "146d7cef-fbf6-41da-a2f8-eba218597f9c", "eth0")
}

func mountTable(t testing.TB) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Drop the mount ID and parent ID: compare what is mounted where.
		fields := strings.Fields(sc.Text())
		lines = append(lines, strings.Join(fields[2:], " "))
	}
	return lines
}

// mountDiff is the lines only in a and the lines only in b that concern
// the test (a mount point under dir, or the sandbox's own "skein-sandbox"
// source), and the other differences (other programs on the machine mount
// and unmount while the tests run).
func mountDiff(a, b []string, dir string) (ours, foreign []string) {
	concerns := func(l string) bool {
		f := strings.Fields(l)
		return len(f) > 2 && (strings.HasPrefix(f[2], dir) || strings.Contains(l, " skein-sandbox "))
	}
	add := func(l, sign string) {
		if concerns(l) {
			ours = append(ours, sign+l)
		} else {
			foreign = append(foreign, sign+l)
		}
	}
	for _, l := range a {
		if !slices.Contains(b, l) {
			add(l, "-")
		}
	}
	for _, l := range b {
		if !slices.Contains(a, l) {
			add(l, "+")
		}
	}
	return ours, foreign
}

func assertMountsUnchanged(t testing.TB, before, after []string, dir string) {
	t.Helper()
	ours, foreign := mountDiff(before, after, dir)
	if len(ours) > 0 {
		t.Errorf("host mount table changed by the test:\n%s", strings.Join(ours, "\n"))
	}
	if len(foreign) > 0 {
		t.Logf("mount table changes by other programs (ignored):\n%s", strings.Join(foreign, "\n"))
	}
}

// processesWith lists the host processes whose command line contains token.
func processesWith(t testing.TB, token string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), token) {
			continue
		}
		out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}

// bothStarts runs f against a sandbox that starts every call cold, one
// that keeps warm inits only (and makes every call take one), and one that
// keeps inits prepared for the call's layout (and makes every call take
// one of those), once with skein-sandbox-exec as installed and once
// without it ("prepared-go": the Go init execs the call itself).
func bothStarts(t *testing.T, o Options, f func(t *testing.T, e *testEnv)) {
	for _, start := range []string{"cold", "warm", "prepared", "prepared-go"} {
		t.Run(start, func(t *testing.T) {
			o := o
			o.Prestart = map[string]int{"cold": -1, "warm": 2, "prepared": 2, "prepared-go": 2}[start]
			helper := start == "prepared"
			if start == "prepared-go" {
				o.ExecPath, start = "-", "prepared"
			}
			e := newEnv(t, o)
			e.start = start
			if helper && execBin != "" && e.sb.execFile == nil {
				t.Fatal("the Sandbox does not use the skein-sandbox-exec it was given")
			}
			if start == "warm" {
				e.sb.prepared.size = 0
			}
			f(t, e)
		})
	}
}

// run is e.sb.Run, checking the call started the way the env says: from a
// warm init or one prepared for its layout (waiting until one is ready),
// or cold.
func (e *testEnv) run(t testing.TB, ctx context.Context, spec Spec) (*Result, error) {
	t.Helper()
	ready := func() bool { return len(e.sb.pool.ready) > 0 }
	switch e.start {
	case "prepared":
		key := e.sb.prime(spec)
		ready = func() bool { return e.sb.prepared.count(key) > 0 }
	case "warm":
	default:
		ready = func() bool { return true }
	}
	for end := time.Now().Add(5 * time.Second); !ready(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s init ready after 5 s", e.start)
		}
	}
	count := func() [4]int64 {
		return [4]int64{e.sb.pool.cold.Load(), e.sb.pool.warm.Load(), e.sb.pool.prep.Load(), e.sb.pool.viaHelper.Load()}
	}
	before := count()
	res, err := e.sb.Run(ctx, spec)
	after := count()
	// A prepared call goes through skein-sandbox-exec exactly when the
	// Sandbox has it (and it did not fail).
	if e.start == "prepared" && err == nil {
		helper := e.sb.execFile != nil && !e.sb.execOff.Load()
		if got := after[3] - before[3]; got != map[bool]int64{true: 1}[helper] {
			t.Errorf("%d calls through skein-sandbox-exec; want %v", got, map[bool]int{true: 1}[helper])
		}
	}
	var got []string
	for i, name := range []string{"cold", "warm", "prepared"} {
		for range after[i] - before[i] {
			got = append(got, name)
		}
	}
	want := e.start
	if want == "" {
		want = "cold"
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("call started %v; want it %s", got, want)
	}
	return res, err
}

// layoutKey is the key of spec's layout in sb's prepared inits.
func layoutKey(t testing.TB, sb *Sandbox, spec Spec) string {
	t.Helper()
	is, err := sb.initSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	key, _, _, ok := layoutOf(is)
	if !ok {
		t.Fatal("no layout for the spec")
	}
	return key
}

// prime starts preparing inits for spec's layout before its first call,
// and returns the layout's key ("" when there is none: a bad spec).
func (s *Sandbox) prime(spec Spec) string {
	is, err := s.initSpec(spec)
	if err != nil {
		return ""
	}
	key, layout, _, ok := layoutOf(is)
	if !ok || s.prepared.size == 0 {
		return ""
	}
	s.prepared.mu.Lock()
	s.prepared.useLocked(key, layout)
	s.prepared.refillLocked(key, true)
	s.prepared.mu.Unlock()
	return key
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// What `hostcheck clean` looks for: everything skein's tests, benchmarks and
// demo create outside their own namespaces, and which a test binary killed
// before its cleanup leaves behind. Caches (/var/cache/skein,
// ~/.cache/skein) and installed packages are not touched.
var (
	// testDirs are the temporary directories the tests make (skeind state,
	// dockerd roots, podman and containerd roots under t.TempDir).
	testDirs = []string{
		"/tmp/skeind-*", "/tmp/skdocker-*", "/tmp/skein-bin-*", "/tmp/skein-demo-*",
		"/tmp/skein-bench-*", "/tmp/skein-host.*", "/tmp/TestPodman*", "/tmp/TestContainerd*",
	}
	// testFiles are what tests leave in shared places.
	testFiles = []string{
		"/run/docker/plugins/skein-*.sock",                // test/docker: the plugin socket per test
		"/var/lib/cni/results/skein-pm-*",                 // test/conformance: podman's result cache
		"/var/lib/cni/results/ct-*",                       // test/conformance: cnitool's result cache
		"/var/lib/dhcpcd/vm[0-9a-f][0-9a-f]*",             // test/vm: dhcpcd's leases (interface vm<hex>)
		"/run/dhcpcd/vm[0-9a-f][0-9a-f]*",                 //   and its run files
		harness.NetNSDir + "/" + harness.NamePrefix + "*", // harness.NewNS and the demo
	}
	// procMarkers in a command line make a process one the tests started.
	procMarkers = []string{"/tmp/skeind-", "/tmp/skdocker-", "/tmp/skein-", "/tmp/Test", harness.NetNSDir + "/" + harness.NamePrefix}
)

// clean removes the test bed's leftovers; with dryRun it only says what it
// would remove. It refuses to run while a test binary runs (its processes
// and namespaces are not leftovers), unless dryRun.
func clean(dryRun bool) error {
	do := func(what string, f func() error) {
		if dryRun {
			fmt.Println("would remove", what)
			return
		}
		fmt.Println("removing", what)
		if err := f(); err != nil {
			fmt.Println("  failed:", err)
		}
	}
	procs, err := processes()
	if err != nil {
		return err
	}
	// A running test's namespaces and files are no leftovers, and cannot
	// be told from them: refuse.
	if running := runningTests(procs); len(running) > 0 {
		if !dryRun {
			return fmt.Errorf("tests are running (%s); stop them first", strings.Join(running, "; "))
		}
		fmt.Printf("note: tests are running (%s): a real clean would refuse\n", strings.Join(running, "; "))
	}

	// 1. Processes the tests started and no test waits for any more.
	pins := testPinInodes()
	for _, p := range leftoverProcs(procs, pins) {
		do(fmt.Sprintf("process %d (%s)", p.pid, p.cmdline), func() error { return kill(p.pid) })
	}
	// 2. Namespaces: the tests' own, and pins hidden under a later mount
	// of their directory (usable by nobody, removable only this way).
	entries, _ := os.ReadDir(harness.NetNSDir)
	for _, e := range entries {
		path := filepath.Join(harness.NetNSDir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), harness.NamePrefix):
			do("namespace "+path, func() error { return netns.Remove(path) })
		case hiddenPin(path):
			do("hidden namespace pin "+path+" (under a later mount of "+harness.NetNSDir+")", func() error { return netns.Remove(path) })
		}
	}
	// 3. Directories (their mounts first) and files.
	for _, g := range testDirs {
		dirs, _ := filepath.Glob(g)
		for _, d := range dirs {
			do(d, func() error {
				harness.UnmountUnder(d)
				return os.RemoveAll(d)
			})
		}
	}
	for _, g := range testFiles {
		files, _ := filepath.Glob(g)
		for _, f := range files {
			if !strings.HasPrefix(f, harness.NetNSDir+"/") { // namespaces: above
				do(f, func() error { return os.RemoveAll(f) })
			}
		}
	}
	// 4. What the real runtimes create on their first run ever on a
	// machine (harness.FirstRunPaths: dockerd's key, containerd's shim
	// sockets, cnitool's cache, podman's lock): gone, so that the next run
	// meets them absent, as on a machine where Docker never ran. Nothing
	// else there is touched; a directory with other entries stays.
	for _, p := range harness.FirstRunPaths {
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			if ents, _ := os.ReadDir(p); len(ents) > 0 {
				fmt.Printf("keeping %s: it holds %d entries a first run does not make\n", p, len(ents))
				continue
			}
		}
		do(p+" (a machine where the runtimes never ran has none)", func() error { return os.Remove(p) })
	}
	// 5. /run/netns back to what a fresh machine has: no mount, no
	// directory. Only when nothing else is pinned there: unmounting it
	// would hide those pins.
	switch _, left := netnsDirState(); {
	case len(left) > 0:
		fmt.Printf("keeping %s mounted: namespaces are pinned there (%s)\n", harness.NetNSDir, strings.Join(left, ", "))
	default:
		if _, err := os.Stat(harness.NetNSDir); err == nil {
			do(harness.NetNSDir+" and its mount of itself (a fresh machine has neither)", func() error {
				_, err := harness.TidyNetNSDir(false)
				return err
			})
		}
	}
	return nil
}

type proc struct {
	pid, ppid int
	cmdline   string
	netns     string // "net:[inode]"
}

func processes() ([]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		out = append(out, proc{pid: pid, ppid: ppid, cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")), netns: ns})
	}
	return out, nil
}

// testRunner reports whether p runs tests: a Go test binary (name.test),
// `go test`, skein-bench, or a program `go run` built (the demo), this
// process excepted.
func testRunner(p proc) bool {
	args := strings.Fields(p.cmdline)
	if len(args) == 0 || p.pid == os.Getpid() {
		return false
	}
	base := filepath.Base(args[0])
	return strings.HasSuffix(base, ".test") || base == "skein-bench" ||
		(base == "go" && len(args) > 1 && args[1] == "test") || strings.Contains(args[0], "/go-build")
}

// runningTests describes the processes that run tests.
func runningTests(procs []proc) []string {
	var out []string
	for _, p := range procs {
		if testRunner(p) {
			out = append(out, fmt.Sprintf("pid %d: %.60s", p.pid, p.cmdline))
		}
	}
	return out
}

// testPinInodes returns the namespaces ("net:[inode]") pinned under the
// tests' names.
func testPinInodes() map[string]bool {
	out := map[string]bool{}
	paths, _ := filepath.Glob(filepath.Join(harness.NetNSDir, harness.NamePrefix+"*"))
	for _, p := range paths {
		var st unix.Stat_t
		if netns.IsNetNS(p) == nil && unix.Stat(p, &st) == nil {
			out[fmt.Sprintf("net:[%d]", st.Ino)] = true
		}
	}
	return out
}

// leftoverProcs are the processes the tests started (marked by their
// command line or their namespace) that nothing owns any more: every
// ancestor up to init is marked too. A live unmarked ancestor (a test
// binary, the demo, skein-bench, a shell) owns the process: it stays, and
// so do this process and its ancestors.
func leftoverProcs(procs []proc, pins map[string]bool) []proc {
	byPID := map[int]proc{}
	for _, p := range procs {
		byPID[p.pid] = p
	}
	marked := func(p proc) bool {
		return pins[p.netns] || slices.ContainsFunc(procMarkers, func(m string) bool { return strings.Contains(p.cmdline, m) })
	}
	mine := map[int]bool{}
	for pid := os.Getpid(); pid > 1; pid = byPID[pid].ppid {
		mine[pid] = true
	}
	owned := func(p proc) bool {
		for pid := p.ppid; pid > 1; pid = byPID[pid].ppid {
			a, ok := byPID[pid]
			if !ok || mine[pid] || !marked(a) {
				return ok // gone meanwhile: as if orphaned
			}
		}
		return false
	}
	// Daemons that detach (containerd's shims) have init as parent even
	// while their owner runs: one that shares a test directory with an
	// owned process is owned too.
	ownedDirs := map[string]bool{}
	for _, p := range procs {
		if marked(p) && (mine[p.pid] || owned(p)) {
			ownedDirs[testDirRE.FindString(p.cmdline)] = true
		}
	}
	var out []proc
	for _, p := range procs {
		dir := testDirRE.FindString(p.cmdline)
		if marked(p) && !mine[p.pid] && !owned(p) && (dir == "" || !ownedDirs[dir]) {
			out = append(out, p)
		}
	}
	return out
}

// testDirRE finds the test directory a command line refers to.
var testDirRE = regexp.MustCompile(`/tmp/(skeind-|skdocker-|skein-|Test)[^/ ]*`)

// kill ends a leftover process: SIGTERM, then SIGKILL after 5 s.
func kill(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// hiddenPin reports whether path has a namespace mounted on it that a later
// mount of its directory hides: the path no longer leads to the namespace,
// but the mount table still has one there.
func hiddenPin(path string) bool {
	if netns.IsNetNS(path) == nil {
		return false
	}
	h, err := harness.ReadHost()
	if err != nil {
		return false
	}
	return slices.ContainsFunc(h.NetNS, func(s string) bool { return strings.HasPrefix(s, "pin "+path+" ") })
}

// netnsDirState reports whether NetNSDir is a mount and which names under
// it, but the tests' own (removed before), are pinned namespaces.
func netnsDirState() (mounted bool, pinned []string) {
	h, err := harness.ReadHost()
	if err != nil {
		return false, nil
	}
	mounted = slices.ContainsFunc(h.Mounts, func(m string) bool { return strings.HasPrefix(m, harness.NetNSDir+" ") })
	entries, _ := os.ReadDir(harness.NetNSDir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), harness.NamePrefix) && netns.IsNetNS(filepath.Join(harness.NetNSDir, e.Name())) == nil {
			pinned = append(pinned, e.Name())
		}
	}
	return mounted, pinned
}

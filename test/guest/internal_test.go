package guest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skeinnet/skein/test/tools"
)

// testKernel is the cached kernel, or a skip naming where it should be.
func testKernel(t *testing.T) *Kernel {
	t.Helper()
	root := filepath.Join(tools.KernelCache(), "current")
	k, err := cachedKernel(root)
	if err != nil {
		t.Skipf("skipping: no cached Debian kernel under %s (make deps downloads it): %v", root, err)
	}
	return k
}

func TestResolveOrdersDependencies(t *testing.T) {
	k := testKernel(t)
	mods, err := k.Resolve([]string{"fou6", "ip6-tunnel", "nf_tables", "fou6"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		if _, dup := pos[m.Name]; dup {
			t.Errorf("%s listed twice: %v", m.Name, mods)
		}
		pos[m.Name] = i
		info, err := readModinfo(m.Path)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range info.depends {
			if p, ok := pos[modName(d)]; !ok || p > i {
				t.Errorf("%s comes before its dependency %s: %v", m.Name, d, mods)
			}
		}
	}
	for _, want := range []string{"fou6", "fou", "udp_tunnel", "ip6_udp_tunnel", "ip6_tunnel", "tunnel6", "nf_tables", "nfnetlink", "libcrc32c"} {
		if _, ok := pos[want]; !ok {
			t.Errorf("%s missing from %v", want, mods)
		}
	}
	// libcrc32c's soft dependency (the alias crc32c) comes first, optional.
	g, ok := pos["crc32c_generic"]
	if !ok || g > pos["libcrc32c"] || !mods[g].Optional {
		t.Errorf("crc32c_generic should precede libcrc32c as an optional module: %v", mods)
	}
	for _, m := range mods {
		if m.Optional && !strings.HasPrefix(m.Name, "crc32c") {
			t.Errorf("%s is optional, only soft dependencies should be", m.Name)
		}
	}
}

func TestResolveUnknownModule(t *testing.T) {
	k := testKernel(t)
	for _, names := range [][]string{{"no_such_module"}, {"veth", "no_such_module"}} {
		_, err := k.Resolve(names)
		if err == nil || !strings.Contains(err.Error(), "no_such_module") {
			t.Errorf("Resolve(%v) = %v, want an error naming no_such_module", names, err)
		}
	}
	if _, err := k.Resolve([]string{" "}); err == nil {
		t.Error("Resolve of an empty name succeeded")
	}
}

// TestArchive writes an archive and unpacks it with busybox cpio, the
// same format reader as the kernel's.
func TestArchive(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("skipping: /bin/busybox (busybox-static) is missing")
	}
	a := newArchive()
	a.file("/bin/tool", 0o755, []byte("#!/bin/sh\necho hi\n"))
	a.file("etc/odd", 0o600, []byte("x"))    // length 1: data padding
	a.file("/deep/er/path/file", 0o644, nil) // empty, parents implied
	a.symlink("/bin/sh", "busybox")
	var buf bytes.Buffer
	if err := a.writeTo(&buf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("/bin/busybox", "cpio", "-i", "-d")
	cmd.Dir = dir
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("busybox cpio -i: %v\n%s", err, out)
	}
	for p, want := range map[string]string{"bin/tool": "#!/bin/sh\necho hi\n", "etc/odd": "x", "deep/er/path/file": ""} {
		got, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(got) != want {
			t.Errorf("%s unpacked as %q (%v), want %q", p, got, err, want)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "bin/tool")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("bin/tool mode: %v %v, want 0755", st.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || l != "busybox" {
		t.Errorf("bin/sh links to %q (%v), want busybox", l, err)
	}
}

func TestShellQuote(t *testing.T) {
	words := []string{"plain", "with space", "it's", `back\slash`, "$HOME", "", "a'b'c", "-test.run=^(A|B)$"}
	out, err := exec.Command("sh", "-c", "for w in "+strings.Join(shellQuoteAll(words), " ")+`; do printf '%s\n' "$w"; done`).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n"); strings.Join(got, "|") != strings.Join(words, "|") {
		t.Errorf("sh saw %q, want %q", got, words)
	}
}

func TestParseConsole(t *testing.T) {
	res := &Result{ExitCode: -1, Console: "[    0.1] boot noise\n" + runMarker + " 2.50\n=== RUN   TestX\n--- FAIL: TestX (0.01s)\nFAIL\n\n" + exitMarker + " 1 3.00\n[ 3.1] reboot: Power down\n"}
	parseConsole(res)
	if res.ExitCode != 1 || res.Passed || res.GuestBoot.Seconds() != 2.5 {
		t.Errorf("exit %d passed %v guest boot %v, want 1 false 2.5s", res.ExitCode, res.Passed, res.GuestBoot)
	}
	if want := "=== RUN   TestX\n--- FAIL: TestX (0.01s)\nFAIL"; res.Output != want {
		t.Errorf("output %q, want %q", res.Output, want)
	}
	if f := failures(res.Output); len(f) != 1 || f[0] != "--- FAIL: TestX (0.01s)" {
		t.Errorf("failures %q", f)
	}
	// No exit marker: the binary did not finish.
	res = &Result{ExitCode: -1, Console: runMarker + " 1.0\n=== RUN   TestX\n"}
	parseConsole(res)
	if res.ExitCode != -1 || res.Passed {
		t.Errorf("an unfinished run parsed as exit %d passed %v", res.ExitCode, res.Passed)
	}
}

// recorder is a testing.TB that keeps what report says.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Error(args ...any)   { r.errors = append(r.errors, fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestReportNamesFailures(t *testing.T) {
	cases := []struct {
		name, console string
		bench         string
		want          string // in the error; "" = no error
	}{
		{"module", moduleMarker + " nft_masq: insmod: can't insert\n" + dmesgMarker + " [1.0] nft_masq: Unknown symbol\n", "", "kernel module nft_masq: insmod: can't insert failed to load"},
		{"passed", runMarker + " 1\n--- PASS: TestX\nPASS\n" + exitMarker + " 0 2\n", "", ""},
		{"failed", runMarker + " 1\n--- FAIL: TestX (0.1s)\nFAIL\n" + exitMarker + " 1 2\n", "", "--- FAIL: TestX"},
		{"unfinished", runMarker + " 1\n=== RUN   TestX\n[killed]\n", "", "did not finish"},
		{"no tests", runMarker + " 1\ntesting: warning: no tests to run\nPASS\n" + exitMarker + " 0 2\n", "", "matched no test"},
		{"bench only", runMarker + " 1\ntesting: warning: no tests to run\nBenchmarkX 1 5 ns/op\nPASS\n" + exitMarker + " 0 2\n", "X", ""},
		{"setup", setupMarker + " /run\n", "", "/init failed at /run"},
	}
	for _, c := range cases {
		res := &Result{ExitCode: -1, Console: c.console}
		parseConsole(res)
		r := &recorder{}
		report(r, Config{Package: "./x", Run: "^TestX$", Bench: c.bench}, res)
		got := strings.Join(r.errors, "\n")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: report said %q, want an error containing %q", c.name, got, c.want)
		}
	}
}

func TestHostPortArgs(t *testing.T) {
	for _, bad := range [][]int{{0}, {70000}, {-1}, {8080, 8080}} {
		if err := checkHostPorts(bad); err == nil {
			t.Errorf("checkHostPorts(%v) accepted", bad)
		}
	}
	if err := checkHostPorts([]int{6443, 8080}); err != nil {
		t.Error(err)
	}
	if got := strings.Join(netArgs(Config{}), " "); got != "-nic none" {
		t.Errorf("without HostPorts qemu gets %q, want no NIC", got)
	}
	got := strings.Join(netArgs(Config{HostPorts: []int{6443}}), " ")
	for _, want := range []string{"restrict=on", "guestfwd=tcp:" + HostAddr + ":6443-cmd:", "nc 127.0.0.1 6443", "virtio-net-pci"} {
		if !strings.Contains(got, want) {
			t.Errorf("qemu network options %q lack %q", got, want)
		}
	}
}

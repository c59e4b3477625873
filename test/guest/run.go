package guest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/skeintest"
	"github.com/skeinnet/skein/test/tools"
)

// Run builds cfg.Package's tests as a static binary, boots the cached
// Debian kernel under qemu (TCG) with an initramfs holding busybox, the
// modules, the binary and cfg.Files, runs the binary there with -test.v
// and the flags cfg asks for, and returns how it went. The inner output is
// logged through t; t fails with the inner failures if the inner run
// failed, a module did not load, or the guest did not finish in time.
// It skips t when qemu-system-x86_64, the cached kernel or busybox is
// missing, and inside a guest (no nesting).
func Run(t testing.TB, cfg Config) *Result {
	t.Helper()
	if InGuest() {
		t.Skip("skipping: already inside the qemu guest (guest.Run does not nest)")
	}
	qemu := skeintest.RequireTool(t, "qemu-system-x86_64")
	if _, err := os.Stat(skeintest.Busybox); err != nil {
		t.Skipf("skipping: %s is missing (Debian busybox-static; make deps installs it): the guest's userland", skeintest.Busybox)
	}
	kroot := filepath.Join(tools.KernelCache(), "current")
	kernel, err := cachedKernel(kroot)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("skipping: no cached Debian kernel under %s (make deps, i.e. scripts/deps.d/vm.sh, downloads it): %v", kroot, err)
	}
	if err != nil {
		t.Fatalf("guest kernel: %v", err)
	}
	if cfg.Package == "" {
		t.Fatal("guest.Run: Config.Package is empty")
	}
	if err := checkHostPorts(cfg.HostPorts); err != nil {
		t.Fatalf("guest.Run: %v", err)
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = DefaultMemoryMB
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = DefaultCPUs
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}

	res := &Result{ExitCode: -1}
	buildStart := time.Now()
	mods, err := kernel.Resolve(append(netModules(cfg), cfg.Modules...))
	if err != nil {
		t.Fatalf("guest modules: %v", err)
	}
	gocmd, err := goTool()
	if err != nil {
		t.Skipf("skipping: %v (needed to build the guest's test binary)", err)
	}
	root, err := moduleRoot(gocmd)
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	work := t.TempDir()
	bin := filepath.Join(work, "test.bin")
	if err := testBinary(gocmd, root, cfg.Package, cfg.Tags, bin); err != nil {
		t.Fatalf("guest: %v", err)
	}
	initrd := filepath.Join(work, "initrd.gz")
	if err := writeInitramfs(initrd, cfg, bin, mods); err != nil {
		t.Fatalf("guest initramfs: %v", err)
	}
	image, note := kernel.BootImage()
	if note != "" {
		t.Logf("guest kernel %s: %s", kernel.Version, note)
	}
	res.Build = time.Since(buildStart)

	boot(t, qemu, image, initrd, cfg, res)
	report(t, cfg, res)
	return res
}

var kernels struct {
	sync.Mutex
	byRoot map[string]*Kernel
}

// cachedKernel indexes the kernel under root once per process.
func cachedKernel(root string) (*Kernel, error) {
	kernels.Lock()
	defer kernels.Unlock()
	if k := kernels.byRoot[root]; k != nil {
		return k, nil
	}
	k, err := LoadKernel(root)
	if err != nil {
		return nil, err
	}
	if kernels.byRoot == nil {
		kernels.byRoot = map[string]*Kernel{}
	}
	kernels.byRoot[root] = k
	return k, nil
}

// innerTimeout is the test binary's -test.timeout: shorter than the guest's
// budget by the boot and a margin, so the inner stacks are printed before
// qemu is killed.
func innerTimeout(total time.Duration) time.Duration {
	margin := 15*time.Second + total/10
	if total-margin < total/2 {
		return total / 2
	}
	return total - margin
}

// testArgs are the test binary's arguments.
func testArgs(cfg Config) []string {
	args := []string{"-test.v", "-test.count=1", "-test.timeout=" + innerTimeout(cfg.Timeout).String()}
	if cfg.Run != "" {
		args = append(args, "-test.run="+cfg.Run)
	}
	if cfg.Bench != "" {
		args = append(args, "-test.bench="+cfg.Bench)
		if cfg.BenchTime != "" {
			args = append(args, "-test.benchtime="+cfg.BenchTime)
		}
	}
	return append(args, cfg.Args...)
}

// testEnv is the test binary's environment beyond what /init inherits.
func testEnv(cfg Config) []string {
	env := []string{"PATH=/bin", "HOME=/tmp", "TMPDIR=/tmp", EnvInGuest + "=1"}
	if len(cfg.HostPorts) > 0 {
		env = append(env, EnvHost+"="+HostAddr)
	}
	return append(env, cfg.Env...)
}

// writeInitramfs writes the gzip'd (level 1: the guest's decompression
// runs emulated) newc archive: busybox, /init, the modules and their load
// order, the test binary, cfg.Files, a minimal /etc.
func writeInitramfs(out string, cfg Config, bin string, mods []Module) error {
	a := newArchive()
	for _, d := range []string{"bin", "dev", "proc", "sys", "run", "tmp", "etc", guestWorkDir} {
		a.dir(d)
	}
	readInto := func(guestPath, hostPath string) error {
		b, err := os.ReadFile(hostPath)
		if err != nil {
			return err
		}
		st, err := os.Stat(hostPath)
		if err != nil {
			return err
		}
		a.file(guestPath, uint32(st.Mode().Perm()), b)
		return nil
	}
	if err := readInto("/bin/busybox", skeintest.Busybox); err != nil {
		return err
	}
	a.file("/init", 0o755, []byte(initScript(shellQuoteAll(testArgs(cfg)), shellQuoteAll(testEnv(cfg)), networkScript(cfg))))
	var order []string
	for _, m := range mods {
		if err := readInto(guestModules+"/"+m.Name+".ko", m.Path); err != nil {
			return fmt.Errorf("module %s: %w", m.Name, err)
		}
		line := m.Name
		if m.Optional {
			line += " optional"
		}
		order = append(order, line+"\n")
	}
	a.file(guestModList, 0o644, []byte(strings.Join(order, "")))
	if err := readInto(guestBinary, bin); err != nil {
		return err
	}
	for g, h := range cfg.Files {
		if !strings.HasPrefix(g, "/") {
			return fmt.Errorf("guest path %q of Files is not absolute", g)
		}
		if err := readInto(g, h); err != nil {
			return fmt.Errorf("file for %s: %w", g, err)
		}
	}
	a.file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	a.file("/etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
	a.file("/etc/hosts", 0o644, []byte("127.0.0.1 localhost\n::1 localhost\n"))

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		f.Close()
		return err
	}
	bw := bufio.NewWriterSize(zw, 1<<20)
	err = a.writeTo(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = zw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// qemuArgs is the machine: TCG (this host's KVM is nested and hangs stock
// kernels), no default devices, the console on the serial port, no reboot
// (the guest's power-off or panic ends qemu).
func qemuArgs(kernel, initrd string, cfg Config) []string {
	args := []string{
		"-accel", "tcg,thread=multi",
		"-m", strconv.Itoa(cfg.MemoryMB), "-smp", strconv.Itoa(cfg.CPUs),
		"-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet",
	}
	return append(args, netArgs(cfg)...)
}

// boot runs qemu until the guest powers off or cfg.Timeout passes, and
// fills res from the console.
func boot(t testing.TB, qemu, kernel, initrd string, cfg Config, res *Result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, qemuArgs(kernel, initrd, cfg)...)
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", qemu, err)
	}
	var console strings.Builder
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if res.Boot == 0 && strings.HasPrefix(line, runMarker) {
			res.Boot = time.Since(start)
		}
		console.WriteString(line)
		console.WriteByte('\n')
	}
	_, _ = io.Copy(io.Discard, stdout)
	waitErr := cmd.Wait()
	res.Elapsed = time.Since(start)
	res.Console = console.String()
	if stderr.Len() > 0 {
		res.Console += "[qemu stderr]\n" + stderr.String()
	}
	if ctx.Err() != nil {
		res.Console += fmt.Sprintf("[killed: the guest did not finish within %v]\n", cfg.Timeout)
	} else if waitErr != nil {
		res.Console += fmt.Sprintf("[qemu: %v]\n", waitErr)
	}
	parseConsole(res)
}

// parseConsole extracts the test binary's output and exit code.
func parseConsole(res *Result) {
	lines := strings.Split(res.Console, "\n")
	var out []string
	in := false
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, runMarker):
			if f := strings.Fields(line); len(f) >= 2 {
				if up, err := strconv.ParseFloat(f[1], 64); err == nil {
					res.GuestBoot = time.Duration(up * float64(time.Second))
				}
			}
			in = true
			continue
		case strings.HasPrefix(line, exitMarker):
			if f := strings.Fields(line); len(f) >= 2 {
				if code, err := strconv.Atoi(f[1]); err == nil {
					res.ExitCode = code
				}
			}
			in = false
			continue
		}
		if in {
			out = append(out, line)
		}
	}
	res.Output = strings.TrimRight(strings.Join(out, "\n"), "\n")
	res.Passed = res.ExitCode == 0
}

// report logs the inner output and fails t with what went wrong.
func report(t testing.TB, cfg Config, res *Result) {
	t.Helper()
	if os.Getenv(EnvConsole) == "1" {
		t.Logf("guest console:\n%s", res.Console)
	}
	t.Logf("guest run of %s (build %v, boot %v [guest uptime %v], total %v, exit %d):\n%s", cfg.Package,
		res.Build.Round(time.Millisecond), res.Boot.Round(time.Millisecond), res.GuestBoot.Round(time.Millisecond),
		res.Elapsed.Round(time.Millisecond), res.ExitCode, res.Output)
	var mod, setup, dmesg []string
	for _, line := range strings.Split(res.Console, "\n") {
		switch {
		case strings.HasPrefix(line, moduleMarker+" "):
			mod = append(mod, strings.TrimPrefix(line, moduleMarker+" "))
		case strings.HasPrefix(line, setupMarker+" "):
			setup = append(setup, strings.TrimPrefix(line, setupMarker+" "))
		case strings.HasPrefix(line, dmesgMarker+" "):
			dmesg = append(dmesg, strings.TrimPrefix(line, dmesgMarker+" "))
		}
	}
	switch {
	case len(mod) > 0:
		t.Errorf("guest: kernel module %s failed to load; kernel log:\n%s", strings.Join(mod, ", "), strings.Join(dmesg, "\n"))
	case len(setup) > 0:
		t.Errorf("guest: /init failed at %s; console:\n%s", strings.Join(setup, ", "), res.Console)
	case res.ExitCode == -1:
		t.Errorf("guest: the test binary did not finish (after %v); console:\n%s", res.Elapsed.Round(time.Millisecond), res.Console)
	case res.ExitCode != 0:
		msg := fmt.Sprintf("guest: the tests of %s failed (exit %d): %s", cfg.Package, res.ExitCode, strings.Join(failures(res.Output), "; "))
		if len(dmesg) > 0 {
			msg += "\nguest kernel log (tail):\n" + strings.Join(dmesg, "\n")
		}
		t.Error(msg)
	case cfg.Bench == "" && strings.Contains(res.Output, "testing: warning: no tests to run"):
		t.Errorf("guest: -test.run %q matched no test of %s", cfg.Run, cfg.Package)
	}
}

// failures lists the failed tests' result lines and panics in the output.
func failures(out string) []string {
	var f []string
	for _, line := range strings.Split(out, "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "--- FAIL:") || strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "FAIL ") {
			f = append(f, l)
		}
	}
	if len(f) == 0 {
		f = append(f, "no failing test named (see the output above)")
	}
	return f
}

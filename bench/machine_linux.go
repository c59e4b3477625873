package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/test/skeintest"
)

// machine describes the host the run measures.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kib, _ := strconv.Atoi(f[1])
				m.MemoryMiB = kib / 1024
			}
		}
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins").Output(); err == nil {
		m.Plugins = "containernetworking-plugins " + strings.TrimSpace(string(out)) + " (" + skeintest.RefPluginDir + ")"
	}
	// The plugin run without CNI_COMMAND prints its "about" line.
	if bin := os.Getenv("SKEIN_BIN_DIR"); bin != "" {
		cmd := exec.Command(filepath.Join(bin, "skein"))
		cmd.Env = []string{}
		if out, _ := cmd.CombinedOutput(); len(out) > 0 {
			m.Skein = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
		}
	}
	return m
}

// machineBusy is the time every CPU of the machine spent on anything but
// idling since boot (/proc/stat: user, nice, system, irq, softirq and
// steal; in ticks of 10 ms), 0 if it cannot be read.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

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

// cpuTime is CPU time (user and system, every thread) by where it ran:
// this process (the runtime's side: libcni; the floor's netlink calls),
// its children it waited for (the plugins libcni exec'd) and a
// contender's daemons (skeind).
type cpuTime struct{ runtime, plugins, daemons time.Duration }

func (c cpuTime) total() time.Duration { return c.runtime + c.plugins + c.daemons }

func (c cpuTime) sub(o cpuTime) cpuTime {
	return cpuTime{c.runtime - o.runtime, c.plugins - o.plugins, c.daemons - o.daemons}
}

func (c cpuTime) add(o cpuTime) cpuTime {
	return cpuTime{c.runtime + o.runtime, c.plugins + o.plugins, c.daemons + o.daemons}
}

// cpuUsed is the CPU time used so far by this process, by its children it
// waited for and by the processes pids: precise clocks, not ticks. 0 for a
// pid that cannot be read.
func cpuUsed(pids ...int) cpuTime {
	var t cpuTime
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		t.runtime = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if unix.Getrusage(unix.RUSAGE_CHILDREN, &ru) == nil {
		t.plugins = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, pid := range pids {
		// The process-wide CPU clock of pid (clock_getcpuclockid).
		var ts unix.Timespec
		if unix.ClockGettime(int32((^pid)<<3|2), &ts) == nil {
			t.daemons += time.Duration(ts.Nano())
		}
	}
	return t
}

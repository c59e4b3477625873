package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// daemons is skeind (none if it cannot be found).
func (c *skeinContender) daemons() []int {
	if pid, err := c.pid(); err == nil {
		return []int{pid}
	}
	return nil
}

// pid finds the skeind serving this contender's socket.
func (c *skeinContender) pid() (int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) == "skeind" && strings.Contains(string(b), "\x00"+c.d.Socket+"\x00") {
			return strconv.Atoi(filepath.Base(d))
		}
	}
	return 0, errNoPID
}

// rss is skeind's VmRSS in KiB.
func (c *skeinContender) rss() (int, error) {
	pid, err := c.pid()
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

var reconciledRE = regexp.MustCompile(`msg=reconciled .*took=\S+`)

// measureRestart stops skeind (SIGTERM) with n attachments on its node and
// starts it again while a runtime keeps trying an ADD through the plugin,
// as a kubelet would; the time is from starting the process to the first
// ADD that succeeds. That attachment is removed again after each trial.
func (c *skeinContender) measureRestart(sc *scope, n, trials int, prog *progress) *Restart {
	r := &Restart{Attachments: n}
	for i := 0; i < trials; i++ {
		pod := harness.NewNS(sc, "bpod")
		id := fmt.Sprintf("restart-%d", i)
		c.d.Stop(sc)
		started := make(chan error, 1)
		t0 := time.Now()
		go func() { started <- catch(func() { c.d.Start(sc) }) }()
		var took time.Duration
		for {
			if err := c.add(id, pod); err == nil {
				took = time.Since(t0)
				break
			} else if time.Since(t0) > time.Minute {
				sc.Fatalf("skeind restarted with %d attachments did not serve an ADD within a minute: %v", n, err)
			}
			// A short pause so that the retries (each an exec of the
			// plugin) do not take the CPU skeind needs to start.
			time.Sleep(2 * time.Millisecond)
		}
		if err := <-started; err != nil {
			sc.Fatalf("restart: %v", err)
		}
		r.ToFirstADD = append(r.ToFirstADD, float64(took.Microseconds())/1000)
		if m := reconciledRE.FindString(c.d.Log()); m != "" {
			r.Reconcile = append(r.Reconcile, m)
		}
		if err := c.del(id, pod); err != nil {
			sc.Errorf("DEL after restart: %v", err)
		}
		_ = netns.Remove(pod.Path())
		prog.add(20)
	}
	if kib, err := c.rss(); err == nil {
		r.RSSKiB = kib
	}
	return r
}

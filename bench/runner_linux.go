package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// Run measures skein's own share head to head (measureHeadToHead), then
// every contender in turn on a fresh node of its own, then the data path
// and skeind's restart, and returns the report. Everything
// it creates — namespaces, daemons, files — is removed before it returns,
// also when ctx is cancelled or a step fails (the failure is recorded in
// Report.Errors and the other steps still run).
func Run(ctx context.Context, cfg Config, prog *progress) *Report {
	rep := &Report{Config: cfg, Started: time.Now().UTC(), Machine: machine()}
	rep.HeadToHead, rep.Errors = measureHeadToHead(ctx, cfg, prog)
	baseNetNS := netnsObjects()
	measure := func(c contender, cfg Config, rep *Report) {
		sc := newScope(c.Name(), cfg.Verbose)
		err := catch(func() { measureContender(ctx, sc, c, cfg, rep, prog) })
		prog.setPhase("%s: removing its node and pods", c.Name())
		sc.close()
		waitNetnsGone(baseNetNS)
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", c.Name(), err))
		}
	}
	for _, c := range contenders(cfg) {
		if ctx.Err() != nil {
			break
		}
		rep.order = append(rep.order, c.Name())
		measure(c, cfg, rep)
	}
	// The dual-stack rows: skein and the floor again with IPv6 too, at
	// c=1, each on a node of its own.
	dcfg := cfg
	dcfg.Levels, dcfg.Concurrency, dcfg.RestartTrials = cfg.DualLevels, []int{1}, 0
	for _, c := range dualContenders(cfg) {
		if ctx.Err() != nil {
			break
		}
		part := &Report{}
		measure(c, dcfg, part)
		rep.DualStack = append(rep.DualStack, part.Latency...)
		rep.Preload = append(rep.Preload, part.Preload...)
		rep.Errors = append(rep.Errors, part.Errors...)
	}
	if ctx.Err() == nil && (len(cfg.Contenders) == 0 || slices.Contains(cfg.Contenders, "skein")) {
		sc := newScope("data path", cfg.Verbose)
		if err := catch(func() { rep.DataPath = measureDataPath(ctx, sc, cfg, prog) }); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("data path: %v", err))
		}
		sc.close()
	}
	if ctx.Err() != nil {
		rep.Errors = append(rep.Errors, "interrupted: "+ctx.Err().Error())
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep
}

// wanted reports whether cfg selects the contender called name; an empty
// selection means every contender but the floor-poddel experiment.
func wanted(cfg Config, name string) bool {
	if len(cfg.Contenders) == 0 {
		return name != "floor-poddel"
	}
	return slices.Contains(cfg.Contenders, name)
}

// contenders are the ones of the main matrix that cfg selects, in order.
func contenders(cfg Config) []contender {
	var cs []contender
	for _, c := range []contender{
		&floorContender{name: cFloor, dual: cfg.Dual},
		&floorContender{name: "floor-poddel", dual: cfg.Dual, podDel: true},
		&execFloorContender{cniContender{name: cExecFloor}},
		newSkeinContender(cSkein, cfg.Dual), bridgeContender(cfg.Dual), ptpContender(cfg.Dual),
	} {
		if wanted(cfg, c.Name()) {
			cs = append(cs, c)
		}
	}
	return cs
}

// dualContenders are the ones of the dual-stack rows: none when the whole
// run is dual-stack already or no DualLevels are set.
func dualContenders(cfg Config) []contender {
	if cfg.Dual || len(cfg.DualLevels) == 0 {
		return nil
	}
	var cs []contender
	for _, c := range []contender{&floorContender{name: cFloorDual, dual: true}, newSkeinContender(cSkeinDual, true)} {
		if wanted(cfg, c.Name()) {
			cs = append(cs, c)
		}
	}
	return cs
}

// units estimates the work of a run, for the progress bar: one unit per
// ADD+DEL pair, half a unit per preloaded attachment, fixed amounts for the
// data path and restart.
func units(cfg Config) float64 {
	var u float64
	matrix := func(n int, levels []int, concs int) {
		top := 0
		for _, l := range levels {
			top = max(top, l)
		}
		u += float64(n) * (float64(top)/2 + float64(cfg.Warmup) + float64(len(levels)*concs*cfg.Ops))
	}
	matrix(len(contenders(cfg)), cfg.Levels, len(cfg.Concurrency))
	matrix(len(dualContenders(cfg)), cfg.DualLevels, 1)
	u += headUnits(cfg)
	u += float64(cfg.RestartTrials) * 20
	u += float64(2*cfg.IperfRounds*cfg.IperfSeconds)*10 + 20
	return u
}

func measureContender(ctx context.Context, sc *scope, c contender, cfg Config, rep *Report, prog *progress) {
	prepare(ctx, sc, c, cfg, 0, prog)
	name := c.Name()
	short := strings.SplitN(name, "+", 2)[0]
	limit, why := 1<<30, ""
	if l, ok := c.(limited); ok {
		limit, why = l.maxAttachments()
	}
	loaded := 0
	for _, level := range cfg.Levels {
		if ctx.Err() != nil {
			return
		}
		if level >= limit {
			for _, conc := range cfg.Concurrency {
				rep.Latency = append(rep.Latency, LatencyRow{Contender: name, Attachments: level, Concurrency: conc, NA: why})
			}
			continue
		}
		if level > loaded {
			prog.setPhase("%s: filling the node to %d attachments", name, level)
			start := time.Now()
			if err := fill(c, sc, short+"-pre", loaded, level, prog); err != nil {
				sc.Fatalf("fill the node to %d attachments: %v", level, err)
			}
			rep.Preload = append(rep.Preload, PreloadRow{Contender: name, Attachments: level, Seconds: time.Since(start).Seconds()})
			loaded = level
		}
		if s, ok := c.(*skeinContender); ok && c.Name() == cSkein {
			if kib, err := s.rss(); err == nil {
				rep.RSS = append(rep.RSS, RSSRow{Attachments: loaded, KiB: kib, When: "after filling"})
			}
		}
		for _, conc := range cfg.Concurrency {
			if ctx.Err() != nil {
				return
			}
			if level+conc > limit {
				rep.Latency = append(rep.Latency, LatencyRow{Contender: name, Attachments: level, Concurrency: conc, NA: why})
				prog.add(float64(cfg.Ops))
				continue
			}
			prog.setPhase("%s: %d attachments on the node, concurrency %d", name, level, conc)
			pods := newPods(sc, cfg.Ops)
			s := churnSample(ctx, c, fmt.Sprintf("%s-%d-%d", short, level, conc), pods, conc, prog)
			row := s.row(conc)
			row.Contender, row.Attachments = name, level
			rep.Latency = append(rep.Latency, row)
		}
	}
	if s, ok := c.(*skeinContender); ok && cfg.RestartTrials > 0 && ctx.Err() == nil {
		prog.setPhase("skein: restarting skeind with %d attachments", loaded)
		rep.Restart = s.measureRestart(sc, loaded, cfg.RestartTrials, prog)
	}
}

// newPods makes n pod namespaces (owned by sc).
func newPods(sc *scope, n int) []*harness.NS {
	pods := make([]*harness.NS, n)
	for i := range pods {
		pods[i] = harness.NewNS(sc, "bpod")
	}
	return pods
}

// removePods unpins namespaces whose attachments are gone, now rather than
// at the end of the contender (their cleanup then finds nothing to do).
// Only between phases that are not measured: the kernel destroys a
// namespace asynchronously, under the rtnl lock every ADD and DEL needs.
func removePods(pods []*harness.NS) {
	for _, p := range pods {
		_ = netns.Remove(p.Path())
	}
}

// churnSample runs len(pods) ADD+DEL pairs on conc workers: each worker
// takes a pod, ADDs it, DELs it, and takes the next. Both latencies are
// recorded, and the wall time of the whole and the CPU time the
// contender used meanwhile (cpuUsed: this process, the plugins, its
// daemons).
func churnSample(ctx context.Context, c contender, prefix string, pods []*harness.NS, conc int, prog *progress) sample {
	var (
		mu sync.Mutex
		s  sample
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		s.failed++
		if s.firstErr == nil {
			s.firstErr = err
		}
	}
	var pids []int
	if d, ok := c.(daemonized); ok {
		pids = d.daemons()
	}
	start, cpu := time.Now(), cpuUsed(pids...)
	_ = parallel(conc, len(pods), func(i int) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		id := fmt.Sprintf("%s-%d", prefix, i)
		t0 := time.Now()
		err := c.add(id, pods[i])
		t1 := time.Now()
		if err != nil {
			fail(fmt.Errorf("ADD %s: %w", id, err))
			_ = c.del(id, pods[i])
			prog.add(1)
			return nil
		}
		err = c.del(id, pods[i])
		t2 := time.Now()
		if err != nil {
			fail(fmt.Errorf("DEL %s: %w", id, err))
		}
		mu.Lock()
		s.add = append(s.add, t1.Sub(t0))
		if err == nil {
			s.del = append(s.del, t2.Sub(t1))
		}
		mu.Unlock()
		prog.add(1)
		return nil
	})
	s.wall, s.cpu = time.Since(start), cpuUsed(pids...).sub(cpu)
	return s
}

// netnsObjects is the kernel's count of live network namespaces
// (/proc/slabinfo net_namespace), -1 if it cannot be read.
func netnsObjects() int {
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == "net_namespace" {
			var n int
			fmt.Sscan(f[1], &n)
			return n
		}
	}
	return -1
}

// waitNetnsGone waits until the kernel has destroyed the namespaces just
// removed (it does so asynchronously, holding the rtnl lock), so that the
// next contender is not measured against that cleanup: until the count is
// back near base or has stopped falling for two seconds (other software on
// the machine may hold namespaces of its own), at most two minutes.
func waitNetnsGone(base int) {
	if base < 0 {
		return
	}
	last, since := netnsObjects(), time.Now()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		n := netnsObjects()
		if n <= base+8 {
			return
		}
		if n < last {
			last, since = n, time.Now()
		} else if time.Since(since) > 2*time.Second {
			return
		}
	}
}

var errNoPID = errors.New("skeind process not found")

// Execute runs the benchmark with a progress bar on progressOut (redrawn in
// place when tty) and writes the report into cfg.Out. The returned error
// is about writing the report; failed steps are listed in Report.Errors.
func Execute(ctx context.Context, cfg Config, progressOut io.Writer, tty bool) (*Report, error) {
	prog := newProgress(progressOut, tty, units(cfg))
	rep := Run(ctx, cfg, prog)
	prog.finish()
	return rep, rep.Write(cfg.Out)
}

package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/skeinnet/skein/test/harness"
)

// headRounds is how many turns each contender of the head-to-head phase
// takes per cell.
const headRounds = 8

// measureHeadToHead measures the cells skein's own share is read from —
// skein, the exec floor and the floor (and skein and the floor with
// dual-stack pools, at c=1) at the first level — with the contenders
// taking turns: each on a node of its own, all started at once, and each
// cell cut into headRounds rounds in which every contender runs its share
// of the pairs, the first one of a round rotating. The matrix measures
// each contender in its own stretch of the run, minutes apart, and the
// machine's speed drifts by more than the difference looked for (the
// floors moved by 50 % between two runs of the same day, and by 20 %
// within one); taking turns puts the drift on every contender alike.
// Nothing when cfg.HeadOps is 0 or skein, the exec floor or the floor is
// not selected.
func measureHeadToHead(ctx context.Context, cfg Config, prog *progress) (rows []LatencyRow, errs []string) {
	if cfg.HeadOps <= 0 || len(cfg.Levels) == 0 || !wanted(cfg, cFloor) || !wanted(cfg, cExecFloor) || !wanted(cfg, cSkein) {
		return nil, nil
	}
	level := cfg.Levels[0]
	type entry struct {
		c     contender
		sc    *scope
		concs []int
		pods  []*harness.NS
		s     sample
	}
	var es []*entry
	for _, c := range headContenders(cfg) {
		concs := cfg.Concurrency
		if c.Name() == cFloorDual || c.Name() == cSkeinDual {
			concs = []int{1}
		}
		es = append(es, &entry{c: c, sc: newScope(c.Name()+" (head to head)", cfg.Verbose), concs: concs})
	}
	baseNetNS := netnsObjects()
	defer func() {
		prog.setPhase("head to head: removing the nodes and pods")
		for _, e := range es {
			e.sc.close()
		}
		waitNetnsGone(baseNetNS)
	}()
	for _, e := range es {
		if ctx.Err() != nil {
			return nil, nil
		}
		if err := catch(func() { prepare(ctx, e.sc, e.c, cfg, level, prog) }); err != nil {
			return nil, []string{fmt.Sprintf("head to head: %s: %v", e.c.Name(), err)}
		}
	}
	for _, conc := range cfg.Concurrency {
		var in []*entry
		for _, e := range es {
			if slices.Contains(e.concs, conc) {
				e.pods, e.s = newPods(e.sc, cfg.HeadOps), sample{}
				in = append(in, e)
			}
		}
		chunk := max(conc, (cfg.HeadOps+headRounds-1)/headRounds)
		for r := 0; r*chunk < cfg.HeadOps; r++ {
			lo, hi := r*chunk, min((r+1)*chunk, cfg.HeadOps)
			for k := range in {
				if ctx.Err() != nil {
					return nil, nil
				}
				e := in[(r+k)%len(in)]
				prog.setPhase("head to head: %s, %d attachments, concurrency %d, round %d", e.c.Name(), level, conc, r+1)
				short := strings.SplitN(e.c.Name(), "+", 2)[0]
				e.s.merge(churnSample(ctx, e.c, fmt.Sprintf("%s-h%d-%d", short, conc, r), e.pods[lo:hi], conc, prog))
			}
		}
		for _, e := range in {
			row := e.s.row(conc)
			row.Contender, row.Attachments = e.c.Name(), level
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// headContenders are the head-to-head phase's contenders: the floor, the
// exec floor and skein as the matrix has them, and the dual-stack pair
// when the run has dual-stack rows.
func headContenders(cfg Config) []contender {
	cs := []contender{
		&floorContender{name: cFloor, dual: cfg.Dual},
		&execFloorContender{cniContender{name: cExecFloor}},
		newSkeinContender(cSkein, cfg.Dual),
	}
	return append(cs, dualContenders(cfg)...)
}

// headUnits is the head-to-head phase's share of units.
func headUnits(cfg Config) float64 {
	if cfg.HeadOps <= 0 || len(cfg.Levels) == 0 {
		return 0
	}
	n := len(headContenders(cfg))
	return float64(n)*(float64(cfg.Levels[0])/2+float64(cfg.Warmup)) +
		float64(cfg.HeadOps*(n+3*(len(cfg.Concurrency)-1)))
}

// prepare starts c on its node, warms it up and fills the node to level.
func prepare(ctx context.Context, sc *scope, c contender, cfg Config, level int, prog *progress) {
	name := c.Name()
	prog.setPhase("%s: starting its node", name)
	c.start(sc)
	short := strings.SplitN(name, "+", 2)[0]
	// Warm up: page cache, first-exec costs, lazily created kernel state.
	if cfg.Warmup > 0 {
		prog.setPhase("%s: warm-up", name)
		pods := newPods(sc, cfg.Warmup)
		s := churnSample(ctx, c, short+"-warm", pods, 1, prog)
		if s.failed > 0 {
			sc.Fatalf("warm-up: %d of %d ADD+DEL failed, first: %v", s.failed, cfg.Warmup, s.firstErr)
		}
		removePods(pods)
	}
	if level > 0 {
		prog.setPhase("%s: filling the node to %d attachments", name, level)
		if err := fill(c, sc, short+"-pre", 0, level, prog); err != nil {
			sc.Fatalf("fill the node to %d attachments: %v", level, err)
		}
	}
}

// fill adds the attachments from..to-1 (IDs prefix-N), each on a pod of
// its own, through the contender's preloader if it has one.
func fill(c contender, sc *scope, prefix string, from, to int, prog *progress) error {
	n := to - from
	pods := newPods(sc, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, from+i)
	}
	var err error
	if p, ok := c.(preloader); ok {
		err = p.preload(ids, pods)
	} else {
		err = parallel(8, n, func(i int) error { return c.add(ids[i], pods[i]) })
	}
	prog.add(float64(n) / 2)
	return err
}

// sample is what churns measured: every pair's ADD and DEL latency, the
// wall time they took, the CPU time the contender used, the failures.
type sample struct {
	add, del []time.Duration
	wall     time.Duration
	cpu      cpuTime
	failed   int
	firstErr error
}

func (s *sample) merge(o sample) {
	s.add, s.del = append(s.add, o.add...), append(s.del, o.del...)
	s.wall += o.wall
	s.cpu = s.cpu.add(o.cpu)
	s.failed += o.failed
	if s.firstErr == nil {
		s.firstErr = o.firstErr
	}
}

// row is the sample as a LatencyRow (without contender and level).
func (s *sample) row(conc int) LatencyRow {
	row := LatencyRow{Concurrency: conc, Add: distOf(s.add), Del: distOf(s.del), Wall: s.wall.Seconds(), Failed: s.failed}
	if n := len(s.del); n > 0 && s.wall > 0 {
		row.PerSecond = float64(n) / s.wall.Seconds()
	}
	if n := len(s.add) + s.failed; n > 0 {
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
		row.CPUPerPair = per(s.cpu.total())
		row.CPU = &CPUSplit{Runtime: per(s.cpu.runtime), Plugins: per(s.cpu.plugins), Daemons: per(s.cpu.daemons)}
	}
	if s.firstErr != nil {
		row.FirstErr = s.firstErr.Error()
	}
	return row
}

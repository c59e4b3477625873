package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Write puts results.json, report.md and the charts into dir.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	charts, err := r.charts(dir)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	defer f.Close()
	r.markdown(f, charts)
	return f.Close()
}

// Contender names as the report orders them.
const (
	cFloor     = "floor"
	cExecFloor = "exec-floor"
	cSkein     = "skein"
	cFloorDual = "floor-dual"
	cSkeinDual = "skein-dual"
	cBridge    = "bridge+host-local"
	cPtp       = "ptp+host-local"
)

func (r *Report) contenders() []string {
	if len(r.order) > 0 {
		return r.order
	}
	var out []string
	for _, row := range r.Latency {
		if !slices.Contains(out, row.Contender) {
			out = append(out, row.Contender)
		}
	}
	return out
}

func (r *Report) row(contender string, level, conc int) *LatencyRow {
	if l := r.rowNA(contender, level, conc); l != nil && l.NA == "" {
		return l
	}
	return nil
}

// rowNA also returns cells that could not be measured.
func (r *Report) rowNA(contender string, level, conc int) *LatencyRow {
	for i := range r.Latency {
		if l := &r.Latency[i]; l.Contender == contender && l.Attachments == level && l.Concurrency == conc {
			return l
		}
	}
	return nil
}

func (r *Report) levels() []int { return r.Config.Levels }

func (r *Report) topLevel() int {
	top := 0
	for _, row := range r.Latency {
		top = max(top, row.Attachments)
	}
	return top
}

func ms(v float64) string {
	switch {
	case v == 0:
		return "–"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func (r *Report) markdown(w io.Writer, charts []string) {
	m := r.Machine
	fam := "IPv4 only"
	if r.Config.Dual {
		fam = "IPv4 + IPv6"
	}
	fmt.Fprintf(w, "# skein benchmark (%s run)\n\n", r.Config.Mode)
	fmt.Fprintf(w, "%s, %d CPUs (%s), %d MiB, Linux %s, %s. Reference plugins: %s. skein: %s.  \n",
		r.Started.Format(time.RFC3339), m.CPUs, m.CPUModel, m.MemoryMiB, m.Kernel, m.Go, m.Plugins, m.Skein)
	fmt.Fprintf(w, "The run took %s. Addresses: %s. Each cell: %d ADD+DEL pairs, each on a fresh pod namespace; "+
		"concurrency c = that many runtime calls in flight (each worker ADDs a pod, DELs it, takes the next). "+
		"skein, bridge and ptp are measured through libcni with the plugin exec included (as containerd/CRI-O "+
		"call them), the plugins running in the node's namespace; the floor is the same kernel work as skein's "+
		"attachment through raw netlink in-process; the exec floor is a static Go binary that prints a canned "+
		"result, run through the same libcni path as skein (what exec'ing any Go plugin costs here). Each "+
		"contender has a node namespace of its own, with an address of each family on its lo, filled "+
		"with the stated number of attachments (one pod namespace each) before it is measured.\n\n",
		time.Duration(r.Seconds*float64(time.Second)).Round(time.Second), fam, r.Config.Ops)

	r.targets(w)

	cs := r.contenders()
	table := func(title, note string, val func(*LatencyRow) string) {
		fmt.Fprintf(w, "## %s\n\n%s\n\n| attachments | c |", title, note)
		for _, c := range cs {
			fmt.Fprintf(w, " %s |", c)
		}
		fmt.Fprint(w, "\n|---:|---:|")
		for range cs {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprintln(w)
		var na []string
		for _, l := range r.levels() {
			for _, c := range r.Config.Concurrency {
				fmt.Fprintf(w, "| %d | %d |", l, c)
				for _, name := range cs {
					v := "–"
					if row := r.rowNA(name, l, c); row != nil && row.NA != "" {
						v = "n/a†"
						if note := name + ": " + row.NA; !slices.Contains(na, note) {
							na = append(na, note)
						}
					} else if row != nil {
						v = val(row)
					}
					fmt.Fprintf(w, " %s |", v)
				}
				fmt.Fprintln(w)
			}
		}
		for _, n := range na {
			fmt.Fprintf(w, "\n† %s.\n", n)
		}
		fmt.Fprintln(w)
	}
	dist := func(d Dist) string { return fmt.Sprintf("%s / %s / %s", ms(d.P50), ms(d.P90), ms(d.P99)) }
	r.ownShare(w)
	r.dualStack(w)
	table("ADD latency", "Milliseconds, p50 / p90 / p99.", func(l *LatencyRow) string { return dist(l.Add) + failed(l) })
	table("DEL latency", "Milliseconds, p50 / p90 / p99.", func(l *LatencyRow) string { return dist(l.Del) + failed(l) })
	table("Churn throughput", "ADD+DEL pairs completed per second at each concurrency.", func(l *LatencyRow) string {
		return fmt.Sprintf("%.1f", l.PerSecond) + failed(l)
	})

	fmt.Fprintf(w, "## Ratios\n\np50 of skein divided by the contender's (below 1: skein is faster).\n\n")
	others := slices.DeleteFunc(slices.Clone(cs), func(c string) bool { return c == cSkein })
	fmt.Fprint(w, "| attachments | c |")
	for _, verb := range []string{"ADD", "DEL"} {
		for _, o := range others {
			fmt.Fprintf(w, " %s skein/%s |", verb, o)
		}
	}
	fmt.Fprint(w, "\n|---:|---:|")
	for range 2 * len(others) {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, l := range r.levels() {
		for _, c := range r.Config.Concurrency {
			s := r.row(cSkein, l, c)
			if s == nil {
				continue
			}
			fmt.Fprintf(w, "| %d | %d |", l, c)
			for _, verb := range []string{"ADD", "DEL"} {
				for _, o := range others {
					v := "–"
					if or := r.row(o, l, c); or != nil {
						if verb == "ADD" {
							v = ratio(s.Add.P50, or.Add.P50)
						} else {
							v = ratio(s.Del.P50, or.Del.P50)
						}
					}
					fmt.Fprintf(w, " %s |", v)
				}
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w)

	if dp := r.DataPath; dp != nil {
		fmt.Fprintf(w, "## Data path\n\nTwo pods on one skein node against a bare veth pair between two namespaces, "+
			"alternating in the same run; iperf3, one TCP stream, %d s per run (each run listed); TCP RR: %d one-byte "+
			"request/response round trips on one connection, µs.\n\n", r.Config.IperfSeconds, r.Config.RRCount)
		fmt.Fprintf(w, "| | bare veth | skein pods | skein / veth |\n|---|---:|---:|---:|\n")
		fmt.Fprintf(w, "| TCP Gbit/s (median) | %.2f %s | %.2f %s | %s |\n", median(dp.VethGbps), list(dp.VethGbps),
			median(dp.SkeinGbps), list(dp.SkeinGbps), pct(median(dp.SkeinGbps), median(dp.VethGbps)))
		fmt.Fprintf(w, "| TCP RR p50 µs | %.1f | %.1f | %s |\n", dp.VethRTT.P50*1000, dp.SkeinRTT.P50*1000, ratio(dp.SkeinRTT.P50, dp.VethRTT.P50))
		fmt.Fprintf(w, "| TCP RR p99 µs | %.1f | %.1f | %s |\n\n", dp.VethRTT.P99*1000, dp.SkeinRTT.P99*1000, ratio(dp.SkeinRTT.P99, dp.VethRTT.P99))
	}

	fmt.Fprintf(w, "## skeind: restart and memory\n\n")
	if rs := r.Restart; rs != nil {
		fmt.Fprintf(w, "Restart with %d attachments on the node (SIGTERM, start, a runtime retrying ADD through the plugin "+
			"until one succeeds): %s ms to the first successful ADD (each trial). Reconcile as logged: %s. "+
			"RSS after the restart: %.1f MiB.\n\n", rs.Attachments, list(rs.ToFirstADD), strings.Join(rs.Reconcile, "; "), float64(rs.RSSKiB)/1024)
	}
	if len(r.RSS) > 0 {
		fmt.Fprintf(w, "| attachments | VmRSS MiB |\n|---:|---:|\n")
		for _, s := range r.RSS {
			fmt.Fprintf(w, "| %d | %.1f |\n", s.Attachments, float64(s.KiB)/1024)
		}
		if per, ok := r.rssPer1000(); ok {
			fmt.Fprintf(w, "\nGrowth: %.2f MiB per 1,000 attachments (between the smallest and largest node).\n", per)
		}
		fmt.Fprintln(w)
	}

	if len(r.Preload) > 0 {
		fmt.Fprintf(w, "## Filling the nodes\n\nSet-up, not a measurement: time to bring each node to the next size "+
			"(skein through its gRPC service directly, the others through libcni, 8 at a time).\n\n| contender | to attachments | seconds |\n|---|---:|---:|\n")
		for _, p := range r.Preload {
			fmt.Fprintf(w, "| %s | %d | %.1f |\n", p.Contender, p.Attachments, p.Seconds)
		}
		fmt.Fprintln(w)
	}
	if len(r.Errors) > 0 {
		fmt.Fprintf(w, "## Errors\n\n")
		for _, e := range r.Errors {
			fmt.Fprintf(w, "- %s\n", e)
		}
		fmt.Fprintln(w)
	}
	if len(charts) > 0 {
		fmt.Fprintf(w, "## Charts\n\n")
		for _, c := range charts {
			fmt.Fprintf(w, "![%s](%s)\n\n", strings.TrimSuffix(c, ".png"), c)
		}
	}
	fmt.Fprintf(w, "Raw figures: results.json.\n")
}

// ownShare is the table of skein's own share of an ADD: its p50 less the
// exec floor's (running a Go plugin through libcni) and the floor's (the
// kernel work), both measured in the same run.
func (r *Report) ownShare(w io.Writer) {
	if len(r.HeadToHead) > 0 {
		fmt.Fprintf(w, "## skein's own share of an ADD, head to head\n\nADD p50 in ms at %d attachments: skein, the exec "+
			"floor (exec'ing a Go plugin through libcni), the floor (the kernel work), and what is left: skein − exec floor − "+
			"floor. Each on a node of its own, started together, taking turns: every cell is cut into %d rounds in which each "+
			"contender runs its share of the %d ADD+DEL pairs, so that the machine's drift falls on all of them alike "+
			"(the matrix below measures each contender in its own stretch of the run). The dual-stack row: skein and the "+
			"floor with an IPv6 address too, against the same exec floor. The last two columns: CPU time per ADD+DEL pair, "+
			"in ms — the benchmark process (libcni, the floor's netlink calls), the plugins it exec'd and skeind. "+
			"Beside them, DEL p50 and the pairs completed per second, skein's and the floor's: every worker takes its "+
			"next pod when its DEL returns, so a faster DEL puts more ADDs in flight at once.\n\n"+
			"| c | skein | exec floor | floor | exec floor + floor | skein's own | CPU per pair: skein | exec floor + floor "+
			"| DEL p50: skein | floor | pairs/s: skein | floor |\n"+
			"|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
			r.HeadToHead[0].Attachments, headRounds, r.Config.HeadOps)
		for _, c := range r.Config.Concurrency {
			for _, names := range [][2]string{{cSkein, cFloor}, {cSkeinDual, cFloorDual}} {
				s, e, f := r.head(names[0], c), r.head(cExecFloor, c), r.head(names[1], c)
				if s == nil || e == nil || f == nil {
					continue
				}
				label := fmt.Sprint(c)
				if names[0] == cSkeinDual {
					label += ", dual stack"
				}
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f |\n", label, ms(s.Add.P50), ms(e.Add.P50), ms(f.Add.P50),
					ms(e.Add.P50+f.Add.P50), signed(s.Add.P50-e.Add.P50-f.Add.P50), ms(s.CPUPerPair), ms(e.CPUPerPair+f.CPUPerPair),
					ms(s.Del.P50), ms(f.Del.P50), s.PerSecond, f.PerSecond)
			}
		}
		fmt.Fprintln(w)
		r.writeCPUSplit(w)
	}
	if !slices.Contains(r.contenders(), cSkein) || !slices.Contains(r.contenders(), cExecFloor) {
		return
	}
	fmt.Fprintf(w, "## skein's own share of an ADD in the matrix\n\nADD p50 in ms: skein, the exec floor, the floor, "+
		"and what is left: skein − exec floor − floor, each contender measured in its own stretch of the run.\n\n"+
		"| attachments | c | skein | exec floor | floor | exec floor + floor | skein's own |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range r.levels() {
		for _, c := range r.Config.Concurrency {
			s, e, f := r.row(cSkein, l, c), r.row(cExecFloor, l, c), r.row(cFloor, l, c)
			if s == nil || e == nil || f == nil {
				continue
			}
			fmt.Fprintf(w, "| %d | %d | %s | %s | %s | %s | %s |\n", l, c, ms(s.Add.P50), ms(e.Add.P50), ms(f.Add.P50),
				ms(e.Add.P50+f.Add.P50), signed(s.Add.P50-e.Add.P50-f.Add.P50))
		}
	}
	fmt.Fprintln(w)
}

// head is name's head-to-head row at concurrency c (nil: none).
func (r *Report) head(name string, c int) *LatencyRow {
	for i := range r.HeadToHead {
		if h := &r.HeadToHead[i]; h.Contender == name && h.Concurrency == c && h.NA == "" {
			return h
		}
	}
	return nil
}

// dualStack is the table of the dual-stack rows.
func (r *Report) dualStack(w io.Writer) {
	if len(r.DualStack) == 0 {
		return
	}
	fmt.Fprintf(w, "## Dual-stack ADD\n\nskein and the floor again, each on a node of its own, with an IPv4 and an IPv6 "+
		"address per pod, c=1, %d ADD+DEL pairs per cell. ADD ms, p50 / p99; skein's own share as above, with the "+
		"exec floor of the main table at the same size.\n\n"+
		"| attachments | floor | skein | skein − floor | skein's own |\n|---:|---:|---:|---:|---:|\n", r.Config.Ops)
	find := func(name string, level int) *LatencyRow {
		for i := range r.DualStack {
			if d := &r.DualStack[i]; d.Contender == name && d.Attachments == level && d.NA == "" {
				return d
			}
		}
		return nil
	}
	for _, l := range r.Config.DualLevels {
		f, s := find(cFloorDual, l), find(cSkeinDual, l)
		if f == nil || s == nil {
			continue
		}
		own := "–"
		if e := r.row(cExecFloor, l, 1); e != nil {
			own = signed(s.Add.P50 - e.Add.P50 - f.Add.P50)
		}
		fmt.Fprintf(w, "| %d | %s / %s | %s / %s | %s | %s |\n", l, ms(f.Add.P50), ms(f.Add.P99), ms(s.Add.P50), ms(s.Add.P99),
			signed(s.Add.P50-f.Add.P50), own)
	}
	fmt.Fprintln(w)
}

// signed formats a difference of milliseconds with its sign.
func signed(v float64) string {
	if v < 0 {
		return "−" + ms(-v)
	}
	return "+" + ms(v)
}

func failed(l *LatencyRow) string {
	if l.Failed == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d failed)", l.Failed)
}

func list(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return "(" + strings.Join(s, ", ") + ")"
}

func pct(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*a/b)
}

func (r *Report) rssPer1000() (float64, bool) {
	if len(r.RSS) < 2 {
		return 0, false
	}
	lo, hi := r.RSS[0], r.RSS[len(r.RSS)-1]
	if hi.Attachments <= lo.Attachments {
		return 0, false
	}
	return float64(hi.KiB-lo.KiB) / 1024 / float64(hi.Attachments-lo.Attachments) * 1000, true
}

// targets checks the figures against the goals in DESIGN.md and issue #3.
func (r *Report) targets(w io.Writer) {
	fmt.Fprintf(w, "## Targets\n\n| target | measured | verdict |\n|---|---|---|\n")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	low, top := 0, r.topLevel()
	if len(r.levels()) > 0 {
		low = r.levels()[0]
	}
	for _, c := range r.Config.Concurrency {
		s, b, f := r.row(cSkein, low, c), r.row(cBridge, low, c), r.row(cFloor, low, c)
		if s != nil && b != nil {
			fmt.Fprintf(w, "| ADD p50 ≤ ⅕ of bridge+host-local's (%d attachments, c=%d) | %s vs %s ms (%s) | %s |\n",
				low, c, ms(s.Add.P50), ms(b.Add.P50), ratio(s.Add.P50, b.Add.P50), verdict(s.Add.P50*5 <= b.Add.P50))
			fmt.Fprintf(w, "| DEL p50 ≤ bridge+host-local's (%d attachments, c=%d) | %s vs %s ms (%s) | %s |\n",
				low, c, ms(s.Del.P50), ms(b.Del.P50), ratio(s.Del.P50, b.Del.P50), verdict(s.Del.P50 <= b.Del.P50))
		}
		if s != nil && f != nil && c == 1 {
			fmt.Fprintf(w, "| ADD p50 within ~2 ms of the floor (DESIGN; %d attachments, c=1) | %s vs %s ms (%s ms) | %s |\n",
				low, ms(s.Add.P50), ms(f.Add.P50), signed(s.Add.P50-f.Add.P50), verdict(s.Add.P50-f.Add.P50 <= 2))
		}
		// skein's own share, head to head when the run measured it so.
		for _, names := range [][2]string{{cSkein, cFloor}, {cSkeinDual, cFloorDual}} {
			hs, he, hf, how := r.row(names[0], low, c), r.row(cExecFloor, low, c), r.row(names[1], low, c), "in the matrix"
			if len(r.HeadToHead) > 0 {
				hs, he, hf, how = r.head(names[0], c), r.head(cExecFloor, c), r.head(names[1], c), "head to head"
			}
			if hs == nil || he == nil || hf == nil {
				continue
			}
			own, stack := hs.Add.P50-he.Add.P50-hf.Add.P50, ""
			if names[0] == cSkeinDual {
				stack = ", dual stack"
			}
			if c == 1 {
				fmt.Fprintf(w, "| skein's own share of ADD p50 ≤ 1 ms (skein − exec floor − floor; %d attachments, c=1%s, %s) | %s − %s − %s = %s ms | %s |\n",
					low, stack, how, ms(hs.Add.P50), ms(he.Add.P50), ms(hf.Add.P50), signed(own), verdict(own <= 1))
			} else {
				fmt.Fprintf(w, "| ADD p50 ≤ exec floor + floor (%d attachments, c=%d%s, %s) | %s vs %s + %s = %s ms | %s |\n",
					low, c, stack, how, ms(hs.Add.P50), ms(he.Add.P50), ms(hf.Add.P50), ms(he.Add.P50+hf.Add.P50), verdict(own <= 0))
			}
		}
		if st := r.row(cSkein, top, c); s != nil && st != nil && top != low {
			fmt.Fprintf(w, "| ADD p99 at %d within 1.5× of p99 at %d (c=%d) | %s vs %s ms (%s) | %s |\n",
				top, low, c, ms(st.Add.P99), ms(s.Add.P99), ratio(st.Add.P99, s.Add.P99), verdict(st.Add.P99 <= 1.5*s.Add.P99))
		}
	}
	if dp := r.DataPath; dp != nil {
		sv, vv := median(dp.SkeinGbps), median(dp.VethGbps)
		fmt.Fprintf(w, "| pod-to-pod TCP ≥ 95%% of a bare veth pair | %.2f vs %.2f Gbit/s (%s) | %s |\n", sv, vv, pct(sv, vv), verdict(sv >= 0.95*vv))
	}
	if rs := r.Restart; rs != nil && len(rs.ToFirstADD) > 0 {
		m := median(rs.ToFirstADD)
		fmt.Fprintf(w, "| restart with %d attachments serving ADD in < 1 s (DESIGN) | %s ms (median) | %s |\n", rs.Attachments, ms(m), verdict(m < 1000))
	}
	fmt.Fprintln(w)
}

// writeCPUSplit is the head-to-head phase's CPU per pair by process:
// where skein's CPU goes beyond the two floors'.
func (r *Report) writeCPUSplit(w io.Writer) {
	header := false
	for _, c := range r.Config.Concurrency {
		s, e, f := r.head(cSkein, c), r.head(cExecFloor, c), r.head(cFloor, c)
		if s == nil || e == nil || f == nil || s.CPU == nil || e.CPU == nil || f.CPU == nil {
			continue
		}
		if !header {
			header = true
			fmt.Fprint(w, "The same CPU per pair by process, ms: the runtime's side (the benchmark process: libcni, "+
				"which execs the plugin and waits for it), the plugin binaries, and the work itself (skeind, without "+
				"processes it starts; the floor's netlink calls, which run in the benchmark process). The benchmark's "+
				"own bookkeeping per pair (its workers, timing, garbage collection) is in every benchmark-process figure, "+
				"the floor's too, so the last column, skein's total less the two floors', is short of it once.\n\n"+
				"| c | libcni's side: skein | exec floor | binary: skein | exec floor | skeind | floor | skein − floors |\n"+
				"|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s |\n", c, ms(s.CPU.Runtime), ms(e.CPU.Runtime),
			ms(s.CPU.Plugins), ms(e.CPU.Plugins), ms(s.CPU.Daemons), ms(f.CPU.Runtime+f.CPU.Plugins+f.CPU.Daemons),
			signed(s.CPUPerPair-e.CPUPerPair-f.CPUPerPair))
	}
	if header {
		fmt.Fprintln(w)
	}
}

package routebench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/skeinnet/skein/internal/routing"
)

// writeReport rewrites dir/report.md from the results files in dir (either
// may be missing: each benchmark can run alone).
func writeReport(dir string) error {
	var (
		dp *DatapathResults
		cv *ConvergenceResults
	)
	for name, v := range map[string]any{"datapath.json": &dp, "convergence.json": &cv} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(report(dp, cv)), 0o644)
}

func report(dp *DatapathResults, cv *ConvergenceResults) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Routing between nodes: benchmark\n\n")
	if dp != nil {
		datapathReport(&b, dp)
	}
	if cv != nil {
		convergenceReport(&b, cv)
	}
	return b.String()
}

func goal(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func datapathReport(b *strings.Builder, r *DatapathResults) {
	fmt.Fprintf(b, "## Data path: pod to pod across nodes\n\n")
	fmt.Fprintf(b, "- Date: %s\n- Machine: %s\n- Load average (1, 5, 15 min) before / after: %s / %s\n- Command: `%s`\n\n",
		r.Date, r.Machine, r.LoadBefore, r.LoadAfter, r.Command)
	fmt.Fprintf(b, "Node namespaces joined by veths to a bridge in its own namespace (harness.NewTopology; the baselines' "+
		"two nodes on one such underlay, the four skein nodes on another); pods attached by the real "+
		"skeind binaries (--store kubernetes against a real kube-apiserver, skein-controller granting blocks) through the "+
		"skein CNI plugin. Throughput: iperf3, one TCP stream, %d s a run (the first second omitted), %d runs a row, "+
		"the median. Request/response: a %d-byte TCP ping-pong over blocking sockets made inside the namespaces "+
		"(TCP_NODELAY), %.0f s a run after 500 round trips of warm-up, %d runs a row, every round trip pooled. "+
		"The rows are interleaved within each repetition.\n\n",
		r.Seconds, r.Reps, r.RRMessageBytes, r.RRSeconds, r.Reps)
	byName := map[string]*Row{}
	for _, row := range r.Rows {
		byName[row.Name] = row
	}
	fmt.Fprintf(b, "| row | path | MTU | throughput, median (runs) | vs baseline | paired | round trip p50 / p99 | p50 vs baseline |\n|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		runs := make([]string, len(row.Gbps))
		for i, g := range row.Gbps {
			runs[i] = fmt.Sprintf("%.2f", g)
		}
		vs, paired, rtt := "baseline", "", "baseline"
		if row.Baseline != "" {
			vs = fmt.Sprintf("%.1f%% of %s", 100*row.ThroughputRatio, row.Baseline)
			paired = fmt.Sprintf("%.1f%%", 100*pairedRatio(row, byName[row.Baseline]))
			rtt = fmt.Sprintf("%.2f×", row.RTTRatio)
		}
		fmt.Fprintf(b, "| %s | %s | %d | %.2f Gbit/s (%s) | %s | %s | %.1f / %.1f µs | %s |\n",
			row.Name, row.Path, row.MTU, row.GbpsMedian, strings.Join(runs, ", "), vs, paired, row.RTTp50us, row.RTTp99us, rtt)
	}
	fmt.Fprintf(b, "\n\"Paired\" is the median over the repetitions of the row's throughput divided by its baseline's "+
		"in the same repetition (the two runs less than %d s apart), less sensitive to the machine's load drifting "+
		"than the ratio of the medians.\n\n", len(r.Rows)*(r.Seconds+1))
	for _, row := range r.Rows {
		if row.Floor != "" {
			pr := pairedRatio(row, byName[row.Baseline])
			fmt.Fprintf(b, "- Goal: %s throughput ≥ 95%% of %s: %s (%.1f%%, paired %.1f%%). Against %s (the same path plumbed by hand): "+
				"%.1f%% of its throughput, %.2f× its median round trip.\n", row.Name, row.Baseline,
				goal(row.ThroughputRatio >= 0.95 && pr >= 0.95), 100*row.ThroughputRatio, 100*pr, row.Floor,
				100*row.FloorThroughputRatio, row.FloorRTTRatio)
		}
	}
	for _, m := range r.Missing {
		fmt.Fprintf(b, "- Not measured: %s.\n", m)
	}
	fmt.Fprintf(b, "\n")
}

func convergenceReport(b *strings.Builder, r *ConvergenceResults) {
	fmt.Fprintf(b, "## Convergence and memory\n\n")
	fmt.Fprintf(b, "- Date: %s\n- Machine: %s\n- Load average (1, 5, 15 min) before / after: %s / %s\n- Command: `%s`\n\n",
		r.Date, r.Machine, r.LoadBefore, r.LoadAfter, r.Command)
	for _, m := range r.Missing {
		fmt.Fprintf(b, "- Not measured: %s.\n", m)
	}
	if len(r.Phases) == 0 {
		return
	}
	fmt.Fprintf(b, "%d real nodes (node namespaces on one veth underlay, each a real skeind --store kubernetes against "+
		"a real kube-apiserver) and simulated nodes: Node objects with InternalIPs on the underlay subnet and %d "+
		"AddressBlocks each, created through the API (no skeind runs for them; their InternalIPs lie in "+
		"%s, a second on-link prefix of the underlay segment on every real node). Each phase creates %d blocks of one "+
		"more simulated node, one at a time, through the API and times each from the create call until its route is in the kernel "+
		"of every real node (netlink route notifications, table %d, protocol %d), then deletes it and times until the "+
		"route is gone from every node. Memory: each skeind's process_resident_memory_bytes and "+
		"go_memstats_heap_inuse_bytes after the phase (the median of the %d nodes, min–max). Sync: skeind's "+
		"skein_route_sync_seconds over the phase (mean per node: median, min–max; the median node's count), and "+
		"skein_route_remote_blocks{state=\"missing\"} summed over the nodes at its end.\n\n",
		r.RealNodes, r.BlocksPerNode, simUnderlay, r.Phases[0].Probes, routing.DefaultTable, routing.DefaultProtocol, r.RealNodes)
	fmt.Fprintf(b, "| mode | simulated nodes | remote routes held | create → route on every node p50 / p99 / max | delete → route gone p50 / p99 / max | skeind RSS | skeind Go heap in use | sync mean (syncs) | blocks not routed |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range r.Phases {
		fmt.Fprintf(b, "| %s | %d | %d | %.1f / %.1f / %.1f ms | %.1f / %.1f / %.1f ms | %s MiB | %s MiB | %s ms (%.0f) | %.0f |\n",
			p.Mode, p.SimNodes, p.Routes, p.AddP50ms, p.AddP99ms, p.AddMaxms, p.DelP50ms, p.DelP99ms, p.DelMaxms,
			spread(p.RSSMiB), spread(p.HeapMiB), spread(p.SyncMeanMs), median(p.Syncs), sumOf(p.Missing))
	}
	fmt.Fprintf(b, "\n")
	worst := 0.0
	for _, p := range r.Phases {
		worst = max(worst, p.AddP99ms)
	}
	fmt.Fprintf(b, "- Goal: p99 < 1 s in every phase: %s (worst p99 %.1f ms).\n", goal(worst < 1000), worst)
	if r.BulkObjects > 0 {
		fmt.Fprintf(b, "- The large case's %d objects (Nodes and blocks, %d creates at a time) took %.1f s to create; "+
			"every route was in every real node's kernel %.1f s after the first create.\n",
			r.BulkObjects, r.Workers, r.BulkCreateSeconds, r.BulkRoutesSeconds)
	}
	if r.ColdStartSeconds > 0 {
		fmt.Fprintf(b, "- skeind started in %s mode on nodes cleared of remote routes, with %d nodes' blocks in the API: "+
			"every route in every kernel after %.1f s (process start included).\n", r.ColdStartMode, r.SimNodes, r.ColdStartSeconds)
	}
	fmt.Fprintf(b, "\n")
}

// pairedRatio is the median over repetitions of row's throughput over
// base's in the same repetition (0 without both).
func pairedRatio(row, base *Row) float64 {
	if base == nil {
		return 0
	}
	var rs []float64
	for i := range min(len(row.Gbps), len(base.Gbps)) {
		if base.Gbps[i] > 0 {
			rs = append(rs, row.Gbps[i]/base.Gbps[i])
		}
	}
	return median(rs)
}

func sumOf(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

// spread is "median (min–max)".
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "?"
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return fmt.Sprintf("%.1f (%.1f–%.1f)", median(xs), lo, hi)
}

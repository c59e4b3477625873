package kubescale

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// write puts results.json, report.md and grant_latency.png into dir.
func write(dir string, r *Results, samples []sample) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := chart(filepath.Join(dir, "grant_latency.png"), r, samples); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(report(r)), 0o644)
}

// chart plots each grant's latency against when it started.
func chart(path string, r *Results, samples []sample) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Block grant latency during the burst (%d nodes, %d pods)", r.Nodes, r.Pods)
	p.X.Label.Text = "time since the burst began (s)"
	p.Y.Label.Text = "grant latency (ms)"
	pts := make(plotter.XYs, 0, len(samples))
	for _, s := range samples {
		if !s.Err {
			pts = append(pts, plotter.XY{X: s.At.Seconds(), Y: float64(s.Took.Microseconds()) / 1000})
		}
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	sc.GlyphStyle.Radius = vg.Points(1)
	p.Add(sc)
	for _, l := range []struct {
		name string
		v    float64
	}{{"p50", r.GrantP50ms}, {"p99", r.GrantP99ms}} {
		line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: l.v}, {X: r.BurstSeconds, Y: l.v}})
		if err != nil {
			return err
		}
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("%s %.0f ms", l.name, l.v), line)
	}
	p.Legend.Top = true
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

func report(r *Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Kubernetes mode at scale\n\n")
	fmt.Fprintf(&b, "- Date: %s\n- Machine: %s\n- Command: `%s`\n\n", r.Date, r.Machine, r.Command)
	fmt.Fprintf(&b, "A real etcd and kube-apiserver (test/kube), the real skein-controller binary (--kube-api-qps %d), "+
		"%d simulated nodes (Node objects; each an ipam.Manager over its own kubestore.Store, sharing one informer cache) "+
		"bringing %d pod addresses into use from one AddressPool with blocks of %d.\n\n",
		r.ControllerQPS, r.Nodes, r.Pods, 1<<r.BlockSizeBits)
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	row := func(k, f string, v ...any) { fmt.Fprintf(&b, "| %s | %s |\n", k, fmt.Sprintf(f, v...)) }
	row("blocks granted", "%d", r.Blocks)
	row("burst", "%.1f s (%.0f ADDs/s)", r.BurstSeconds, r.AddsPerSecond)
	row("block grant latency p50 / p99 / max", "%.0f / %.0f / %.0f ms", r.GrantP50ms, r.GrantP99ms, r.GrantMaxms)
	row("grant errors", "%d", r.GrantErrors)
	row("pod ADD latency p50 / p99 (in-memory; includes the wait for a block)", "%.1f µs / %.0f ms", r.AddP50ms*1000, r.AddP99ms)
	row("API writes by the nodes", "%d (%d in block grants: a BlockRequest create and delete each)", r.WritesTotal, r.WritesInGrants)
	row("API writes per pod ADD beyond block claims", "%g", r.WritesPerAddBeyondClaims)
	row("controller RSS at the end", "%.0f MiB", r.ControllerRSSMiB)
	row("kube-apiserver RSS at the end", "%.0f MiB", r.APIServerRSSMiB)
	row("etcd RSS at the end", "%.0f MiB", r.EtcdRSSMiB)
	row("controller restart → first new block granted", "%.2f s", r.RestartToGrantSeconds)
	row("controller restart → pool status counts it", "%.2f s", r.RestartToStatusSeconds)
	fmt.Fprintf(&b, "\n![grant latency](grant_latency.png)\n")
	return b.String()
}

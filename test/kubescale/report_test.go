package kubescale

import (
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"k8s.io/client-go/kubernetes"

	"github.com/skeinnet/skein/test/kube"
)

// write puts results.json, report.md and claim_latency.png into dir.
func write(dir string, r *Results) error {
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
	if err := chart(filepath.Join(dir, "claim_latency.png"), r); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(report(r)), 0o644)
}

// chart plots each claim's latency against when it started: the creates
// that got their block, and those refused because another node had the
// index.
func chart(path string, r *Results) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Block claims (one create each) during the run (%d nodes, %d pods)", r.Nodes, r.Pods)
	p.X.Label.Text = "time since the nodes started (s)"
	p.Y.Label.Text = "claim latency (ms)"
	var got, taken, failed plotter.XYs
	end := 0.0
	for _, s := range r.claims {
		pt := plotter.XY{X: s.At.Seconds(), Y: float64(s.Took.Microseconds()) / 1000}
		end = max(end, pt.X)
		switch {
		case s.Taken:
			taken = append(taken, pt)
		case s.Err:
			failed = append(failed, pt)
		default:
			got = append(got, pt)
		}
	}
	for _, set := range []struct {
		name string
		pts  plotter.XYs
		c    color.Color
	}{
		{"created", got, color.RGBA{B: 200, A: 255}},
		{"409: index taken", taken, color.RGBA{R: 220, A: 255}},
		{"failed (timeout, webhook)", failed, color.RGBA{G: 160, A: 255}},
	} {
		if len(set.pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(set.pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Radius = vg.Points(1)
		sc.GlyphStyle.Color = set.c
		p.Add(sc)
		p.Legend.Add(fmt.Sprintf("%s (%d)", set.name, len(set.pts)), sc)
	}
	for _, l := range []struct {
		name string
		v    float64
	}{{"p50", r.ClaimP50ms}, {"p99", r.ClaimP99ms}} {
		line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: l.v}, {X: end, Y: l.v}})
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
	fmt.Fprintf(&b, "- Date: %s\n- Machine: %s; one-minute load average %.1f at the start, %.1f at the burst's end, %.1f at most\n- Command: `%s`\n\n",
		r.Date, r.Machine, r.LoadAverageStart, r.LoadAverageEnd, r.LoadAverageMax, r.Command)
	fmt.Fprintf(&b, "A real etcd and kube-apiserver (test/kube) with deploy/kubernetes's skeind RBAC and per-node policies"+
		" (and its priority level: %t), the real skein-controller binary (--kube-api-qps %d; its webhooks, the AddressBlock one on every claim: %t), "+
		"%d simulated nodes (each skeind's ipam.Manager and its loop over its own kubestore.Store, as skeind's ServiceAccount "+
		"with a token bound to its node; Leases %t, watches %t; one shared informer cache) "+
		"bringing %d pod addresses into use from one AddressPool with blocks of %d.\n\n",
		r.FlowSchema, r.ControllerQPS, r.Webhook, r.Nodes, r.Leases, r.Watches, r.Pods, 1<<r.BlockSizeBits)
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	row := func(k, f string, v ...any) { fmt.Fprintf(&b, "| %s | %s |\n", k, fmt.Sprintf(f, v...)) }
	row("blocks obtained", "%d", r.Blocks)
	row("nodes' start and burst", "%.1f s (%.0f ADDs/s)", r.BurstSeconds, r.AddsPerSecond)
	row("**claim latency** (one create) p50 / p99 / max", "%.0f / **%.0f** / %.0f ms", r.ClaimP50ms, r.ClaimP99ms, r.ClaimMaxms)
	row("claim latency p99, startup round alone", "%.0f ms", r.StartupClaimP99ms)
	row("of a claim, client side p99: all (this process's scheduling included) / client-go's rate limiter", "%.0f / %.0f ms",
		r.ClaimClientP99ms, r.ClaimRateLimiterP99ms)
	row("shared cache's lag behind a create p50 / p99 (all node handlers run)", "%.0f / %.0f ms", r.CacheLagP50ms, r.CacheLagP99ms)
	row("grant latency (a block, all tries) p50 / p99 / max", "%.0f / %.0f / %.0f ms", r.GrantP50ms, r.GrantP99ms, r.GrantMaxms)
	row("claims / collisions (409) / of them on the node's own block / writes per claim", "%d / %d / %d / %.3f",
		r.Claims, r.Collisions, r.SelfCollisions, r.WritesPerClaim)
	row("creates per grant p99 / max", "%d / %d", r.TriesPerGrantP99, r.MaxTriesPerGrant)
	row("failed grants", "%d", r.GrantErrors)
	row("429: API server's rejected requests / 429 answers the nodes saw", "%d / %d", r.Rejected429, r.Responses429)
	if len(r.byLevel) > 0 {
		var lv []string
		for k, v := range r.byLevel {
			lv = append(lv, fmt.Sprintf("%s %.0f", k, v))
		}
		row("429s by priority level (since the API server started)", "%s", strings.Join(lv, ", "))
	}
	if r.FlowSchema {
		row("nodes' requests outside skeind's priority level", "%d", r.RequestsOutsideLevel)
		row("wait in skeind's priority level's queues p50 / p99 (bucket bound)", "%g / %g ms", r.QueueWaitP50ms, r.QueueWaitP99ms)
	}
	row("addresses on two pods / blocks lost", "%d / %d", r.Duplicates, r.BlocksLost)
	row("pod ADD p50 / p99 in the burst (includes waits for a block)", "%.3f / %.0f ms", r.AddP50ms, r.AddP99ms)
	row("ADDs that claimed a block on their path", "%d", r.AddsThatClaimed)
	row("pod ADD with a spare p50 / p99 (kube store)", "%.1f / %.1f µs", r.AddSpareP50ms*1000, r.AddSpareP99ms*1000)
	row("pod ADD p50 / p99 (embedded bbolt store, same run)", "%.1f / %.1f µs", r.AddBoltP50ms*1000, r.AddBoltP99ms*1000)
	row("API requests on those ADDs' path", "%d", r.AddSpareAPIRequests)
	row("API writes by the nodes (all) / in claims", "%d / %d", r.WritesTotal, r.WritesInGrants)
	row("API writes per pod ADD beyond block claims", "%g", r.WritesPerAddBeyondClaims)
	row("CPU s from the first claim to the burst's end: apiserver / etcd / controller / nodes", "%.1f / %.1f / %.1f / %.1f",
		r.APIServerCPUSeconds, r.EtcdCPUSeconds, r.ControllerCPUSeconds, r.NodesCPUSeconds)
	row("controller RSS at the end", "%.0f MiB", r.ControllerRSSMiB)
	row("kube-apiserver RSS at the end", "%.0f MiB", r.APIServerRSSMiB)
	row("etcd RSS at the end", "%.0f MiB", r.EtcdRSSMiB)
	row("burst's end → pool status counts every block", "%.2f s", r.StatusSeconds)
	row("controller restart → a new node has its block", "%.2f s", r.RestartToGrantSeconds)
	row("controller restart → pool status counts it", "%.2f s", r.RestartToStatusSeconds)
	if r.Leases {
		row("failed Lease renewals", "%d", r.LeaseErrors)
	}
	if r.Watches {
		row("watch events received per node (blocks and pools)", "%.0f", r.WatchEventsPerNode)
	}
	fmt.Fprintf(&b, "\nThe nodes' requests, timed at their transport (after client-go's rate limiter):\n\n")
	fmt.Fprintf(&b, "| request | count | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n")
	for _, q := range r.Requests {
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %.1f |\n", q.Kind, q.Count, q.P50ms, q.P99ms, q.Maxms)
	}
	if len(r.problems) > 0 {
		fmt.Fprintf(&b, "\nProblems:\n\n")
		for _, p := range r.problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	fmt.Fprintf(&b, "\n![claim latency](claim_latency.png)\n")
	return b.String()
}

// profileAPIServer saves a CPU profile of kube-apiserver (started with
// --profiling) taken over d, as the admin.
func profileAPIServer(ctx context.Context, tb testing.TB, env *kube.Env, d time.Duration, path string) {
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		tb.Log(err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", fmt.Sprint(int(d.Seconds()))).Timeout(d + time.Minute).DoRaw(ctx)
	if err != nil {
		tb.Logf("apiserver profile: %v", err)
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Log(err)
		return
	}
	if err := os.WriteFile(path, body, 0o644); err != nil {
		tb.Log(err)
	}
}

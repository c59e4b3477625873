package kubelet

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// startupResults is BenchmarkKubeStartup's results.json.
type startupResults struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	Command string `json:"command"`
	Node    string `json:"node"`
	Pods    int    `json:"pods"`
	// Rounds in the order they ran.
	Rounds []startupRound `json:"rounds"`
	// Summary is per network: the median over its rounds of each
	// round's figures.
	Summary []startupRound `json:"summary"`
}

// startupRound is one round's figures, in seconds. P50…Max are from the
// start of the kubectl apply to the pod seen Ready; FromCreate* from the
// watch's first sight of the pod (the SLO's start) to the same.
type startupRound struct {
	Round         int     `json:"round,omitempty"`
	Network       string  `json:"network"`
	LoadBefore    string  `json:"loadBefore,omitempty"`
	ApplySeconds  float64 `json:"applySeconds"`
	P50           float64 `json:"p50"`
	P90           float64 `json:"p90"`
	P99           float64 `json:"p99"`
	Max           float64 `json:"max"`
	FromCreateP50 float64 `json:"fromCreateP50"`
	FromCreateP99 float64 `json:"fromCreateP99"`
	DeleteSeconds float64 `json:"deleteSeconds"`
	// SandboxFailures counts FailedCreatePodSandBox events of the
	// round's pods.
	SandboxFailures int `json:"sandboxFailures"`
	// FromApplySeconds is every pod's latency, ascending.
	FromApplySeconds []float64 `json:"fromApplySeconds,omitempty"`

	fromApply, fromCreate []time.Duration
}

// stats fills the percentiles from the samples.
func (r *startupRound) stats() {
	r.P50 = percentile(r.fromApply, 50).Seconds()
	r.P90 = percentile(r.fromApply, 90).Seconds()
	r.P99 = percentile(r.fromApply, 99).Seconds()
	r.Max = percentile(r.fromApply, 100).Seconds()
	r.FromCreateP50 = percentile(r.fromCreate, 50).Seconds()
	r.FromCreateP99 = percentile(r.fromCreate, 99).Seconds()
	r.FromApplySeconds = nil
	for _, d := range r.fromApply {
		r.FromApplySeconds = append(r.FromApplySeconds, math.Round(d.Seconds()*1000)/1000)
	}
	slices.Sort(r.FromApplySeconds)
}

// percentile is the nearest-rank percentile p (0 < p ≤ 100) of d: the
// smallest sample with at least p % of the samples at or below it.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// median of v (the mean of the middle two for an even count).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summarize makes Summary: per network, in the order they first ran, the
// median over its rounds of each figure.
func (res *startupResults) summarize() {
	res.Summary = nil
	var order []string
	byNet := map[string][]startupRound{}
	for _, r := range res.Rounds {
		if _, ok := byNet[r.Network]; !ok {
			order = append(order, r.Network)
		}
		byNet[r.Network] = append(byNet[r.Network], r)
	}
	for _, name := range order {
		rs := byNet[name]
		med := func(f func(startupRound) float64) float64 {
			var v []float64
			for _, r := range rs {
				v = append(v, f(r))
			}
			return median(v)
		}
		res.Summary = append(res.Summary, startupRound{
			Network:       name,
			ApplySeconds:  med(func(r startupRound) float64 { return r.ApplySeconds }),
			P50:           med(func(r startupRound) float64 { return r.P50 }),
			P90:           med(func(r startupRound) float64 { return r.P90 }),
			P99:           med(func(r startupRound) float64 { return r.P99 }),
			Max:           med(func(r startupRound) float64 { return r.Max }),
			FromCreateP50: med(func(r startupRound) float64 { return r.FromCreateP50 }),
			FromCreateP99: med(func(r startupRound) float64 { return r.FromCreateP99 }),
			DeleteSeconds: med(func(r startupRound) float64 { return r.DeleteSeconds }),
		})
	}
}

// markdown is the report: what ran, then the summary and every round.
func (res *startupResults) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Pod startup latency: %d pods at once on one node, skein against bridge + host-local\n\n", res.Pods)
	fmt.Fprintf(&b, "- Date: %s\n- Machine: %s\n- Command: `%s`\n\n", res.Date, res.Machine, res.Command)
	fmt.Fprintf(&b, "Latency is from the start of one `kubectl apply` of %d Pod objects (pinned to %s) to each pod seen Ready by a watch; "+
		"\"from creation\" starts at the watch's first sight of the pod instead. Seconds; p50/p90/p99 nearest-rank over the round's pods. "+
		"The Kubernetes SLO is p99 ≤ 5 s (from creation, image pulls excluded: the images are on the node).\n\n", res.Pods, res.Node)
	b.WriteString("## Median over rounds\n\n")
	b.WriteString("| network | rounds | apply | p50 | p90 | **p99** | max | from creation p50 / p99 | delete all |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range res.Summary {
		rounds := 0
		for _, r := range res.Rounds {
			if r.Network == s.Network {
				rounds++
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %.2f | %.2f | %.2f | **%.2f** | %.2f | %.2f / %.2f | %.1f |\n", s.Network, rounds,
			s.ApplySeconds, s.P50, s.P90, s.P99, s.Max, s.FromCreateP50, s.FromCreateP99, s.DeleteSeconds)
	}
	b.WriteString("\n## Rounds, in the order they ran\n\n")
	b.WriteString("| round | network | load before (1/5/15 min) | apply | p50 | p90 | **p99** | max | from creation p50 / p99 | delete all | sandbox failures |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range res.Rounds {
		fmt.Fprintf(&b, "| %d | %s | %s | %.2f | %.2f | %.2f | **%.2f** | %.2f | %.2f / %.2f | %.1f | %d |\n", r.Round, r.Network, r.LoadBefore,
			r.ApplySeconds, r.P50, r.P90, r.P99, r.Max, r.FromCreateP50, r.FromCreateP99, r.DeleteSeconds, r.SandboxFailures)
	}
	return b.String()
}

// write puts results.json and report.md into dir ("" writes nothing).
func (res *startupResults) write(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(res.markdown()), 0o644)
}

func TestStartupPercentile(t *testing.T) {
	s := func(n int) []time.Duration {
		var d []time.Duration
		for i := n; i >= 1; i-- {
			d = append(d, time.Duration(i)*time.Second)
		}
		return d
	}
	for _, tc := range []struct {
		n    int
		p    float64
		want time.Duration
	}{
		{100, 50, 50 * time.Second},
		{100, 99, 99 * time.Second},
		{100, 100, 100 * time.Second},
		{10, 99, 10 * time.Second},
		{10, 50, 5 * time.Second},
		{1, 50, time.Second},
		{0, 99, 0},
	} {
		if got := percentile(s(tc.n), tc.p); got != tc.want {
			t.Errorf("percentile of 1..%d s at %g = %v, want %v", tc.n, tc.p, got, tc.want)
		}
	}
	if got := median([]float64{3, 1, 2, 10}); got != 2.5 {
		t.Errorf("median = %g, want 2.5", got)
	}
}

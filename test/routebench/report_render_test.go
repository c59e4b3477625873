package routebench

import (
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/routing"
)

// TestReport renders made-up results and checks that the goals are judged
// against their baselines and that missing rows are said.
func TestReport(t *testing.T) {
	dp := &DatapathResults{Reps: 3, Seconds: 5, RRSeconds: 3, RRMessageBytes: 64, Command: "go test x",
		Rows: []*Row{
			{Name: "underlay", MTU: 1500, Gbps: []float64{10, 11, 12}, GbpsMedian: 11, RTTp50us: 20, RTTp99us: 90},
			{Name: "direct", Baseline: "underlay", Floor: "pods-by-hand", MTU: 1500, Gbps: []float64{9.6, 10.6, 11.7}, GbpsMedian: 10.6,
				ThroughputRatio: 10.6 / 11, RTTRatio: 1.2, FloorThroughputRatio: 0.99, FloorRTTRatio: 1.01},
			{Name: "vxlan", Baseline: "vxlan-by-hand", Floor: "pods-by-hand-vxlan", MTU: 1450, GbpsMedian: 8, ThroughputRatio: 0.8, RTTRatio: 1.1},
		},
		Missing: []string{"something: why"}}
	cv := &ConvergenceResults{RealNodes: 3, BlocksPerNode: 3, Phases: []*Phase{
		{Mode: routing.ModeDirect, SimNodes: 3, Routes: 9, Probes: 50, AddP99ms: 120, RSSMiB: []float64{30, 31, 32}},
		{Mode: routing.ModeVXLAN, SimNodes: 1000, Routes: 3000, Probes: 50, AddP99ms: 1500, RSSMiB: []float64{50, 52, 51}},
	}}
	got := report(dp, cv)
	for _, want := range []string{
		"`go test x`",
		"| 11.00 Gbit/s (10.00, 11.00, 12.00) | baseline |",
		"direct throughput ≥ 95% of underlay: met (96.4%, paired 96.4%). Against pods-by-hand (the same path plumbed by hand): 99.0% of its throughput, 1.01× its median round trip.",
		"vxlan throughput ≥ 95% of vxlan-by-hand: **missed** (80.0%, paired 0.0%)",
		"Not measured: something: why.",
		"| vxlan | 1000 | 3000 |",
		"51.0 (50.0–52.0) MiB",
		"p99 < 1 s in every phase: **missed** (worst p99 1500.0 ms)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if r := report(nil, &ConvergenceResults{Missing: []string{"everything: no flag"}}); !strings.Contains(r, "Not measured: everything: no flag.") || strings.Contains(r, "Data path") {
		t.Errorf("report of a convergence run alone:\n%s", r)
	}
}

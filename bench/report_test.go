package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportWrite renders a synthetic run: the Markdown has the tables,
// ratios, target verdicts and not-applicable notes, the JSON round-trips,
// and every chart the report links exists as a PNG.
func TestReportWrite(t *testing.T) {
	cfg := Quick()
	rep := &Report{Config: cfg, order: []string{cFloor, cSkein, cBridge}}
	for _, l := range cfg.Levels {
		for _, c := range cfg.Concurrency {
			rep.Latency = append(rep.Latency,
				LatencyRow{Contender: cFloor, Attachments: l, Concurrency: c, Add: Dist{P50: 1, P99: 2}, Del: Dist{P50: 15, P99: 20}, PerSecond: 50},
				LatencyRow{Contender: cSkein, Attachments: l, Concurrency: c, Add: Dist{P50: 4, P99: 8}, Del: Dist{P50: 16, P99: 30}, PerSecond: 40})
			if l+c > 1024 {
				rep.Latency = append(rep.Latency, LatencyRow{Contender: cBridge, Attachments: l, Concurrency: c, NA: "bridge is full"})
			} else {
				rep.Latency = append(rep.Latency, LatencyRow{Contender: cBridge, Attachments: l, Concurrency: c, Add: Dist{P50: 30, P99: 60}, Del: Dist{P50: 20, P99: 40}, PerSecond: 30})
			}
		}
	}
	rep.DataPath = &DataPath{VethGbps: []float64{10}, SkeinGbps: []float64{9.7}, VethRTT: Dist{P50: 0.006}, SkeinRTT: Dist{P50: 0.007}}
	rep.Restart = &Restart{Attachments: 1000, ToFirstADD: []float64{70}}
	rep.RSS = []RSSRow{{Attachments: 10, KiB: 18 * 1024}, {Attachments: 1000, KiB: 23 * 1024}}

	dir := t.TempDir()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## ADD latency", "## DEL latency", "## Churn throughput", "## Ratios", "## Data path",
		"| 10 | 1 | 1.00 / – / 2.00 | 4.00 / – / 8.00 | 30.0 / – / 60.0 |",
		"| ADD p50 ≤ ⅕ of bridge+host-local's (10 attachments, c=1) | 4.00 vs 30.0 ms (0.13×) | met |",
		"| DEL p50 ≤ bridge+host-local's (10 attachments, c=1) | 16.0 vs 20.0 ms (0.80×) | met |",
		"ADD p50 within ~2 ms of the floor (DESIGN; 10 attachments, c=1) | 4.00 vs 1.00 ms (+3.00 ms) | **missed**",
		"| pod-to-pod TCP ≥ 95% of a bare veth pair | 9.70 vs 10.00 Gbit/s (97.0%) | met |",
		"n/a†", "† bridge+host-local: bridge is full.",
		"Growth: 5.05 MiB per 1,000 attachments",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
	for _, png := range []string{"add_p50.png", "add_p99.png", "del_p50.png", "throughput.png", "datapath.png"} {
		b, err := os.ReadFile(filepath.Join(dir, png))
		if err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
			t.Errorf("%s: not a PNG (%d bytes, %v)", png, len(b), err)
		}
		if !strings.Contains(string(md), "("+png+")") {
			t.Errorf("report.md does not embed %s", png)
		}
	}
	var back Report
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &back); err != nil || len(back.Latency) != len(rep.Latency) {
		t.Errorf("results.json does not round-trip: %v", err)
	}
}

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
	md := writeReport(t, rep, dir)
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

// TestReportHeadToHead: with a head-to-head phase, its table is written
// and the own-share targets are read from it, not from the matrix (where
// skein here would miss them), the dual-stack row against the same exec
// floor.
func TestReportHeadToHead(t *testing.T) {
	cfg := Quick()
	rep := &Report{Config: cfg, order: []string{cFloor, cExecFloor, cSkein}}
	add := func(rows *[]LatencyRow, name string, c int, p50 float64) {
		*rows = append(*rows, LatencyRow{Contender: name, Attachments: 10, Concurrency: c, Add: Dist{P50: p50, P90: 2 * p50, P99: 3 * p50}, Del: Dist{P50: p50, P90: 2 * p50, P99: 3 * p50}, PerSecond: 10, CPUPerPair: 2 * p50})
	}
	for _, c := range cfg.Concurrency {
		add(&rep.Latency, cFloor, c, 1)
		add(&rep.Latency, cExecFloor, c, 2)
		add(&rep.Latency, cSkein, c, 5)
		add(&rep.HeadToHead, cFloor, c, 1.2)
		add(&rep.HeadToHead, cExecFloor, c, 2.5)
		add(&rep.HeadToHead, cSkein, c, 4.5)
	}
	// Where the CPU ran, for skein and the two floors at c=1.
	for i, cpu := range []CPUSplit{{Runtime: 2.4}, {Runtime: 1.5, Plugins: 3.5}, {Runtime: 2, Plugins: 4, Daemons: 3}} {
		rep.HeadToHead[i].CPU = &cpu
	}
	add(&rep.HeadToHead, cFloorDual, 1, 1.5)
	add(&rep.HeadToHead, cSkeinDual, 1, 5.5)
	md := writeReport(t, rep, t.TempDir())
	for _, want := range []string{
		"## skein's own share of an ADD, head to head",
		"| 1 | 4.50 | 2.50 | 1.20 | 3.70 | +0.80 | 9.00 | 7.40 | 4.50 | 1.20 | 10 | 10 |\n",
		"| 1, dual stack | 5.50 | 2.50 | 1.50 | 4.00 | +1.50 | 11.0 | 8.00 | 5.50 | 1.50 | 10 | 10 |\n",
		"| skein's own share of ADD p50 ≤ 1 ms (skein − exec floor − floor; 10 attachments, c=1, head to head) | 4.50 − 2.50 − 1.20 = +0.80 ms | met |",
		"| skein's own share of ADD p50 ≤ 1 ms (skein − exec floor − floor; 10 attachments, c=1, dual stack, head to head) | 5.50 − 2.50 − 1.50 = +1.50 ms | **missed** |",
		"| ADD p50 ≤ exec floor + floor (10 attachments, c=8, head to head) | 4.50 vs 2.50 + 1.20 = 3.70 ms | **missed** |",
		"| c | libcni's side: skein | exec floor | binary: skein | exec floor | skeind | floor | skein − floors |",
		"| 1 | 2.00 | 1.50 | 4.00 | 3.50 | 3.00 | 2.40 | +1.60 |\n",
		"## skein's own share of an ADD in the matrix",
		"| 10 | 1 | 5.00 | 2.00 | 1.00 | 3.00 | +2.00 |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "c=1, in the matrix)") {
		t.Errorf("a target read from the matrix although the run measured head to head:\n%s", md)
	}
}

// writeReport writes rep into dir and returns its report.md.
func writeReport(t *testing.T, rep *Report, dir string) []byte {
	t.Helper()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	return md
}

package bench

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// charts draws the PNGs the report embeds and returns their file names.
func (r *Report) charts(dir string) ([]string, error) {
	var files []string
	save := func(p *plot.Plot, name string, w vg.Length) error {
		if err := p.Save(w, 4.5*vg.Inch, filepath.Join(dir, name)); err != nil {
			return err
		}
		files = append(files, name)
		return nil
	}
	if len(r.Latency) > 0 {
		for _, c := range []struct {
			file, title string
			val         func(*LatencyRow) float64
		}{
			{"add_p50.png", "ADD latency p50 (ms, log scale)", func(l *LatencyRow) float64 { return l.Add.P50 }},
			{"add_p99.png", "ADD latency p99 (ms, log scale)", func(l *LatencyRow) float64 { return l.Add.P99 }},
			{"del_p50.png", "DEL latency p50 (ms, log scale)", func(l *LatencyRow) float64 { return l.Del.P50 }},
		} {
			p, err := r.latencyPlot(c.title, c.val)
			if err != nil {
				return nil, err
			}
			if err := save(p, c.file, 9*vg.Inch); err != nil {
				return nil, err
			}
		}
		p, err := r.throughputPlot()
		if err != nil {
			return nil, err
		}
		if err := save(p, "throughput.png", 7*vg.Inch); err != nil {
			return nil, err
		}
	}
	if r.DataPath != nil {
		p, err := r.dataPathPlot()
		if err != nil {
			return nil, err
		}
		if err := save(p, "datapath.png", 5*vg.Inch); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// cells are the (attachments, concurrency) pairs in report order.
func (r *Report) cells() (labels []string, keys [][2]int) {
	for _, l := range r.levels() {
		for _, c := range r.Config.Concurrency {
			labels = append(labels, fmt.Sprintf("%d att.\nc=%d", l, c))
			keys = append(keys, [2]int{l, c})
		}
	}
	return labels, keys
}

// latencyPlot: one line per contender across every (attachments,
// concurrency) cell, log scale so that the floor and a loaded bridge
// fit on one chart.
func (r *Report) latencyPlot(title string, val func(*LatencyRow) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "ms"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	labels, keys := r.cells()
	defer func() { p.Y.Max *= 4 }() // headroom for the legend
	for i, name := range r.contenders() {
		var pts plotter.XYs
		for x, k := range keys {
			if row := r.row(name, k[0], k[1]); row != nil && val(row) > 0 {
				pts = append(pts, plotter.XY{X: float64(x), Y: val(row)})
			}
		}
		if err := addSeries(p, i, name, pts); err != nil {
			return nil, err
		}
	}
	p.NominalX(labels...)
	return p, nil
}

// logTicks labels 1, 2 and 5 times every power of ten in range (gonum's
// LogTicks labels the powers only, too few for a range of one decade).
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := p * m; v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
		for m := 3.0; m < 10; m++ {
			if v := p * m; v >= lo && v <= hi && m != 5 {
				ticks = append(ticks, plot.Tick{Value: v})
			}
		}
	}
	return ticks
}

// throughputPlot: churn throughput against concurrency on the fullest node.
func (r *Report) throughputPlot() (*plot.Plot, error) {
	top := r.topLevel()
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Churn throughput with %d attachments on the node", top)
	p.Y.Label.Text = "ADD+DEL pairs per second"
	p.X.Label.Text = "concurrent runtime calls"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	defer func() { p.Y.Max *= 1.6 }() // headroom for the legend
	var labels []string
	for _, c := range r.Config.Concurrency {
		labels = append(labels, fmt.Sprint(c))
	}
	for i, name := range r.contenders() {
		var pts plotter.XYs
		for x, c := range r.Config.Concurrency {
			if row := r.row(name, top, c); row != nil {
				pts = append(pts, plotter.XY{X: float64(x), Y: row.PerSecond})
			}
		}
		if err := addSeries(p, i, name, pts); err != nil {
			return nil, err
		}
	}
	p.NominalX(labels...)
	return p, nil
}

// dataPathPlot: median TCP throughput, bare veth against skein pods.
func (r *Report) dataPathPlot() (*plot.Plot, error) {
	dp := r.DataPath
	p := plot.New()
	p.Title.Text = "Pod-to-pod TCP throughput (iperf3, one stream)"
	p.Y.Label.Text = "Gbit/s (median)"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	b, err := plotter.NewBarChart(plotter.Values{median(dp.VethGbps), median(dp.SkeinGbps)}, vg.Points(60))
	if err != nil {
		return nil, err
	}
	b.Color = plotutil.Color(0)
	p.Add(b)
	p.NominalX("bare veth pair", "skein pods")
	return p, nil
}

// addSeries draws one contender's points as a line in its own colour and
// marker, with a legend entry; no points, no line.
func addSeries(p *plot.Plot, i int, name string, pts plotter.XYs) error {
	if len(pts) == 0 {
		return nil
	}
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	l.Color, s.Color, s.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
	l.Width = vg.Points(1.5)
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

package routebench

import (
	"flag"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

var (
	flagReps      = flag.Int("reps", 5, "datapath: repetitions of each row's throughput and latency measure (interleaved)")
	flagSeconds   = flag.Int("seconds", 5, "datapath: seconds of one iperf3 run (the first more is omitted as slow start)")
	flagRRSeconds = flag.Float64("rr-seconds", 3, "datapath: seconds of one request/response run")
)

// Row is one path of the datapath benchmark.
type Row struct {
	Name string
	// Path says what traffic crosses.
	Path string
	// Baseline is the row this one is compared with ("" for a baseline);
	// Floor, the same path plumbed by hand (skein's rows only).
	Baseline string `json:",omitempty"`
	Floor    string `json:",omitempty"`
	MTU      int
	// Gbps holds each run's throughput; the median is the figure.
	Gbps       []float64
	GbpsMedian float64
	// RTT percentiles of every run's round trips pooled (µs), and each
	// run's median.
	RTTp50us, RTTp99us float64
	RTTRunP50us        []float64
	RoundTrips         int
	// Against the baseline row: throughput ratio (goal ≥ 0.95) and
	// median round trip ratio.
	ThroughputRatio, RTTRatio float64 `json:",omitempty"`
	// Against the floor row.
	FloorThroughputRatio, FloorRTTRatio float64 `json:",omitempty"`

	client, server *harness.NS
	addr           netip.Addr
	rtts           []time.Duration
}

// DatapathResults is datapath.json.
type DatapathResults struct {
	Date, Machine, Command string
	LoadBefore, LoadAfter  string
	Reps, Seconds          int
	RRSeconds              float64
	RRMessageBytes         int
	Rows                   []*Row
	// Missing names rows that could not be measured, and why.
	Missing []string `json:",omitempty"`
}

func BenchmarkRoutingDatapath(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement: use -benchtime 1x")
	}
	harness.RequireRoot(b)
	if _, err := exec.LookPath("iperf3"); err != nil {
		b.Fatalf("iperf3: %v (make deps installs it)", err)
	}
	res := &DatapathResults{Date: time.Now().UTC().Format(time.RFC3339), Machine: kube.Machine(), Command: command(),
		LoadBefore: loadavg(), Reps: *flagReps, Seconds: *flagSeconds, RRSeconds: *flagRRSeconds, RRMessageBytes: rrMsg}

	// Baselines: two bare node namespaces on an underlay of their own
	// (the same shape as the skein nodes'), and a VXLAN pair made by hand
	// between them.
	raw := harness.NewTopology(b, harness.TopologyOptions{Nodes: 2, Prefix: "rb-raw"})
	r1, r2 := raw.Nodes[0], raw.Nodes[1]
	hand1, hand2 := handVXLAN(b, r1, r2)
	iperfServer(b, r2.NS)
	rrServer(b, r2.NS)
	hp1, hp2, hp2Addr := handPodPair(b, r1, r2, 250, harness.UnderlayDev, r1.Addr4, r2.Addr4)
	hv1, hv2, hv2Addr := handPodPair(b, r1, r2, 251, handDevice, hand1, hand2)
	for _, ns := range []*harness.NS{hp2, hv2} {
		iperfServer(b, ns)
		rrServer(b, ns)
	}
	rows := []*Row{
		{Name: "underlay", Path: "node ns → node ns over the veth underlay (bridge in between)", MTU: linkMTU(b, r1.NS, harness.UnderlayDev),
			client: r1.NS, server: r2.NS, addr: r2.Addr4},
		{Name: "vxlan-by-hand", Path: "node ns → node ns over a kernel VXLAN pair made by hand (VNI 4200, port 4789)",
			MTU: linkMTU(b, r1.NS, handDevice), client: r1.NS, server: r2.NS, addr: hand2},
		{Name: "pods-by-hand", Path: "pod → node → underlay → node → pod, routed veths and static routes made by hand",
			Baseline: "underlay", MTU: linkMTU(b, hp1, "eth0"), client: hp1, server: hp2, addr: hp2Addr},
		{Name: "pods-by-hand-vxlan", Path: "pod → node → hand-made VXLAN → underlay → node → pod, made by hand",
			Baseline: "vxlan-by-hand", MTU: linkMTU(b, hv1, "eth0"), client: hv1, server: hv2, addr: hv2Addr},
	}
	for _, r := range rows[2:] {
		if err := waitPing(b, r.client, r.addr, 30*time.Second); err != nil {
			b.Fatalf("%s: %v", r.Name, err)
		}
	}

	// skein: four nodes (two direct, two vxlan), each a real skeind
	// --store kubernetes; one pod on each through the CNI plugin.
	modes := []routing.Mode{routing.ModeDirect, routing.ModeDirect, routing.ModeVXLAN, routing.ModeVXLAN}
	topo := harness.NewTopology(b, harness.TopologyOptions{Nodes: len(modes), Prefix: "rb-node"})
	cl := kubenode.StartCluster(b, kubenode.ClusterOptions{Topology: topo,
		Args: func(n *harness.TopoNode) []string { return modeArgs(n, modes[n.Index]) }})
	pods := make([]*kubenode.Pod, len(modes))
	for i, n := range cl.Nodes {
		pods[i] = n.MustAddPod(b, "default", "bench-"+n.Name)
	}
	for i, m := range []struct {
		mode            routing.Mode
		baseline, floor string
		path            string
	}{
		{routing.ModeDirect, "underlay", "pods-by-hand", "pod → node → underlay → node → pod, skeind --routing direct"},
		{routing.ModeVXLAN, "vxlan-by-hand", "pods-by-hand-vxlan", "pod → node → skein.vxlan → underlay → node → pod, skeind --routing vxlan"},
	} {
		from, to := pods[2*i], pods[2*i+1]
		iperfServer(b, to.NS)
		rrServer(b, to.NS)
		if err := waitPing(b, from.NS, to.Addr(false), time.Minute); err != nil {
			b.Fatalf("%s: pod to pod: %v", m.mode, err)
		}
		rows = append(rows, &Row{Name: string(m.mode), Path: m.path, Baseline: m.baseline, Floor: m.floor, MTU: linkMTU(b, from.NS, "eth0"),
			client: from.NS, server: to.NS, addr: to.Addr(false)})
	}
	// Every row is measured once per repetition, the rows interleaved so
	// that the machine's load drifts over all of them alike; throughput
	// runs first, then the latency runs (no iperf3 traffic meanwhile).
	for rep := range *flagReps {
		for _, r := range rows {
			g, err := iperfClient(b, r.client, r.addr, *flagSeconds)
			if err != nil {
				b.Fatalf("%s: %v", r.Name, err)
			}
			r.Gbps = append(r.Gbps, g)
			b.Logf("rep %d %-14s %6.2f Gbit/s", rep+1, r.Name, g)
		}
	}
	for rep := range *flagReps {
		for _, r := range rows {
			rtts, err := rrLatency(r.client, r.addr, time.Duration(*flagRRSeconds*float64(time.Second)))
			if err != nil {
				b.Fatalf("%s: %v", r.Name, err)
			}
			r.rtts = append(r.rtts, rtts...)
			r.RTTRunP50us = append(r.RTTRunP50us, pctl(rtts, 50))
			b.Logf("rep %d %-14s p50 %6.1f µs p99 %6.1f µs (%d round trips)", rep+1, r.Name, pctl(rtts, 50), pctl(rtts, 99), len(rtts))
		}
	}
	byName := map[string]*Row{}
	for _, r := range rows {
		r.GbpsMedian = median(r.Gbps)
		r.RTTp50us, r.RTTp99us, r.RoundTrips = pctl(r.rtts, 50), pctl(r.rtts, 99), len(r.rtts)
		byName[r.Name] = r
	}
	for _, r := range rows {
		if base := byName[r.Baseline]; base != nil {
			r.ThroughputRatio = r.GbpsMedian / base.GbpsMedian
			r.RTTRatio = r.RTTp50us / base.RTTp50us
		}
		if floor := byName[r.Floor]; floor != nil {
			r.FloorThroughputRatio = r.GbpsMedian / floor.GbpsMedian
			r.FloorRTTRatio = r.RTTp50us / floor.RTTp50us
		}
		b.ReportMetric(r.GbpsMedian, r.Name+"-Gbit/s")
		b.ReportMetric(r.RTTp50us, r.Name+"-rtt-p50-µs")
	}
	res.Rows = rows
	res.LoadAfter = loadavg()
	if err := writeResults("datapath.json", res); err != nil {
		b.Fatal(err)
	}
}

// linkMTU is the MTU of dev in ns.
func linkMTU(t testing.TB, ns *harness.NS, dev string) int {
	t.Helper()
	l, err := ns.Handle(t).LinkByName(dev)
	if err != nil {
		t.Fatalf("%s in %s: %v", dev, ns.Name(), err)
	}
	return l.Attrs().MTU
}

// waitPing pings addr from ns until it answers.
func waitPing(t testing.TB, ns *harness.NS, addr netip.Addr, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := harness.Ping(t, ns, addr)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

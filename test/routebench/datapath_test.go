package routebench

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

var (
	flagReps      = flag.Int("reps", 3, "datapath: repetitions of each row's throughput and latency measure (interleaved)")
	flagSeconds   = flag.Int("seconds", 5, "datapath: seconds of one iperf3 run (the first more is omitted as slow start)")
	flagRRSeconds = flag.Float64("rr-seconds", 3, "datapath: seconds of one request/response run")
)

// Row is one path of the datapath benchmark.
type Row struct {
	Name string
	// Path says what traffic crosses.
	Path string
	// Baseline is the row this one is compared with ("" for a baseline).
	Baseline string `json:",omitempty"`
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
	res := &DatapathResults{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Command: command(),
		LoadBefore: loadavg(), Reps: *flagReps, Seconds: *flagSeconds, RRSeconds: *flagRRSeconds, RRMessageBytes: rrMsg}

	// Baselines: two bare node namespaces on the underlay, and a VXLAN
	// pair made by hand between them.
	u := newUnderlay(b)
	r1, r2 := u.addNode(b, "raw1"), u.addNode(b, "raw2")
	_, hand2 := handVXLAN(b, r1, r2)
	iperfServer(b, r2.ns)
	rrServer(b, r2.ns)
	rows := []*Row{
		{Name: "underlay", Path: "node ns → node ns over the veth underlay (bridge in between)", MTU: underlayMTU,
			client: r1.ns, server: r2.ns, addr: r2.addr},
		{Name: "vxlan-by-hand", Path: "node ns → node ns over a kernel VXLAN pair made by hand (VNI 4200, port 4789)",
			MTU: underlayMTU - routing.OverheadVXLAN4, client: r1.ns, server: r2.ns, addr: hand2},
	}

	// skein: two nodes per mode, each with a real skeind --store
	// kubernetes, one pod on each through the CNI plugin.
	if !routingSupported(b) {
		res.Missing = append(res.Missing, "direct, vxlan: this skeind has no --routing flag")
	} else {
		cl := startCluster(b)
		cl.startController(b)
		ctx := context.Background()
		if err := cl.c.Create(ctx, &skeinv1.AddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: "default"},
			Spec: skeinv1.AddressPoolSpec{BlockSizeBits: 5,
				Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.200.0.0/16")}}},
		}); err != nil {
			b.Fatal(err)
		}
		for _, m := range []struct {
			mode     routing.Mode
			baseline string
			path     string
		}{
			{routing.ModeDirect, "underlay", "pod → node → underlay → node → pod, skeind --routing direct"},
			{routing.ModeVXLAN, "vxlan-by-hand", "pod → node → skein.vxlan → underlay → node → pod, skeind --routing vxlan"},
		} {
			var pods [2]*pod
			for i := range pods {
				n := u.addNode(b, fmt.Sprintf("%s%d", m.mode, i+1))
				if err := cl.createNode(ctx, n.name, n.addr); err != nil {
					b.Fatal(err)
				}
				d := cl.startSkeind(b, n, m.mode)
				pods[i] = attachPod(b, d, "bench-"+n.name)
			}
			iperfServer(b, pods[1].ns)
			rrServer(b, pods[1].ns)
			if err := waitPing(b, pods[0].ns, pods[1].addr, time.Minute); err != nil {
				b.Fatalf("%s: pod to pod: %v", m.mode, err)
			}
			rows = append(rows, &Row{Name: string(m.mode), Path: m.path, Baseline: m.baseline, MTU: pods[0].mtu,
				client: pods[0].ns, server: pods[1].ns, addr: pods[1].addr})
		}
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
		b.ReportMetric(r.GbpsMedian, r.Name+"-Gbit/s")
		b.ReportMetric(r.RTTp50us, r.Name+"-rtt-p50-µs")
	}
	res.Rows = rows
	res.LoadAfter = loadavg()
	if err := writeResults("datapath.json", res); err != nil {
		b.Fatal(err)
	}
}

// pod is one pod attached through the CNI plugin.
type pod struct {
	ns   *harness.NS
	addr netip.Addr
	mtu  int
}

// attachPod ADDs a new pod namespace on d's node through libcni, as the
// kubelet would (namespace "default").
func attachPod(t testing.TB, d *skeind, id string) *pod {
	t.Helper()
	ns := harness.NewNS(t, "rb-pod")
	list := skeintest.ConfList(t, "kube", "1.1.0", d.SkeinPlugin(nil))
	rt := skeintest.RT(id, ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", id}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := d.CNI().AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatalf("ADD %s on %s: %v", id, d.node.name, err)
	}
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	p := &pod{ns: ns}
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Unmap().Is4() {
			p.addr = a.Unmap()
		}
	}
	if !p.addr.IsValid() {
		t.Fatalf("ADD %s on %s: no IPv4 address in %v", id, d.node.name, res.IPs)
	}
	eth0, err := ns.Handle(t).LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	p.mtu = eth0.Attrs().MTU
	return p
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

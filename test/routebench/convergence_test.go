package routebench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

var (
	flagNodes   = flag.Int("nodes", 1000, "convergence: simulated nodes of the large case")
	flagPerNode = flag.Int("blocks-per-node", 3, "convergence: AddressBlocks of each simulated node")
	flagProbes  = flag.Int("probes", 100, "convergence: blocks created (one at a time) and timed in each phase")
	flagWorkers = flag.Int("workers", 32, "convergence: concurrent API creates of the simulated objects")
)

// realNodes is how many real skeind nodes the convergence benchmark runs.
const realNodes = 3

// smallSims is how many simulated nodes the small case has, so that the
// memory of "a few nodes" is measured holding routes as well.
const smallSims = 3

// Phase is one mode with one number of simulated nodes.
type Phase struct {
	Mode     routing.Mode
	SimNodes int
	// Routes is how many remote-block routes every real node held
	// (besides the probe's).
	Routes int
	// Add: AddressBlock created through the API → its route in the
	// kernel of every real node. Del: block deleted → route gone from
	// every real node. In ms, over Probes blocks made one at a time.
	Probes                       int
	AddP50ms, AddP99ms, AddMaxms float64
	DelP50ms, DelP99ms, DelMaxms float64
	// Memory of each skeind after the probes (MiB): RSS and Go heap in
	// use, from its /metrics.
	RSSMiB, HeapMiB []float64
	// Each skeind's syncs during the phase (skein_route_sync_seconds):
	// how many and their mean duration; and its remote blocks not routed
	// at the end (skein_route_remote_blocks{state="missing"}).
	Syncs      []float64
	SyncMeanMs []float64
	Missing    []float64
}

// ConvergenceResults is convergence.json.
type ConvergenceResults struct {
	Date, Machine, Command string
	LoadBefore, LoadAfter  string
	RealNodes, SimNodes    int
	BlocksPerNode          int
	Phases                 []*Phase
	// Bulk: the large case's Nodes and blocks created through the API
	// (Workers at a time) in BulkCreateSeconds; every route on every real
	// node BulkRoutesSeconds after the first create.
	BulkObjects                          int
	BulkCreateSeconds, BulkRoutesSeconds float64
	Workers                              int
	// ColdStart: skeind started on nodes with no remote route while the
	// large case's blocks exist, until every route is in every kernel.
	ColdStartMode    routing.Mode
	ColdStartSeconds float64
	Missing          []string `json:",omitempty"`
}

func BenchmarkRoutingConvergence(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement: use -benchtime 1x")
	}
	harness.RequireRoot(b)
	sims := *flagNodes
	if sims < smallSims || *flagPerNode < 1 || *flagProbes < 1 {
		b.Fatalf("-nodes %d -blocks-per-node %d -probes %d: want at least %d nodes, one block, one probe", sims, *flagPerNode, *flagProbes, smallSims)
	}
	res := &ConvergenceResults{Date: time.Now().UTC().Format(time.RFC3339), Machine: kube.Machine(), Command: command(),
		LoadBefore: loadavg(), RealNodes: realNodes, SimNodes: sims, BlocksPerNode: *flagPerNode, Workers: *flagWorkers}
	ctx := context.Background()

	// Three real nodes in direct mode to begin with; each kernel watched
	// from before any remote block exists.
	topo := harness.NewTopology(b, harness.TopologyOptions{Nodes: realNodes, Prefix: "rb-node"})
	for _, n := range topo.Nodes {
		addSimUnderlay(b, n)
	}
	cl := kubenode.StartCluster(b, kubenode.ClusterOptions{Topology: topo,
		Args: func(n *harness.TopoNode) []string { return modeArgs(n, routing.ModeDirect) }})
	var watches []*routeWatch
	for _, n := range topo.Nodes {
		watches = append(watches, watchRoutes(b, n))
	}
	if err := createAll(ctx, cl.Client, []client.Object{nodeObject(probeNode, probeAddr)}, 1); err != nil {
		b.Fatal(err)
	}
	if err := createSimPool(ctx, cl.Client); err != nil {
		b.Fatal(err)
	}
	if err := createSims(ctx, cl.Kube, 0, smallSims, *flagPerNode, *flagWorkers); err != nil {
		b.Fatal(err)
	}
	nextProbe := sims * *flagPerNode // block indexes after the simulated ones

	// switchMode stops every skeind, clears what it installed (as on a
	// rebooted node) and starts them in mode; it returns how long until
	// every node held want routes.
	switchMode := func(mode routing.Mode, want int) time.Duration {
		for _, n := range cl.Nodes {
			n.D.Stop(b)
		}
		for _, n := range topo.Nodes {
			if err := clearRouting(n); err != nil {
				b.Fatal(err)
			}
		}
		if err := waitCount(watches, 0, time.Minute); err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		for i := range cl.Nodes {
			restartNode(b, cl, i, mode)
		}
		if err := waitCount(watches, want, 10*time.Minute); err != nil {
			b.Fatalf("%s: %v", mode, err)
		}
		return time.Since(began)
	}
	phase := func(mode routing.Mode, simNodes int) {
		p := &Phase{Mode: mode, SimNodes: simNodes, Routes: simNodes * *flagPerNode, Probes: *flagProbes}
		var adds, dels []time.Duration
		sum0, count0 := syncTotals(b, cl.Nodes)
		for range *flagProbes {
			idx := nextProbe
			nextProbe++
			blk := simBlock(idx, probeNode)
			prefix := simBlockPrefix(idx)
			t0 := time.Now()
			if err := cl.Client.Create(ctx, blk); err != nil {
				b.Fatal(err)
			}
			at, err := waitAll(watches, prefix, true, time.Minute)
			if err != nil {
				b.Fatalf("%s with %d simulated nodes: %v", mode, simNodes, err)
			}
			adds = append(adds, at.Sub(t0))
			t1 := time.Now()
			if err := cl.Client.Delete(ctx, blk); err != nil {
				b.Fatal(err)
			}
			if at, err = waitAll(watches, prefix, false, time.Minute); err != nil {
				b.Fatalf("%s with %d simulated nodes: %v", mode, simNodes, err)
			}
			dels = append(dels, at.Sub(t1))
		}
		p.AddP50ms, p.AddP99ms, p.AddMaxms = pctl(adds, 50)/1e3, pctl(adds, 99)/1e3, pctl(adds, 100)/1e3
		p.DelP50ms, p.DelP99ms, p.DelMaxms = pctl(dels, 50)/1e3, pctl(dels, 99)/1e3, pctl(dels, 100)/1e3
		sum1, count1 := syncTotals(b, cl.Nodes)
		for i, n := range cl.Nodes {
			syncs := count1[i] - count0[i]
			p.Syncs = append(p.Syncs, syncs)
			p.SyncMeanMs = append(p.SyncMeanMs, 1e3*(sum1[i]-sum0[i])/max(syncs, 1))
			missing, err := metric(n, `skein_route_remote_blocks{state="missing"}`)
			if err != nil {
				b.Fatal(err)
			}
			p.Missing = append(p.Missing, missing)
		}
		time.Sleep(2 * time.Second) // settle before the memory is read
		for _, n := range cl.Nodes {
			rss, heap, err := memory(n)
			if err != nil {
				b.Fatal(err)
			}
			p.RSSMiB, p.HeapMiB = append(p.RSSMiB, rss), append(p.HeapMiB, heap)
		}
		b.Logf("%-6s %4d simulated nodes, %4d routes: add p50 %.1f p99 %.1f ms, delete p50 %.1f p99 %.1f ms, RSS %.1f MiB, heap %.1f MiB, sync mean %.1f ms, missing %v",
			mode, simNodes, p.Routes, p.AddP50ms, p.AddP99ms, p.DelP50ms, p.DelP99ms, median(p.RSSMiB), median(p.HeapMiB), median(p.SyncMeanMs), p.Missing)
		res.Phases = append(res.Phases, p)
	}

	small := smallSims * *flagPerNode
	if err := waitCount(watches, small, time.Minute); err != nil {
		b.Fatal(err)
	}
	phase(routing.ModeDirect, smallSims)
	switchMode(routing.ModeVXLAN, small)
	phase(routing.ModeVXLAN, smallSims)

	// The large case, created while vxlan mode runs.
	began := time.Now()
	if err := createSims(ctx, cl.Kube, smallSims, sims, *flagPerNode, *flagWorkers); err != nil {
		b.Fatal(err)
	}
	res.BulkObjects = (sims - smallSims) * (1 + *flagPerNode)
	res.BulkCreateSeconds = time.Since(began).Seconds()
	if err := waitCount(watches, sims**flagPerNode, 10*time.Minute); err != nil {
		b.Fatal(err)
	}
	res.BulkRoutesSeconds = time.Since(began).Seconds()
	b.Logf("%d objects created in %.1f s; every route on every node after %.1f s", res.BulkObjects, res.BulkCreateSeconds, res.BulkRoutesSeconds)
	phase(routing.ModeVXLAN, sims)
	res.ColdStartMode = routing.ModeDirect
	res.ColdStartSeconds = switchMode(routing.ModeDirect, sims**flagPerNode).Seconds()
	b.Logf("direct-mode skeinds started with %d blocks: every route after %.1f s", sims**flagPerNode, res.ColdStartSeconds)
	phase(routing.ModeDirect, sims)

	for _, p := range res.Phases {
		b.ReportMetric(p.AddP99ms, fmt.Sprintf("%s-%d-add-p99-ms", p.Mode, p.SimNodes))
	}
	res.LoadAfter = loadavg()
	if err := writeResults("convergence.json", res); err != nil {
		b.Fatal(err)
	}
}

// syncTotals reads each node's skein_route_sync_seconds sum and count.
func syncTotals(b *testing.B, nodes []*kubenode.Node) (sums, counts []float64) {
	for _, n := range nodes {
		s, err := metric(n, "skein_route_sync_seconds_sum")
		if err != nil {
			b.Fatal(err)
		}
		c, err := metric(n, "skein_route_sync_seconds_count")
		if err != nil {
			b.Fatal(err)
		}
		sums, counts = append(sums, s), append(counts, c)
	}
	return sums, counts
}

// clearRouting removes from n what a routing mode installs (remote-block
// routes and the VXLAN device), as a rebooted node would start.
func clearRouting(n *harness.TopoNode) error {
	h, closeH, err := netns.Handle(n.Path())
	if err != nil {
		return err
	}
	defer closeH()
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: routing.DefaultTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("routes of %s: %w", n.Name(), err)
	}
	for _, r := range routes {
		if r.Protocol != routing.DefaultProtocol {
			continue
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("delete route %s on %s: %w", r.Dst, n.Name(), err)
		}
	}
	if l, err := h.LinkByName(routing.DefaultVXLANDevice); err == nil {
		if err := h.LinkDel(l); err != nil {
			return fmt.Errorf("delete %s on %s: %w", routing.DefaultVXLANDevice, n.Name(), err)
		}
	}
	return nil
}

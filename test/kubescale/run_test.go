package kubescale

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/kube"
)

// params are one run's settings (the benchmark's flags).
type params struct {
	nodes, pods, bits int
	rate              float64
	controllerQPS     int
	flowSchema        bool
	webhook           bool
	leases, watch     bool
	cacheCopies       bool
	fanout            bool
	claimTimeout      time.Duration
	steady            int
	profile           time.Duration
	out               string
}

// run is one measurement: it sets up the cluster, starts the nodes, runs
// the startup round, the burst and the steady ADDs, checks the result
// and restarts the controller. It fails tb on what stops it; what it
// finds wrong is in Results.problems.
func run(tb testing.TB, p params) *Results {
	if p.nodes < 1 || p.pods < p.nodes {
		tb.Fatalf("-nodes %d -pods %d: want at least one node and one pod per node", p.nodes, p.pods)
	}
	var args []string
	if p.profile > 0 {
		args = append(args, "--profiling=true")
	}
	env := kube.Start(tb, kube.Options{APIServerArgs: args})
	ctx := context.Background()
	admin, err := kube.NewClient(env.Config)
	if err != nil {
		tb.Fatal(err)
	}
	// kubestore logs through the default logger: a thousand nodes' Lease
	// warnings are counted, not printed.
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(countingHandler{&defaultLogs}))

	res := &Results{Date: time.Now().UTC().Format(time.RFC3339), Machine: kube.Machine(),
		Nodes: p.nodes, Pods: p.pods, BlockSizeBits: p.bits, RatePerSecond: p.rate, ControllerQPS: p.controllerQPS,
		FlowSchema: p.flowSchema, Webhook: p.webhook, Leases: p.leases, Watches: p.watch, CacheCopies: p.cacheCopies, Fanout: p.fanout}

	// skeind as deploy/kubernetes makes it: its namespace, RBAC, the
	// policies that narrow its writes to its own node's objects, and its
	// priority level.
	files := []string{"namespace.yaml", "skeind-rbac.yaml", "skeind-policy.yaml"}
	if p.flowSchema {
		files = append(files, "skeind-flowcontrol.yaml")
	}
	level := ""
	for _, o := range apply(ctx, tb, admin, files...) {
		if o.GetKind() == "PriorityLevelConfiguration" {
			level = string(o.GetUID())
		}
	}

	// The pool: room for every node's blocks twice over.
	perNode := (p.pods + p.nodes - 1) / p.nodes
	blockSize := 1 << p.bits
	need := (p.nodes + 1) * ((perNode+blockSize-1)/blockSize + 1) * blockSize * 2
	prefixLen := 32
	for 1<<(32-prefixLen) < need {
		prefixLen--
	}
	subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 0}), prefixLen)
	pool := &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: skeinv1.AddressPoolSpec{BlockSizeBits: int32(p.bits),
			Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(subnet.String())}}},
	}
	if err := admin.Create(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	// Each node's credentials: skeind's account, a token bound to a Pod
	// on the node (and the Node itself: the controller's GC frees the
	// blocks of nodes without one).
	names := make([]string, p.nodes+1)
	tokens := make([]string, p.nodes+1)
	start := time.Now()
	for i := range names {
		names[i] = fmt.Sprintf("node-%04d", i)
		if i == p.nodes {
			names[i] = "node-restart-probe"
		}
		tokens[i] = env.NodeToken(tb, namespace, account, names[i])
	}
	tb.Logf("%d Nodes, Pods and tokens in %v", len(names), time.Since(start).Round(time.Millisecond))

	// The controller, and its AddressBlock webhook in every claim's path
	// (failurePolicy Fail: no claim while it is away).
	port := 0
	if p.webhook {
		port = freePort(tb)
		webhookConfig(ctx, tb, admin, port)
	}
	ctl := startController(tb, env, p.controllerQPS, port)
	if p.webhook {
		waitFor(tb, "the controller's webhook", time.Minute, func() error { return webhookReady(ctx, admin, port) })
	}
	shared := sharedCache(tb, env, p.cacheCopies)
	rec := &recorder{}
	lat := &latencies{}
	o := nodeOptions{env: env, shared: shared, claimTimeout: p.claimTimeout, leases: p.leases, rec: rec, level: level, lat: lat}
	if !p.fanout {
		if o.dispatch, err = newDispatcher(ctx, shared); err != nil {
			tb.Fatal(err)
		}
	}
	nodes := startNodes(ctx, tb, o, names, tokens)
	// Registered after every node's: the shared informer hands each event
	// to its handlers in turn, so this one sees a block last.
	lastHandler(ctx, tb, shared, rec)
	probe, nodes := nodes[p.nodes], nodes[:p.nodes]
	// The probe starts after the controller's restart; its claims (and
	// their failures while the webhook is away) are not the burst's.
	probe.st.rec = &recorder{}
	defer func() {
		for _, n := range append(nodes, probe) {
			n.st.Close()
		}
	}()
	watchCtx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	if p.watch {
		for _, n := range append(nodes, probe) {
			go n.watch(watchCtx, env.URL, "/apis/skein.dev/v1alpha1/addressblocks")
			go n.watch(watchCtx, env.URL, "/apis/skein.dev/v1alpha1/addresspools")
		}
	}
	tb.Logf("%d nodes ready (leases %t, watches %t, flow schema %t)", p.nodes, p.leases, p.watch, p.flowSchema)

	m0, err := apiMetrics(ctx, env)
	if err != nil {
		tb.Fatal(err)
	}
	rej0, _ := rejected429(m0)
	pids := map[string]int{"apiserver": findPID("kube-apiserver", env.Dir), "etcd": findPID("etcd", env.Dir),
		"controller": ctl.cmd.Process.Pid, "nodes": os.Getpid()}
	cpu0 := map[string]float64{}
	for k, pid := range pids {
		cpu0[k] = cpuSeconds(pid)
	}
	if p.profile > 0 && p.out != "" {
		profiled := make(chan struct{})
		go func() {
			defer close(profiled)
			profileAPIServer(ctx, tb, env, p.profile, filepath.Join(p.out, "apiserver.cpu.pprof"))
		}()
		defer func() { <-profiled }()
	}
	res.LoadAverageStart = loadAverage()

	// Round 1: every node starts at once and claims its first block, as
	// skeind's startup does before it serves (FreeUnusedBlocks keeps a
	// spare of the default pool); then each runs the Manager's loop.
	var problems problemList
	loadDone := make(chan struct{})
	loadMax := make(chan float64, 1)
	go func() { // the highest one-minute load average while the nodes claim
		hi := loadAverage()
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-loadDone:
				loadMax <- max(hi, loadAverage())
				return
			case <-t.C:
				hi = max(hi, loadAverage())
			}
		}
	}()
	rec.t0 = time.Now()
	each(nodes, func(n *node) {
		if _, err := n.m.FreeUnusedBlocks(ctx); err != nil {
			problems.add("node %s: start: %v", n.name, err)
		}
	})
	startup := time.Since(rec.t0)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	for _, n := range nodes {
		go n.m.Run(runCtx)
	}
	tb.Logf("startup round: %v; burst of %d pod ADDs", startup.Round(time.Millisecond), p.pods)

	burst := runBurst(ctx, p, nodes, rec.t0.Add(startup), &problems)
	res.BurstSeconds = time.Since(rec.t0).Seconds()
	res.AddsPerSecond = float64(p.pods) / (res.BurstSeconds - startup.Seconds())
	res.AddP50ms, res.AddP99ms = pct(burst.times, 50), pct(burst.times, 99)
	res.AddsThatClaimed = burst.claimed
	if burst.quiet > 0 {
		res.WritesPerAddBeyondClaims = float64(burst.quietWrites) / float64(burst.quiet)
	}
	settle(nodes)
	res.LoadAverageEnd = loadAverage()
	close(loadDone)
	res.LoadAverageMax = <-loadMax
	for k, pid := range pids {
		d := cpuSeconds(pid) - cpu0[k]
		switch k {
		case "apiserver":
			res.APIServerCPUSeconds = d
		case "etcd":
			res.EtcdCPUSeconds = d
		case "controller":
			res.ControllerCPUSeconds = d
		case "nodes":
			res.NodesCPUSeconds = d
		}
	}
	burstEnd := time.Now()
	tb.Logf("burst done in %.1f s (load average %.1f)", res.BurstSeconds, res.LoadAverageEnd)

	// With a spare present: an ADD through each node's kube store, then one
	// through the embedded store, alternating.
	steady(ctx, tb, p, subnet, nodes, res, &problems)

	claimFigures(res, rec, nodes)
	problems.addAll(rec.errs)
	if rec.nErrs > len(rec.errs) {
		problems.add("... %d failed claims in all", rec.nErrs)
	}

	// Every address on one node only, against the blocks in the API.
	var list skeinv1.AddressBlockList
	if err := admin.List(ctx, &list); err != nil {
		tb.Fatal(err)
	}
	blocks, err := apiBlocks(list.Items)
	if err != nil {
		tb.Fatal(err)
	}
	held := map[string][]netip.Addr{}
	owned := map[string][]netip.Prefix{}
	for _, n := range nodes {
		held[n.name] = n.addrs
		owned[n.name] = n.m.OwnedBlocks()
		res.BlocksLost += int(n.lost.Load())
	}
	found, dups := checkAddresses(blocks, held)
	res.Duplicates = dups
	problems.addAll(found)
	problems.addAll(checkOwned(blocks, owned))
	if res.BlocksLost > 0 {
		problems.add("%d blocks lost by their nodes", res.BlocksLost)
	}
	if managerLogs.n.Load() > 0 {
		problems.add("the Managers logged warnings or errors: %v", &managerLogs)
	}

	waitFor(tb, "pool status counts every block", 5*time.Minute, func() error {
		return poolCounts(ctx, admin, int64(len(blocks)))
	})
	res.StatusSeconds = time.Since(burstEnd).Seconds()
	res.ControllerRSSMiB = rssMiB(ctl.cmd.Process.Pid)
	res.APIServerRSSMiB = rssMiB(pids["apiserver"])
	res.EtcdRSSMiB = rssMiB(pids["etcd"])
	m1, err := apiMetrics(ctx, env)
	if err != nil {
		tb.Fatal(err)
	}
	if p.out != "" {
		if err := os.MkdirAll(p.out, 0o755); err == nil {
			_ = os.WriteFile(filepath.Join(p.out, "apiserver-metrics.txt"), []byte(m1), 0o644)
		}
	}
	rej1, byLevel := rejected429(m1)
	res.Rejected429, res.byLevel = int64(rej1-rej0), byLevel
	if p.flowSchema {
		// How long skeind's requests waited in its priority level's
		// queues (the bucket bound: 0 = not queued).
		match := map[string]string{"priority_level": "skeind", "execute": "true"}
		w, _ := histogramQuantile(m1, "apiserver_flowcontrol_request_wait_duration_seconds", match, 0.99)
		res.QueueWaitP99ms = w * 1000
		w, _ = histogramQuantile(m1, "apiserver_flowcontrol_request_wait_duration_seconds", match, 0.5)
		res.QueueWaitP50ms = w * 1000
	}

	// Restart the controller with all those blocks; a node that has none
	// starts and claims its first, trying again until the claim goes
	// through (it fails while the webhook is not up), as skeind's loop
	// would.
	ctl.stop()
	restart := time.Now()
	probe.st.rec.t0 = restart
	ctl = startController(tb, env, p.controllerQPS, port)
	waitFor(tb, "a node starting after the controller's restart has its block", 2*time.Minute, func() error {
		if _, err := probe.m.FreeUnusedBlocks(ctx); err != nil {
			return err
		}
		if got := probe.st.obtained(); got != 1 {
			return fmt.Errorf("%d blocks", got)
		}
		return nil
	})
	res.RestartToGrantSeconds = time.Since(restart).Seconds()
	waitFor(tb, "pool status after the restart", 5*time.Minute, func() error {
		return poolCounts(ctx, admin, int64(len(blocks)+1))
	})
	res.RestartToStatusSeconds = time.Since(restart).Seconds()
	ctl.stop()

	for _, n := range append(nodes, probe) {
		res.Responses429 += n.meter.rejected.Load()
		res.RequestsOutsideLevel += n.meter.otherLevel.Load()
		res.WritesTotal += n.meter.writes.Load()
		res.WritesInGrants += n.meter.claimWrites.Load()
	}
	for _, n := range nodes {
		res.WatchEventsPerNode += float64(n.watchEvents.Load()) / float64(len(nodes))
		res.LeaseErrors += int64(n.counter("skein_node_lease_errors_total"))
	}
	res.Requests = requestTable(lat)
	res.problems = problems.list()
	return res
}

// startNodes starts a node per name, 32 at a time (the TLS handshakes and
// cache registrations at start are not what is measured).
func startNodes(ctx context.Context, tb testing.TB, o nodeOptions, names, tokens []string) []*node {
	nodes := make([]*node, len(names))
	dir := tb.TempDir()
	errs := make(chan error, len(names))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			n, err := startNode(ctx, o, names[i], tokens[i], filepath.Join(dir, names[i]+".db"))
			if err != nil {
				errs <- err
				return
			}
			nodes[i] = n
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		for _, n := range nodes {
			if n != nil {
				n.st.Close()
			}
		}
		tb.Fatal(err)
	}
	return nodes
}

// each runs f for every node at once and waits.
func each(nodes []*node, f func(*node)) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(n)
		}()
	}
	wg.Wait()
}

type burstFigures struct {
	times              []time.Duration
	claimed            int64 // ADDs that claimed on their path
	quiet, quietWrites int64 // ADDs that did not, and their writes
}

// runBurst brings p.pods addresses into use: each node runs its ADDs one
// after another (as the CNI plugin's calls reach one skeind). With -rate,
// pod k of the cluster starts at k/rate, and pods are dealt to nodes in a
// shuffled order (fixed seed) so that the nodes' blocks do not all fill at
// once.
func runBurst(ctx context.Context, p params, nodes []*node, t0 time.Time, problems *problemList) burstFigures {
	slots := make([][]int, len(nodes))
	order := make([]int, p.pods)
	for k := range order {
		order[k] = k % len(nodes)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for k, n := range order {
		slots[n] = append(slots[n], k)
	}
	var (
		mu                         sync.Mutex
		f                          burstFigures
		claimed, quiet, quietWrite atomic.Int64
	)
	f.times = make([]time.Duration, 0, p.pods)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, len(slots[i]))
			for _, k := range slots[i] {
				if p.rate > 0 {
					time.Sleep(time.Until(t0.Add(time.Duration(float64(k) / p.rate * float64(time.Second)))))
				}
				c := &pathCount{}
				start := time.Now()
				a, err := n.m.Allocate(c.on(ctx), ipam.Request{Pool: "default"})
				mine = append(mine, time.Since(start))
				if err != nil {
					problems.add("node %s: ADD: %v", n.name, err)
					continue
				}
				n.took(a)
				if c.creates.Load() > 0 {
					claimed.Add(1)
				} else {
					quiet.Add(1)
					quietWrite.Add(c.writes.Load())
				}
			}
			mu.Lock()
			f.times = append(f.times, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	f.claimed, f.quiet, f.quietWrites = claimed.Load(), quiet.Load(), quietWrite.Load()
	return f
}

// settle waits until no node has had a claim in flight for a second (the
// Managers' loops claim spares after the last ADD), at most a minute.
func settle(nodes []*node) {
	deadline := time.Now().Add(time.Minute)
	idleSince := time.Now()
	for time.Now().Before(deadline) && time.Since(idleSince) < time.Second {
		if slices.ContainsFunc(nodes, func(n *node) bool { return n.st.busy() }) {
			idleSince = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// steady times p.steady ADDs a node through its kube store, now that each
// has a spare, against as many through the embedded bbolt store (one
// Manager over a fresh file, same pool geometry, its block claims local
// writes on the ADD's path as in embedded mode), alternating one of each.
func steady(ctx context.Context, tb testing.TB, p params, subnet netip.Prefix, nodes []*node, res *Results, problems *problemList) {
	if p.steady <= 0 {
		return
	}
	bolt, err := store.OpenBolt(filepath.Join(tb.TempDir(), "embedded.db"), store.BoltOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	defer bolt.Close()
	bm, err := ipam.NewManager(ipam.Options{Store: bolt, Node: "embedded"})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := bm.CreatePool(ctx, store.Pool{Name: "default", Subnets: []netip.Prefix{subnet}, BlockSizeBits: p.bits}); err != nil {
		tb.Fatal(err)
	}
	var kubeT, boltT []time.Duration
	for range p.steady {
		for _, n := range nodes {
			c := &pathCount{}
			start := time.Now()
			a, err := n.m.Allocate(c.on(ctx), ipam.Request{Pool: "default"})
			kubeT = append(kubeT, time.Since(start))
			if err != nil {
				problems.add("node %s: steady ADD: %v", n.name, err)
			} else {
				n.took(a)
			}
			res.AddSpareAPIRequests += c.requests.Load()

			start = time.Now()
			_, err = bm.Allocate(ctx, ipam.Request{Pool: "default"})
			boltT = append(boltT, time.Since(start))
			if err != nil {
				problems.add("embedded ADD: %v", err)
			}
		}
	}
	res.AddSpareP50ms, res.AddSpareP99ms = pct(kubeT, 50), pct(kubeT, 99)
	res.AddBoltP50ms, res.AddBoltP99ms = pct(boltT, 50), pct(boltT, 99)
}

// claimFigures fills the claim and grant figures from the recorder and
// the nodes' meters.
func claimFigures(res *Results, rec *recorder, nodes []*node) {
	var claims, startupClaims, grants, client, limiter []time.Duration
	for _, s := range rec.claims {
		claims = append(claims, s.Took)
		client = append(client, s.Client)
		limiter = append(limiter, s.Limiter)
		if s.Round == 1 {
			startupClaims = append(startupClaims, s.Took)
		}
	}
	var tries []int
	for _, g := range rec.grants {
		tries = append(tries, g.Tries)
		res.MaxTriesPerGrant = max(res.MaxTriesPerGrant, g.Tries)
		if g.Err {
			res.GrantErrors++
			continue
		}
		grants = append(grants, g.Took)
	}
	res.Claims = len(rec.claims)
	res.ClaimP50ms, res.ClaimP99ms, res.ClaimMaxms = pct(claims, 50), pct(claims, 99), pct(claims, 100)
	res.StartupClaimP99ms = pct(startupClaims, 99)
	res.ClaimClientP99ms = pct(client, 99)
	res.ClaimRateLimiterP99ms = pct(limiter, 99)
	lags := rec.cacheLags()
	res.CacheLagP50ms, res.CacheLagP99ms = pct(lags, 50), pct(lags, 99)
	res.GrantP50ms, res.GrantP99ms, res.GrantMaxms = pct(grants, 50), pct(grants, 99), pct(grants, 100)
	res.TriesPerGrantP99 = rank(tries, 99)
	var creates int64
	for _, n := range nodes {
		res.Blocks += int64(n.st.obtained())
		creates += n.meter.creates.Load()
		res.Collisions += n.meter.taken.Load()
		res.SelfCollisions += int64(n.st.selfCollided())
		res.storeConflicts += n.counter("skein_block_claim_conflicts_total")
	}
	if res.Blocks > 0 {
		res.WritesPerClaim = float64(creates) / float64(res.Blocks)
	}
	res.claims, res.grants = rec.claims, rec.grants
}

// pct is the p-th percentile of ds in milliseconds.
func pct(ds []time.Duration, p float64) float64 { return ms(rank(ds, p)) }

// rank is the p-th percentile of xs (nearest rank); zero when empty.
func rank[T int | time.Duration](xs []T, p float64) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}

// problemList gathers what a run found wrong, from many goroutines; it
// keeps the first few of each run.
type problemList struct {
	mu    sync.Mutex
	items []string
	more  int
}

func (l *problemList) add(f string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.items) >= 40 {
		l.more++
		return
	}
	l.items = append(l.items, fmt.Sprintf(f, a...))
}

func (l *problemList) addAll(s []string) {
	for _, x := range s {
		l.add("%s", x)
	}
}

func (l *problemList) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.items)
	if l.more > 0 {
		out = append(out, fmt.Sprintf("... and %d more", l.more))
	}
	return out
}

// requestTable summarizes the nodes' requests by kind.
func requestTable(l *latencies) []RequestFigures {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []RequestFigures
	for k, ds := range l.by {
		out = append(out, RequestFigures{Kind: k, Count: len(ds), P50ms: pct(ds, 50), P99ms: pct(ds, 99), Maxms: pct(ds, 100)})
	}
	slices.SortFunc(out, func(a, b RequestFigures) int { return b.Count - a.Count })
	return out
}

// lastHandler adds a handler to the shared cache's AddressBlock informer
// that records when it first sees each block.
func lastHandler(ctx context.Context, tb testing.TB, c cache.Cache, rec *recorder) {
	inf, err := c.GetInformer(ctx, &skeinv1.AddressBlock{})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if b, ok := o.(*skeinv1.AddressBlock); ok {
				rec.seen(b.Name)
			}
		},
	}); err != nil {
		tb.Fatal(err)
	}
}

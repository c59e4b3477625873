// Package kubescale is the Kubernetes-mode scale benchmark: a real etcd and
// kube-apiserver (test/kube), the real skein-controller binary, and many
// simulated nodes, each running skeind's own block-claim code (an
// ipam.Manager over a kubestore.Store) to bring pod addresses into use.
//
//	go test -run '^$' -bench KubeScale -benchtime 1x -timeout 60m ./test/kubescale/ \
//	    -args -nodes 1000 -pods 100000 -out bench/out/kube-scale
//
// The simulated nodes share one informer cache (kubestore.Options.Cache):
// a thousand sets of informers, each with its own watches, would measure
// the benchmark's process on two cores more than the controller. Each
// node still has its own API client, whose requests kubestore counts.
package kubescale

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

var (
	flagNodes = flag.Int("nodes", 100, "simulated nodes")
	flagPods  = flag.Int("pods", 10000, "pod addresses brought into use, spread evenly over the nodes")
	flagRate  = flag.Float64("rate", 0, "pod ADDs per second over the cluster; 0 = each node as fast as it can")
	flagQPS   = flag.Int("controller-qps", 100, "skein-controller --kube-api-qps (its --kube-api-burst is twice this)")
	flagBits  = flag.Int("block-bits", 5, "AddressPool blockSizeBits (5 = blocks of 32 addresses)")
	flagOut   = flag.String("out", "", "directory for results.json, report.md and grant_latency.png (empty: only logged)")
)

func init() { ctrl.SetLogger(logr.Discard()) }

// timedStore is the node's kubestore.Store with GrantBlock timed; the
// Manager finds GrantBlock through it (ipam.BlockGranter) and so runs
// kubestore's own code.
type timedStore struct {
	*kubestore.Store
	grants atomic.Int64
	rec    *recorder
}

func (s *timedStore) GrantBlock(ctx context.Context, pool, node string) (store.Block, error) {
	start := time.Now()
	b, err := s.Store.GrantBlock(ctx, pool, node)
	s.rec.grant(start, time.Since(start), err)
	if err == nil {
		s.grants.Add(1)
	}
	return b, err
}

// sample is one grant: when it started (since the burst began) and how long.
type sample struct {
	At, Took time.Duration
	Err      bool
}

type recorder struct {
	t0 time.Time
	mu sync.Mutex
	s  []sample
}

func (r *recorder) grant(start time.Time, took time.Duration, err error) {
	r.mu.Lock()
	r.s = append(r.s, sample{At: start.Sub(r.t0), Took: took, Err: err != nil})
	r.mu.Unlock()
}

type agent struct {
	name string
	st   *timedStore
	m    *ipam.Manager
}

// Results are what the benchmark reports (results.json).
type Results struct {
	Date, Machine, Command string
	Nodes, Pods            int
	BlockSizeBits          int
	RatePerSecond          float64 `json:",omitempty"`
	ControllerQPS          int
	Blocks                 int64
	BurstSeconds           float64
	AddsPerSecond          float64
	GrantP50ms, GrantP99ms float64
	GrantMaxms             float64
	GrantErrors            int
	AddP50ms, AddP99ms     float64
	// WritesTotal is every non-GET request the nodes made; per grant it
	// is a BlockRequest create and delete.
	WritesTotal, WritesInGrants int64
	// WritesPerAddBeyondClaims counts writes made by ADDs that did not
	// need a new block, per such ADD.
	WritesPerAddBeyondClaims float64
	ControllerRSSMiB         float64
	APIServerRSSMiB          float64
	EtcdRSSMiB               float64
	// Restart: SIGTERM to the old controller, a new one started; then the
	// time until a new BlockRequest is Complete (a node has its block) and
	// until the pool's status counts it.
	RestartToGrantSeconds, RestartToStatusSeconds float64
}

func BenchmarkKubeScale(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement: use -benchtime 1x")
	}
	nodes, pods := *flagNodes, *flagPods
	if nodes < 1 || pods < nodes {
		b.Fatalf("-nodes %d -pods %d: want at least one node and one pod per node", nodes, pods)
	}
	env := kube.Start(b, kube.Options{})
	ctx := context.Background()
	admin, err := kube.NewClient(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	res := &Results{Date: time.Now().UTC().Format(time.RFC3339), Machine: kube.Machine(), Command: command(),
		Nodes: nodes, Pods: pods, BlockSizeBits: *flagBits, RatePerSecond: *flagRate, ControllerQPS: *flagQPS}

	// The pool: room for every node's blocks twice over.
	perNode := (pods + nodes - 1) / nodes
	blockSize := 1 << *flagBits
	need := (nodes + 1) * ((perNode + blockSize - 1) / blockSize) * blockSize * 2
	prefixLen := 32
	for 1<<(32-prefixLen) < need {
		prefixLen--
	}
	pool := &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: skeinv1.AddressPoolSpec{BlockSizeBits: int32(*flagBits),
			Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(fmt.Sprintf("10.0.0.0/%d", prefixLen))}}},
	}
	if err := admin.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}
	// Node objects: the controller's GC frees the blocks of nodes without one.
	names := make([]string, nodes+1)
	for i := range names {
		names[i] = fmt.Sprintf("node-%04d", i)
		if i == nodes {
			names[i] = "node-restart-probe"
		}
		if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i]}}); err != nil {
			b.Fatal(err)
		}
	}

	ctl := startController(b, env)
	shared := sharedCache(b, env)

	rec := &recorder{}
	agents := make([]*agent, nodes+1)
	dir := b.TempDir()
	var wg sync.WaitGroup
	errs := make(chan error, len(agents))
	sem := make(chan struct{}, 32) // bound the TLS handshakes at start
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			a, err := startAgent(ctx, env, shared, names[i], filepath.Join(dir, names[i]+".db"), rec)
			if err != nil {
				errs <- err
				return
			}
			agents[i] = a
		}()
	}
	wg.Wait()
	defer func() {
		for _, a := range agents {
			if a != nil {
				a.st.Close()
			}
		}
	}()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.Logf("%d nodes ready; burst of %d pod ADDs", nodes, pods)

	// The burst: each node runs its ADDs one after another (as the CNI
	// plugin's calls reach one skeind). With -rate, pod k of the cluster
	// starts at k/rate, and pods are dealt to nodes in a shuffled order
	// (fixed seed) so that the nodes' blocks do not all fill at once.
	slots := make([][]int, nodes)
	order := make([]int, pods)
	for k := range order {
		order[k] = k % nodes
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for k, n := range order {
		slots[n] = append(slots[n], k)
	}
	var (
		addMu    sync.Mutex
		addTimes = make([]time.Duration, 0, pods)
		noGrant  atomic.Int64 // ADDs that did not need a block
		noGrantW atomic.Int64 // writes those ADDs made
		failed   atomic.Int64
	)
	rec.t0 = time.Now()
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := agents[i]
			var mine []time.Duration
			for _, k := range slots[i] {
				if *flagRate > 0 {
					time.Sleep(time.Until(rec.t0.Add(time.Duration(float64(k) / *flagRate * float64(time.Second)))))
				}
				grants := a.st.grants.Load()
				_, w0 := a.st.APIRequests()
				start := time.Now()
				_, err := a.m.Allocate(ctx, ipam.Request{Pool: "default"})
				mine = append(mine, time.Since(start))
				if err != nil {
					if failed.Add(1) <= 5 {
						b.Errorf("node %s: ADD: %v", a.name, err)
					}
					continue
				}
				if a.st.grants.Load() == grants {
					_, w1 := a.st.APIRequests()
					noGrant.Add(1)
					noGrantW.Add(int64(w1 - w0))
				}
			}
			addMu.Lock()
			addTimes = append(addTimes, mine...)
			addMu.Unlock()
		}()
	}
	wg.Wait()
	burst := time.Since(rec.t0)
	res.BurstSeconds = burst.Seconds()
	res.AddsPerSecond = float64(pods) / burst.Seconds()

	var grantTimes []time.Duration
	for _, s := range rec.s {
		if s.Err {
			res.GrantErrors++
			continue
		}
		grantTimes = append(grantTimes, s.Took)
	}
	res.GrantP50ms, res.GrantP99ms, res.GrantMaxms = pct(grantTimes, 50), pct(grantTimes, 99), pct(grantTimes, 100)
	res.AddP50ms, res.AddP99ms = pct(addTimes, 50), pct(addTimes, 99)
	var grants int64
	for _, a := range agents[:nodes] {
		_, w := a.st.APIRequests()
		res.WritesTotal += int64(w)
		grants += a.st.grants.Load()
	}
	res.Blocks = grants
	res.WritesInGrants = res.WritesTotal - noGrantW.Load()
	if n := noGrant.Load(); n > 0 {
		res.WritesPerAddBeyondClaims = float64(noGrantW.Load()) / float64(n)
	}

	// The pool's status catches up with every block.
	waitFor(b, "pool status counts every block", 5*time.Minute, func() error {
		return poolCounts(ctx, admin, grants)
	})
	res.ControllerRSSMiB = rssMiB(ctl.cmd.Process.Pid)
	res.APIServerRSSMiB = rssMiB(findPID("kube-apiserver", env.Dir))
	res.EtcdRSSMiB = rssMiB(findPID("etcd", env.Dir))

	// Restart the controller with all those blocks; a node that has none
	// asks for one.
	ctl.stop()
	restart := time.Now()
	ctl = startController(b, env)
	probe := agents[nodes]
	if _, err := probe.m.Allocate(ctx, ipam.Request{Pool: "default"}); err != nil {
		b.Fatalf("first ADD after the restart: %v", err)
	}
	res.RestartToGrantSeconds = time.Since(restart).Seconds()
	waitFor(b, "pool status after the restart", 5*time.Minute, func() error {
		return poolCounts(ctx, admin, grants+1)
	})
	res.RestartToStatusSeconds = time.Since(restart).Seconds()
	ctl.stop()

	b.ReportMetric(res.GrantP50ms, "grant-p50-ms")
	b.ReportMetric(res.GrantP99ms, "grant-p99-ms")
	b.ReportMetric(res.WritesPerAddBeyondClaims, "writes/add-beyond-claims")
	b.ReportMetric(res.ControllerRSSMiB, "controller-MiB")
	b.ReportMetric(res.APIServerRSSMiB, "apiserver-MiB")
	b.ReportMetric(res.RestartToGrantSeconds, "restart-to-grant-s")
	js, _ := json.MarshalIndent(res, "", "  ")
	b.Logf("results:\n%s", js)
	if *flagOut != "" {
		if err := write(*flagOut, res, rec.s); err != nil {
			b.Fatal(err)
		}
	}
}

// grantTimeout is the simulated nodes' wait for a block. skeind's default
// (10 s) would turn a long queue at the controller into failed ADDs; the
// benchmark waits longer so as to measure the queue.
const grantTimeout = 5 * time.Minute

func startAgent(ctx context.Context, env *kube.Env, shared cache.Cache, name, dbPath string, rec *recorder) (*agent, error) {
	local, err := store.OpenBolt(dbPath, store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		return nil, err
	}
	st, err := kubestore.New(ctx, kubestore.Options{Config: env.Config, Node: name, Local: local,
		GrantTimeout: grantTimeout, Cache: shared})
	if err != nil {
		local.Close()
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	ts := &timedStore{Store: st, rec: rec}
	m, err := ipam.NewManager(ipam.Options{Store: ts, Node: name})
	if err != nil {
		st.Close()
		return nil, err
	}
	return &agent{name: name, st: ts, m: m}, nil
}

// sharedCache is the simulated nodes' one informer cache: pools,
// namespaces, and every node's blocks and requests.
func sharedCache(b *testing.B, env *kube.Env) cache.Cache {
	c, err := cache.New(env.Config, cache.Options{Scheme: kubestore.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	for _, obj := range []client.Object{&skeinv1.AddressPool{}, &skeinv1.AddressBlock{}, &skeinv1.BlockRequest{}, &corev1.Namespace{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			b.Fatal(err)
		}
	}
	go c.Start(ctx) //nolint:errcheck // ends with ctx
	syncCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if !c.WaitForCacheSync(syncCtx) {
		b.Fatal("shared cache did not sync")
	}
	return c
}

type controllerProc struct {
	cmd  *exec.Cmd
	once sync.Once
}

func (p *controllerProc) stop() {
	p.once.Do(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		p.cmd.Wait()
	})
}

// startController runs the skein-controller binary as the admin, without
// leader election (one replica), metrics, probes or webhook.
func startController(b *testing.B, env *kube.Env) *controllerProc {
	kc, err := env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		b.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(env.Dir, "controller.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	qps := strconv.Itoa(*flagQPS)
	cmd := exec.Command(filepath.Join(skeintest.Binaries(b), "skein-controller"),
		"--kubeconfig", kc, "--metrics-addr", "0", "--health-addr", "0", "--leader-elect=false",
		"--webhook-port", "0", "--log-level", "warn",
		"--kube-api-qps", qps, "--kube-api-burst", strconv.Itoa(2**flagQPS))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &controllerProc{cmd: cmd}
	b.Cleanup(p.stop)
	return p
}

func poolCounts(ctx context.Context, c client.Client, blocks int64) error {
	p := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "default"}, p); err != nil {
		return err
	}
	if p.Status.BlocksAllocated != blocks {
		return fmt.Errorf("status.blocksAllocated %d, want %d", p.Status.BlocksAllocated, blocks)
	}
	return nil
}

func waitFor(b *testing.B, what string, limit time.Duration, f func() error) {
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pct is the p-th percentile of ds in milliseconds (nearest rank).
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return float64(s[i].Nanoseconds()) / 1e6
}

// rssMiB reads VmRSS of pid from /proc; 0 when it cannot.
func rssMiB(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// findPID finds the process named name whose command line mentions dir
// (test/kube's processes take their data and certificates from it).
func findPID(name, dir string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cl), "\x00")
		if filepath.Base(args[0]) == name && strings.Contains(string(cl), dir) {
			return pid
		}
	}
	return 0
}

func command() string {
	return fmt.Sprintf("go test -run '^$' -bench KubeScale -benchtime 1x ./test/kubescale/ -args -nodes %d -pods %d -controller-qps %d -block-bits %d -rate %g",
		*flagNodes, *flagPods, *flagQPS, *flagBits, *flagRate)
}

package kurma

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// The benchmarks put an image-backed pod network (the reference ptp and
// host-local packed by skeinctl pack-cni, run by skeind in its sandbox)
// beside the same plugins exec'd directly through libcni, in one run, the
// variants alternating op by op so that load from elsewhere hits them
// alike. Only ADD is timed; each ADD is undone (untimed) before the next.
// They report medians (and p90) in milliseconds.
//
//	go test -run '^$' -bench Kurma -benchtime 30x ./test/kurma/

// ptpConf is a ptp network entry; dataDir keeps host-local's leases of a
// direct call off the host's /var/lib/cni (image networks keep them in
// their state directory).
func ptpConf(name, subnet, dataDir string) map[string]any {
	ipam := map[string]any{"type": "host-local", "subnet": subnet}
	if dataDir != "" {
		ipam["dataDir"] = dataDir
	}
	return map[string]any{"cniVersion": "1.0.0", "name": name, "type": "ptp", "ipam": ipam}
}

func withImage(n map[string]any, img string) map[string]any {
	out := map[string]any{"image": img}
	for k, v := range n {
		out[k] = v
	}
	return out
}

type benchEnv struct {
	d     *skeintest.Daemon
	node  *harness.NS
	pod   *harness.NS
	cni   *libcni.CNIConfig // finds skein and the reference plugins
	meta  *libcni.NetworkConfigList
	pods  rpc.PodsClient // in skeind's framed protocol (package rpcwire)
	grpc  rpc.PodsClient // over gRPC
	ptp   archive
	state string
}

func newBenchEnv(b *testing.B) *benchEnv {
	harness.RequireRoot(b)
	bin := skeintest.Binaries(b)
	e := &benchEnv{ptp: packCNI(b, bin, "ptp", "host-local"), state: b.TempDir()}
	img := "file://" + e.ptp.path
	e.node = harness.NewNS(b, "node")
	e.pod = harness.NewNS(b, "pod")
	e.d = startSkeind(b, e.node, []map[string]any{
		withImage(ptpConf("ka", "10.90.0.0/24", ""), img),
		withImage(ptpConf("kb", "10.90.1.0/24", ""), img),
		withImage(ptpConf("kc", "10.90.2.0/24", ""), img),
	})
	e.cni = e.d.CNI()
	e.meta = metaList(b, e.d)
	e.pods = pods(b, e.d)
	e.grpc = podsGRPC(b, e.d)
	return e
}

// inNode runs fn in the node namespace: a directly exec'd plugin works
// where it is started, and must plumb the node, never the host.
func (e *benchEnv) inNode(b *testing.B, fn func() error) {
	b.Helper()
	if err := e.node.Do(fn); err != nil {
		b.Fatal(err)
	}
}

// direct is a conflist of the plain ptp plugin.
func (e *benchEnv) direct(b *testing.B, name, subnet string) *libcni.NetworkConfigList {
	return skeintest.ConfList(b, name, "1.0.0", skeintest.Plugin(ptpConf(name, subnet, filepath.Join(e.state, "ipam"))))
}

// lat collects one variant's durations.
type lat map[string][]time.Duration

// settle is the pause before each timed op: a DEL's veth removal leaves
// kernel work behind it (the next op measured right after one was ~2 ms
// slower, whichever variant it was).
const settle = 100 * time.Millisecond

func (l lat) time(name string, fn func()) {
	time.Sleep(settle)
	start := time.Now()
	fn()
	l[name] = append(l[name], time.Since(start))
}

func (l lat) report(b *testing.B, order ...string) {
	for _, name := range order {
		d := slices.Clone(l[name])
		slices.Sort(d)
		if len(d) == 0 {
			continue
		}
		b.ReportMetric(ms(d[len(d)/2]), name+"-p50-ms")
		b.ReportMetric(ms(d[len(d)*9/10]), name+"-p90-ms")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// step is one variant of a benchmark: a timed op and its untimed undo.
type step struct {
	name string
	op   func(id string)
	undo func(id string)
}

// runSteps runs every step once for pod id, starting at step first and
// wrapping around (a benchmark rotates the start op by op: whichever op
// follows a DEL pays for the kernel work that DEL left behind).
func runSteps(t lat, first int, id string, steps []step) {
	for k := range steps {
		s := steps[(first+k)%len(steps)]
		t.time(s.name, func() { s.op(id) })
		s.undo(id)
	}
}

// BenchmarkKurmaAttach: a pod attached to one image-backed network (ptp)
// through the CNI meta mode (libcni → skein → skeind → sandbox → shim →
// ptp) and through skeind's Pods API (what skeinctl pod attach calls),
// against the same ptp exec'd directly by libcni.
func BenchmarkKurmaAttach(b *testing.B) {
	e := newBenchEnv(b)
	direct := e.direct(b, "da", "10.91.0.0/24")
	c := context.Background()
	must := func(what string, err error) {
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}
	steps := []step{
		{"image-cni",
			func(id string) {
				_, err := e.cni.AddNetworkList(c, e.meta, annotated(id, e.pod.Path(), "ka"))
				must("meta ADD", err)
			},
			func(id string) { must("meta DEL", e.cni.DelNetworkList(c, e.meta, annotated(id, e.pod.Path(), "ka"))) }},
		{"image-api",
			func(id string) {
				_, err := e.pods.Attach(c, &rpc.PodAttachRequest{Id: id, Netns: e.pod.Path(), Networks: []*rpc.PodNetwork{{Network: "ka", Ifname: "eth0"}}})
				must("pods attach", err)
			},
			func(id string) { _, err := e.pods.Detach(c, &rpc.PodRef{Id: id}); must("pods detach", err) }},
		{"image-api-grpc",
			func(id string) {
				_, err := e.grpc.Attach(c, &rpc.PodAttachRequest{Id: id, Netns: e.pod.Path(), Networks: []*rpc.PodNetwork{{Network: "ka", Ifname: "eth0"}}})
				must("pods attach over gRPC", err)
			},
			func(id string) { _, err := e.grpc.Detach(c, &rpc.PodRef{Id: id}); must("pods detach over gRPC", err) }},
		{"direct",
			func(id string) {
				_, err := e.cni.AddNetworkList(c, direct, skeintest.RT(id, e.pod.Path(), "eth0"))
				must("direct ADD", err)
			},
			func(id string) {
				must("direct DEL", e.cni.DelNetworkList(c, direct, skeintest.RT(id, e.pod.Path(), "eth0")))
			}},
	}
	e.inNode(b, func() error { runSteps(lat{}, 0, "warmup", steps); return nil })
	l := lat{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.inNode(b, func() error { runSteps(l, i, fmt.Sprintf("bench-%d", i), steps); return nil })
	}
	b.StopTimer()
	l.report(b, "image-cni", "image-api", "image-api-grpc", "direct")
	b.ReportMetric(ms(median(l["image-cni"])-median(l["direct"])), "cni-overhead-ms")
	b.ReportMetric(ms(median(l["image-api"])-median(l["direct"])), "api-overhead-ms")
	b.ReportMetric(ms(median(l["image-api-grpc"])-median(l["direct"])), "api-grpc-overhead-ms")
	b.ReportMetric(float64(mounts(b)), "mounts")
}

// mounts is the size of the mount table skeind (started by this process,
// in its mount namespace) sees: a sandboxed call's set-up used to grow
// with it (scripts/with-mounts.sh makes it larger).
func mounts(b *testing.B) int {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		b.Fatal(err)
	}
	return strings.Count(string(raw), "\n")
}

// BenchmarkKurmaAttachParallel: the variants of BenchmarkKurmaAttach with
// 8 pods attached at once (each in a namespace of its own), a round per
// variant and op, the variants rotating; every attach of a round is timed
// on its own. The figure is how each variant's p50 compares with direct
// ptp's under the same concurrency.
func BenchmarkKurmaAttachParallel(b *testing.B) {
	const conc = 8
	e := newBenchEnv(b)
	direct := e.direct(b, "da", "10.91.0.0/24")
	pods := make([]*harness.NS, conc)
	for k := range pods {
		pods[k] = harness.NewNS(b, "pod")
	}
	c := context.Background()
	must := func(what string, err error) {
		if err != nil {
			b.Errorf("%s: %v", what, err)
		}
	}
	type variant struct {
		name    string
		op, del func(id, netns string)
	}
	variants := []variant{
		{"image-cni",
			func(id, p string) {
				_, err := e.cni.AddNetworkList(c, e.meta, annotated(id, p, "ka"))
				must("meta ADD", err)
			},
			func(id, p string) { must("meta DEL", e.cni.DelNetworkList(c, e.meta, annotated(id, p, "ka"))) }},
		{"image-api",
			func(id, p string) {
				_, err := e.pods.Attach(c, &rpc.PodAttachRequest{Id: id, Netns: p, Networks: []*rpc.PodNetwork{{Network: "ka", Ifname: "eth0"}}})
				must("pods attach", err)
			},
			func(id, _ string) { _, err := e.pods.Detach(c, &rpc.PodRef{Id: id}); must("pods detach", err) }},
		{"image-api-grpc",
			func(id, p string) {
				_, err := e.grpc.Attach(c, &rpc.PodAttachRequest{Id: id, Netns: p, Networks: []*rpc.PodNetwork{{Network: "ka", Ifname: "eth0"}}})
				must("pods attach over gRPC", err)
			},
			func(id, _ string) {
				_, err := e.grpc.Detach(c, &rpc.PodRef{Id: id})
				must("pods detach over gRPC", err)
			}},
		{"direct",
			func(id, p string) {
				_, err := e.cni.AddNetworkList(c, direct, skeintest.RT(id, p, "eth0"))
				must("direct ADD", err)
			},
			func(id, p string) { must("direct DEL", e.cni.DelNetworkList(c, direct, skeintest.RT(id, p, "eth0"))) }},
	}
	var mu sync.Mutex
	// The machine's busy time (/proc/stat: every process and the kernel)
	// while a round's ADDs run, and over the whole round (its DELs and
	// what the ADDs left to do in the background, up to the next round):
	// with 8 at once on 2 cores the ADDs are short of CPU, and what each
	// way costs explains its time.
	cpuAdd, cpuAll := map[string]float64{}, map[string]float64{}
	round := func(l lat, v variant, tag string) {
		time.Sleep(settle)
		c0 := busyTicks(b)
		var wg sync.WaitGroup
		for k, p := range pods {
			wg.Go(func() {
				id := fmt.Sprintf("%s-%d", tag, k)
				// Each goroutine in the node namespace: a directly
				// exec'd plugin plumbs where it is started.
				e.node.Do(func() error {
					start := time.Now()
					v.op(id, p.Path())
					d := time.Since(start)
					mu.Lock()
					l[v.name] = append(l[v.name], d)
					mu.Unlock()
					return nil
				})
			})
		}
		wg.Wait()
		c1 := busyTicks(b)
		for k, p := range pods {
			e.node.Do(func() error { v.del(fmt.Sprintf("%s-%d", tag, k), p.Path()); return nil })
		}
		time.Sleep(settle)
		c2 := busyTicks(b)
		cpuAdd[v.name] += c1 - c0
		cpuAll[v.name] += c2 - c0
		if b.Failed() {
			b.FailNow()
		}
	}
	for _, v := range variants {
		round(lat{}, v, "warmup-"+v.name)
	}
	l := lat{}
	clear(cpuAdd)
	clear(cpuAll)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range variants {
			v := variants[(i+k)%len(variants)]
			round(l, v, fmt.Sprintf("par-%d-%s", i, v.name))
		}
	}
	b.StopTimer()
	l.report(b, "image-cni", "image-api", "image-api-grpc", "direct")
	b.ReportMetric(float64(median(l["image-api"]))/float64(median(l["direct"])), "api/direct")
	b.ReportMetric(float64(median(l["image-api-grpc"]))/float64(median(l["direct"])), "api-grpc/direct")
	b.ReportMetric(float64(median(l["image-cni"]))/float64(median(l["direct"])), "cni/direct")
	b.ReportMetric(float64(mounts(b)), "mounts")
	for _, v := range variants {
		b.ReportMetric(cpuAdd[v.name]*msPerTick/float64(b.N*conc), v.name+"-addcpu-ms")
		b.ReportMetric(cpuAll[v.name]*msPerTick/float64(b.N*conc), v.name+"-paircpu-ms")
	}
}

// msPerTick: /proc/stat counts in USER_HZ, 100 on every Linux ABI Go
// supports.
const msPerTick = 10

// busyTicks is the time all CPUs spent busy so far (/proc/stat's first
// line without idle, iowait, steal and the guest times user already
// holds), in ticks.
func busyTicks(b *testing.B) float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(raw), "\n", 2)[0])
	var t float64
	for i, x := range f[1:] {
		if i == 3 || i == 4 || i >= 7 { // idle, iowait; steal, guest, guest_nice
			continue
		}
		n, _ := strconv.ParseFloat(x, 64)
		t += n
	}
	return t
}

// BenchmarkKurma3Networks: a pod attached to three image-backed networks
// by one meta-mode ADD, against three separate libcni calls of ptp.
func BenchmarkKurma3Networks(b *testing.B) {
	e := newBenchEnv(b)
	directs := []*libcni.NetworkConfigList{e.direct(b, "da", "10.91.0.0/24"), e.direct(b, "db", "10.91.1.0/24"), e.direct(b, "dc", "10.91.2.0/24")}
	ifnames := []string{"eth0", "net1", "net2"}
	c := context.Background()
	steps := []step{
		{"image-3nets",
			func(id string) {
				if _, err := e.cni.AddNetworkList(c, e.meta, annotated(id, e.pod.Path(), "ka,kb@net1,kc@net2")); err != nil {
					b.Fatalf("meta ADD: %v", err)
				}
			},
			func(id string) {
				if err := e.cni.DelNetworkList(c, e.meta, annotated(id, e.pod.Path(), "ka,kb@net1,kc@net2")); err != nil {
					b.Fatalf("meta DEL: %v", err)
				}
			}},
		{"direct-3calls",
			func(id string) {
				for j, d := range directs {
					if _, err := e.cni.AddNetworkList(c, d, skeintest.RT(id, e.pod.Path(), ifnames[j])); err != nil {
						b.Fatalf("direct ADD %d: %v", j, err)
					}
				}
			},
			func(id string) {
				for j, d := range directs {
					if err := e.cni.DelNetworkList(c, d, skeintest.RT(id, e.pod.Path(), ifnames[j])); err != nil {
						b.Fatalf("direct DEL %d: %v", j, err)
					}
				}
			}},
	}
	e.inNode(b, func() error { runSteps(lat{}, 0, "warmup", steps); return nil })
	l := lat{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.inNode(b, func() error { runSteps(l, i, fmt.Sprintf("bench3-%d", i), steps); return nil })
	}
	b.StopTimer()
	l.report(b, "image-3nets", "direct-3calls")
}

// BenchmarkKurmaUnpack: fetching and unpacking the packed ptp+host-local
// image (a docker-save archive) into an empty cache.
func BenchmarkKurmaUnpack(b *testing.B) {
	harness.RequireRoot(b)
	a := packCNI(b, skeintest.Binaries(b), "ptp", "host-local")
	ref, err := image.Parse(image.Source{Image: "file://" + a.path})
	if err != nil {
		b.Fatal(err)
	}
	l := lat{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cache, err := image.Open(image.Options{Dir: filepath.Join(b.TempDir(), "images")})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		l.time("unpack", func() {
			_, release, err := cache.Acquire(context.Background(), ref)
			if err != nil {
				b.Fatal(err)
			}
			release()
		})
	}
	b.StopTimer()
	l.report(b, "unpack")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// BenchmarkKurmaCallParts splits an image network's add into its parts,
// without skeind: ptp exec'd directly in the node namespace (as libcni
// would, without libcni), the same through the shim of the unpacked image
// (shim start and its fork of ptp), and the shim run by the sandbox with
// warm inits (mount namespace, read-only root, node netns), as skeind's
// Manager calls it. What image-api adds beyond "sandboxed" is the
// Manager's part (records, planning) and the gRPC call.
func BenchmarkKurmaCallParts(b *testing.B) {
	harness.RequireRoot(b)
	a := packCNI(b, skeintest.Binaries(b), "ptp", "host-local")
	ref, err := image.Parse(image.Source{Image: "file://" + a.path})
	if err != nil {
		b.Fatal(err)
	}
	cache, err := image.Open(image.Options{Dir: filepath.Join(b.TempDir(), "images")})
	if err != nil {
		b.Fatal(err)
	}
	img, release, err := cache.Acquire(context.Background(), ref)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(release)
	node, pod := harness.NewNS(b, "node"), harness.NewNS(b, "pod")
	sb, err := sandbox.New(sandbox.Options{ScratchDir: b.TempDir(), NodeNetNS: node.Path()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sb.Close() })
	state := b.TempDir()
	// The sandbox mounts a size-limited tmpfs over a network's state
	// directory at its first call: unmount it before the directory goes.
	b.Cleanup(func() { _ = sb.ReleaseState(state) })
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"p","type":"ptp","ipam":{"type":"host-local","subnet":"10.90.0.0/24","dataDir":%q}}`, state+"/ipam")
	exe := func(path string, env []string, args ...string) {
		err := node.Do(func() error {
			cmd := exec.Command(path, args...)
			cmd.Env = env
			cmd.Stdin = strings.NewReader(conf)
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %w: %s", path, err, out)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	cniEnv := func(op string) []string {
		return []string{"CNI_COMMAND=" + op, "CNI_CONTAINERID=parts", "CNI_NETNS=" + pod.Path(), "CNI_IFNAME=eth0", "CNI_PATH=" + skeintest.RefPluginDir}
	}
	shimEnv := append(slices.Clone(img.Env), "SKEIN_NETPLUGIN_STATE="+state)
	plugin := sandbox.Plugin{Rootfs: img.Root, Config: []byte(conf), StateDir: state, Env: img.Env} // as the Manager calls it
	sbRun := func(op sandbox.Op) {
		if _, err := sb.Run(context.Background(), plugin.Call(op, pod.Path(), "parts", "eth0")); err != nil {
			b.Fatal(err)
		}
	}
	ptp := filepath.Join(skeintest.RefPluginDir, "ptp")
	l := lat{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.time("direct", func() { exe(ptp, cniEnv("ADD")) })
		exe(ptp, cniEnv("DEL"))
		l.time("shim", func() { exe(filepath.Join(img.Root, "opt/network/add"), shimEnv, pod.Path(), "parts", "eth0") })
		exe(filepath.Join(img.Root, "opt/network/del"), shimEnv, pod.Path(), "parts", "eth0")
		l.time("sandboxed", func() { sbRun(sandbox.OpAdd) })
		sbRun(sandbox.OpDel)
	}
	b.StopTimer()
	l.report(b, "direct", "shim", "sandboxed")
}

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// preloads are the node sizes ADD is measured at ($SKEIN_BENCH_PRELOADS
// overrides, comma-separated).
func preloads() []int {
	if s := os.Getenv("SKEIN_BENCH_PRELOADS"); s != "" {
		var out []int
		for _, f := range splitComma(s) {
			n, err := strconv.Atoi(f)
			if err == nil {
				out = append(out, n)
			}
		}
		return out
	}
	return []int{10, 5000}
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// report adds p50/p90/p99 of the per-operation latencies to the benchmark.
func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		i := int(p * float64(len(lat)-1))
		return float64(lat[i].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.90), "p90-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

// preload puts n attachments on the node through skeind's CNI service
// directly (no plugin exec, to keep set-up short), 100 interfaces per pod
// namespace.
func preload(b *testing.B, d *skeintest.Daemon, n int) {
	b.Helper()
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := rpc.NewCNIClient(conn)
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "preload", "type": "skein"})
	var pods []*harness.NS
	for i := 0; i < (n+99)/100; i++ {
		pods = append(pods, harness.NewNS(b, "pre"))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 2 {
				rep, err := c.Add(context.Background(), &rpc.CNIRequest{
					ContainerId: fmt.Sprintf("pre%d", i/100), Netns: pods[i/100].Path(),
					Ifname: fmt.Sprintf("e%d", i%100), Netconf: conf,
				})
				if err == nil && rep.Error != nil {
					err = fmt.Errorf("%s", rep.Error.Msg)
				}
				if err != nil {
					errs <- fmt.Errorf("preload %d: %w", i, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkADD measures one attachment as a runtime sees it — libcni
// executing the skein binary, which calls skeind — against the raw-netlink
// floor of the same plumbing, with 10 and 5,000 attachments already on the
// node. Each operation gets a fresh pod namespace (made outside the timer).
//
//	go test -run '^$' -bench ADD -benchtime 200x ./bench/
func BenchmarkADD(b *testing.B) {
	harness.RequireRoot(b)
	for _, n := range preloads() {
		b.Run(fmt.Sprintf("attachments=%d", n), func(b *testing.B) {
			d := skeintest.StartDaemon(b, skeintest.Options{DefaultPool: []string{"10.64.0.0/14", "fd00:64::/108"}})
			preload(b, d, n)
			b.Run("floor", func(b *testing.B) { benchFloor(b, d.Node) })
			b.Run("skein", func(b *testing.B) { benchSkein(b, d) })
		})
	}
}

func pods(b *testing.B, n int) []*harness.NS {
	out := make([]*harness.NS, n)
	for i := range out {
		out[i] = harness.NewNS(b, "bp")
	}
	return out
}

func benchFloor(b *testing.B, node *harness.NS) {
	b.StopTimer()
	f, closeF, err := NewFloor(node.Path())
	if err != nil {
		b.Fatal(err)
	}
	defer closeF()
	ps := pods(b, b.N)
	lat := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		// 10.68/14 and fd00:68:: are outside the pool skeind serves.
		addrs := []netip.Addr{netip.AddrFrom4([4]byte{10, 68, byte(i >> 8), byte(i)}), netip.MustParseAddr(fmt.Sprintf("fd00:68::%x", i+1))}
		b.StartTimer()
		t := time.Now()
		err := f.Setup(fmt.Sprintf("fl%d", i), ps[i].Path(), "eth0", addrs)
		lat = append(lat, time.Since(t))
		b.StopTimer()
		if err != nil {
			b.Fatalf("floor setup: %v", err)
		}
	}
	report(b, lat)
}

func benchSkein(b *testing.B, d *skeintest.Daemon) {
	b.StopTimer()
	list := skeintest.ConfList(b, "bench", "1.1.0", d.SkeinPlugin(nil))
	cni := d.CNI()
	ps := pods(b, b.N)
	lat := make([]time.Duration, 0, b.N)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("b%d-%d", b.N, i), NetNS: ps[i].Path(), IfName: "eth0"}
		b.StartTimer()
		t := time.Now()
		_, err := cni.AddNetworkList(ctx, list, rt)
		lat = append(lat, time.Since(t))
		b.StopTimer()
		if err != nil {
			b.Fatalf("ADD: %v", err)
		}
	}
	report(b, lat)
}

// Package kubescale is the Kubernetes-mode scale benchmark, and a small
// test of the same run: a real etcd and kube-apiserver (test/kube) with
// deploy/kubernetes's namespace, skeind RBAC, per-node identity policies
// and API priority level; the real skein-controller binary; and many
// simulated nodes, each running skeind's own block-claim code (an
// ipam.Manager and its Run loop over a kubestore.Store) as skeind's
// ServiceAccount with a token bound to a Pod on its node.
//
//	go test -run '^$' -bench KubeScale -benchtime 1x -timeout 60m ./test/kubescale/ \
//	    -args -nodes 1000 -pods 100000 -out bench/out/kube-scale
//
// Every node starts at the same instant (each claims its first block,
// as skeind does before serving), then brings its share of the pods'
// addresses into use as fast as it can: with 100 pods a node and blocks
// of 32, every node claims four blocks, all nodes together, four rounds.
// Each claim is one create of an AddressBlock; the benchmark times each
// (ClaimP50ms, ClaimP99ms), counts the creates refused because another
// node had the index (Collisions, WritesPerClaim), the requests the API
// server refused (Rejected429), checks at the end that no address is on
// two nodes, and compares a pod ADD with a spare block present against
// the embedded store's (bbolt) ADD.
//
// The simulated nodes share one informer cache (kubestore.Options.Cache):
// a thousand caches decoding every block event would measure this
// process on two cores rather than the API server. For the same reason
// the shared cache hands out objects without copying them (-cache-copies
// to copy) and each node's Store gets the events of its own blocks
// (dispatch_test.go; -fanout for every handler on every event). With
// -watch the API server also serves a watch of blocks and one of pools to
// every node, as to real skeinds.
//
// TestClaimBurst runs the same at a small size in `make test` and fails on
// a duplicate address, a failed claim, a 429 or a collision rate above a
// bound.
package kubescale

import (
	"encoding/json"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
)

var (
	flagNodes   = flag.Int("nodes", 100, "simulated nodes")
	flagPods    = flag.Int("pods", 10000, "pod addresses brought into use, spread evenly over the nodes")
	flagRate    = flag.Float64("rate", 0, "pod ADDs per second over the cluster; 0 = each node as fast as it can")
	flagQPS     = flag.Int("controller-qps", 100, "skein-controller --kube-api-qps (its --kube-api-burst is twice this)")
	flagBits    = flag.Int("block-bits", 5, "AddressPool blockSizeBits (5 = blocks of 32 addresses)")
	flagFlow    = flag.Bool("flowschema", true, "apply deploy/kubernetes/skeind-flowcontrol.yaml (skeind's API priority level)")
	flagWebhook = flag.Bool("webhook", true, "skein-controller serves its validating webhooks (the AddressBlock one is called on every claim)")
	flagLeases  = flag.Bool("leases", true, "nodes renew their liveness Lease (every 10 s, as skeind)")
	flagWatch   = flag.Bool("watch", false, "each node also keeps a watch of AddressBlocks and one of AddressPools open, as a real skeind does (the API server sends every event to every node)")
	flagCopies  = flag.Bool("cache-copies", false, "the nodes' shared cache deep-copies what it hands out, as skeind's own does (costs this process, not the API server)")
	flagFanout  = flag.Bool("fanout", false, "every block event runs every node's handlers in this process (off: each node's Store gets the events of its own blocks, the only ones its handler acts on)")
	flagTimeout = flag.Duration("claim-timeout", 0, "bound of one claim (kubestore's GrantTimeout); 0 = skeind's default")
	flagSteady  = flag.Int("steady", 16, "pod ADDs per node after the burst, with a spare block present, each paired with an ADD through the embedded store")
	flagProfile = flag.Duration("apiserver-profile", 0, "take a CPU profile of kube-apiserver for this long from the start (into -out)")
	flagOut     = flag.String("out", "", "directory for results.json, report.md and claim_latency.png (empty: only logged)")
)

func init() { ctrl.SetLogger(logr.Discard()) }

func BenchmarkKubeScale(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement: use -benchtime 1x")
	}
	p := params{nodes: *flagNodes, pods: *flagPods, bits: *flagBits, rate: *flagRate, controllerQPS: *flagQPS,
		flowSchema: *flagFlow, webhook: *flagWebhook, leases: *flagLeases, watch: *flagWatch, cacheCopies: *flagCopies, fanout: *flagFanout, claimTimeout: *flagTimeout,
		steady: *flagSteady, profile: *flagProfile, out: *flagOut}
	r := run(b, p)
	r.Command = command()

	for _, m := range []struct {
		v    float64
		unit string
	}{
		{r.ClaimP50ms, "claim-p50-ms"}, {r.ClaimP99ms, "claim-p99-ms"}, {r.WritesPerClaim, "writes/claim"},
		{float64(r.Rejected429), "rejected-429"}, {r.AddSpareP99ms, "add-spare-p99-ms"}, {r.AddBoltP99ms, "add-bolt-p99-ms"},
		{r.ControllerRSSMiB, "controller-MiB"}, {r.APIServerRSSMiB, "apiserver-MiB"},
	} {
		b.ReportMetric(m.v, m.unit)
	}
	js, _ := json.MarshalIndent(r, "", "  ")
	b.Logf("results:\n%s", js)
	for _, pr := range r.problems {
		b.Error(pr)
	}
	if p.out != "" {
		if err := write(p.out, r); err != nil {
			b.Fatal(err)
		}
	}
}

func command() string {
	return fmt.Sprintf("go test -run '^$' -bench KubeScale -benchtime 1x ./test/kubescale/ -args -nodes %d -pods %d -controller-qps %d -block-bits %d -rate %g -flowschema=%t -webhook=%t -leases=%t -watch=%t -cache-copies=%t -fanout=%t -steady %d",
		*flagNodes, *flagPods, *flagQPS, *flagBits, *flagRate, *flagFlow, *flagWebhook, *flagLeases, *flagWatch, *flagCopies, *flagFanout, *flagSteady)
}

// ms is d in milliseconds, for results.
func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

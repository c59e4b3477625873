package kubestore_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
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
)

func init() { ctrl.SetLogger(logr.Discard()) }

// node is one simulated skeind: its store (API + a bolt file) and the
// ipam manager over it, as skeind wires them, with the Manager's Run
// (spares, releases, following pools) going until the test ends.
type node struct {
	name string
	st   *kubestore.Store
	ipam *ipam.Manager
	lost chan uint32 // blocks reported lost
}

// nodeOpts tune startNode; the zero value is skeind's defaults but for a
// one-hour MinBlockAge (no block goes back unless a test says so) and no
// Run (tests call Tend) unless run is set.
type nodeOpts struct {
	timeout     time.Duration
	minBlockAge time.Duration
	run         bool
	cache       cache.Cache
	lease       time.Duration // 0: the default
}

func startNode(t *testing.T, env *kube.Env, name, dir string, o nodeOpts) *node {
	t.Helper()
	local, err := store.OpenBolt(filepath.Join(dir, "skein.db"), store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := kubestore.New(context.Background(), kubestore.Options{Config: env.Config, Node: name, Local: local,
		GrantTimeout: o.timeout, Cache: o.cache, LeaseDuration: o.lease})
	if err != nil {
		local.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if o.minBlockAge == 0 {
		o.minBlockAge = time.Hour
	}
	n := &node{name: name, st: st, lost: make(chan uint32, 16)}
	n.ipam, err = ipam.NewManager(ipam.Options{Store: st, Node: name, Cluster: ipam.ClusterOptions{
		MinBlockAge: o.minBlockAge, Resync: 100 * time.Millisecond,
		OnBlockLost: func(_ string, i uint32, _ int) { n.lost <- i },
	}})
	if err != nil {
		t.Fatal(err)
	}
	if o.run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { n.ipam.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	return n
}

func createPool(t *testing.T, c client.Client, name, v4 string, bits int32) {
	t.Helper()
	p := &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(v4)}}, BlockSizeBits: bits},
	}
	if err := c.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// apiBlocks lists the AddressBlocks of pool labelled with node, straight
// from the API server.
func apiBlocks(t *testing.T, c client.Client, pool, node string) map[string]skeinv1.AddressBlock {
	t.Helper()
	var l skeinv1.AddressBlockList
	if err := c.List(context.Background(), &l, client.MatchingLabels{skeinv1.LabelPool: pool, skeinv1.LabelNode: node}); err != nil {
		t.Fatal(err)
	}
	out := map[string]skeinv1.AddressBlock{}
	for _, b := range l.Items {
		out[b.Name] = b
	}
	return out
}

// eventually retries f until it returns nil or 10 s pass.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func alloc(t *testing.T, n *node, pool string) netip.Addr {
	t.Helper()
	a, err := n.ipam.Allocate(context.Background(), ipam.Request{Pool: pool})
	if err != nil {
		t.Fatalf("node %s: allocate from %s: %v", n.name, pool, err)
	}
	if len(a) != 1 {
		t.Fatalf("node %s: got %v, want one address", n.name, a)
	}
	return a[0]
}

func poolOfAddr(a netip.Addr) string {
	if netip.MustParsePrefix("10.81.0.0/24").Contains(a) {
		return "blue"
	}
	return "default"
}

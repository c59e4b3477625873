package kubestore_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/kube"
)

// startSharedCache starts one cache of every node's blocks, as the scale
// benchmark gives its simulated nodes.
func startSharedCache(t *testing.T, env *kube.Env) cache.Cache {
	t.Helper()
	c, err := cache.New(env.Config, cache.Options{Scheme: kubestore.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, obj := range []client.Object{&skeinv1.AddressPool{}, &skeinv1.AddressBlock{}, &corev1.Namespace{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	go c.Start(ctx) //nolint:errcheck // ends with ctx
	syncCtx, done := context.WithTimeout(ctx, 30*time.Second)
	defer done()
	if !c.WaitForCacheSync(syncCtx) {
		t.Fatal("shared cache did not sync")
	}
	return c
}

// TestSharedCache: Stores given one Cache each see only their own node's
// blocks, get blocks granted through it, and closing one leaves the cache
// to the others.
func TestSharedCache(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	createPool(t, c, "default", "10.80.0.0/24", 3)
	shared := startSharedCache(t, env)

	nodes := map[string]*node{}
	for _, name := range []string{"a", "b"} {
		local, err := store.OpenBolt(filepath.Join(t.TempDir(), "skein.db"), store.BoltOptions{AttachmentsOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		// No Lease (this API server has no skein-system namespace): a
		// node whose Lease cannot be renewed hands out nothing.
		st, err := kubestore.New(context.Background(), kubestore.Options{Config: env.Config, Node: name, Local: local,
			GrantTimeout: 10 * time.Second, Cache: shared, LeaseDuration: -1})
		if err != nil {
			t.Fatal(err)
		}
		m, err := ipam.NewManager(ipam.Options{Store: st, Node: name})
		if err != nil {
			t.Fatal(err)
		}
		nodes[name] = &node{name: name, st: st, ipam: m}
	}
	// Two blocks (8 addresses each) for a, one for b.
	got := map[string][]netip.Addr{}
	for range 9 {
		got["a"] = append(got["a"], alloc(t, nodes["a"], "default"))
	}
	got["b"] = append(got["b"], alloc(t, nodes["b"], "default"))

	for name, want := range map[string]int{"a": 2, "b": 1} {
		all, err := nodes[name].st.ListBlocks(context.Background(), "default")
		if err != nil {
			t.Fatal(err)
		}
		var blocks []store.Block
		for _, b := range all {
			if b.Node == name {
				blocks = append(blocks, b)
			}
		}
		if len(blocks) != want {
			t.Errorf("node %s lists %d blocks of its own, want %d: %v", name, len(blocks), want, blocks)
		}
		if api := apiBlocks(t, c, "default", name); len(api) != want {
			t.Errorf("node %s has %d AddressBlocks in the API, want %d", name, len(api), want)
		}
	}
	// Every address granted is distinct across nodes.
	seen := map[netip.Addr]string{}
	for name, as := range got {
		for _, a := range as {
			if other, dup := seen[a]; dup {
				t.Errorf("%v given to %s and %s", a, other, name)
			}
			seen[a] = name
		}
	}

	// Closing a leaves the shared cache running: b still gets a block.
	if err := nodes["a"].st.Close(); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		alloc(t, nodes["b"], "default")
	}
	if api := apiBlocks(t, c, "default", "b"); len(api) != 2 {
		t.Errorf("after a closed, node b has %d AddressBlocks, want 2", len(api))
	}
	nodes["b"].st.Close()
}

package kubestore_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/controller"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/kube"
)

func init() { ctrl.SetLogger(logr.Discard()) }

// startController runs the real BlockRequest reconciler in a
// controller-runtime manager; the returned function stops it (and the
// test's end does, if it was not stopped before).
func startController(t *testing.T, env *kube.Env) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 kube.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &controller.BlockRequestReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// node is one simulated skeind: its store (API + a bolt file) and the
// ipam manager over it, as skeind wires them.
type node struct {
	name string
	st   *kubestore.Store
	ipam *ipam.Manager
}

func startNode(t *testing.T, env *kube.Env, name, dir string, timeout time.Duration) *node {
	t.Helper()
	local, err := store.OpenBolt(filepath.Join(dir, "skein.db"), store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := kubestore.New(context.Background(), kubestore.Options{Config: env.Config, Node: name, Local: local, GrantTimeout: timeout})
	if err != nil {
		local.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := ipam.NewManager(ipam.Options{Store: st, Node: name})
	if err != nil {
		t.Fatal(err)
	}
	return &node{name: name, st: st, ipam: m}
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

func requestsLeft(t *testing.T, c client.Client) []skeinv1.BlockRequest {
	t.Helper()
	var l skeinv1.BlockRequestList
	if err := c.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	return l.Items
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

func TestKubeStore(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stopController := startController(t, env)
	// Blocks of 8 addresses, 32 of them.
	createPool(t, c, "default", "10.80.0.0/24", 3)
	createPool(t, c, "blue", "10.81.0.0/24", 3)

	a := startNode(t, env, "node-a", t.TempDir(), 0)
	b := startNode(t, env, "node-b", t.TempDir(), 0)

	t.Run("nodes get distinct blocks through BlockRequests", func(t *testing.T) {
		addrA, addrB := alloc(t, a, "default"), alloc(t, b, "default")
		ba, bb := apiBlocks(t, c, "default", "node-a"), apiBlocks(t, c, "default", "node-b")
		if len(ba) != 1 || len(bb) != 1 {
			t.Fatalf("blocks of node-a %v, node-b %v: want one each", ba, bb)
		}
		for _, x := range []struct {
			addr   netip.Addr
			blocks map[string]skeinv1.AddressBlock
		}{{addrA, ba}, {addrB, bb}} {
			for _, blk := range x.blocks {
				if !netip.MustParsePrefix(*blk.IPv4).Contains(x.addr) {
					t.Errorf("address %v is not in its node's block %s (%s)", x.addr, blk.Name, *blk.IPv4)
				}
			}
		}
		for name := range ba {
			if _, dup := bb[name]; dup {
				t.Errorf("block %s given to both nodes", name)
			}
		}
		if left := requestsLeft(t, c); len(left) != 0 {
			t.Errorf("%d BlockRequests left behind: %v", len(left), left[0].Name)
		}
	})

	t.Run("no API request while the block has room", func(t *testing.T) {
		u, err := a.ipam.Usage(ctx, "default")
		if err != nil || u.Free == 0 || u.Blocks != 1 {
			t.Fatalf("node-a's usage %+v, %v: want one block with room", u, err)
		}
		reads, writes := a.st.APIRequests()
		seen := map[netip.Addr]bool{}
		for range u.Free { // the rest of node-a's block
			addr := alloc(t, a, "default")
			if seen[addr] {
				t.Fatalf("%v handed out twice", addr)
			}
			seen[addr] = true
		}
		r2, w2 := a.st.APIRequests()
		if w2 != writes || r2 != reads {
			t.Errorf("%d allocations in an owned block made %d writes and %d reads to the API, want 0", u.Free, w2-writes, r2-reads)
		}
		if n := len(apiBlocks(t, c, "default", "node-a")); n != 1 {
			t.Errorf("node-a has %d blocks, want still 1", n)
		}
		// The next needs a second block: one request, answered.
		alloc(t, a, "default")
		if _, w3 := a.st.APIRequests(); w3 == w2 {
			t.Error("a new block was taken with no API write")
		}
		if n := len(apiBlocks(t, c, "default", "node-a")); n != 2 {
			t.Errorf("node-a has %d blocks, want 2", n)
		}
	})

	t.Run("freeing the last address frees the block", func(t *testing.T) {
		d := startNode(t, env, "node-d", t.TempDir(), 0)
		x, y := alloc(t, d, "blue"), alloc(t, d, "blue")
		blocks := apiBlocks(t, c, "blue", "node-d")
		if len(blocks) != 1 {
			t.Fatalf("node-d has blocks %v, want one", blocks)
		}
		d.ipam.Release(ctx, "blue", []netip.Addr{x})
		if len(apiBlocks(t, c, "blue", "node-d")) != 1 {
			t.Fatal("block freed while an address of it is still held")
		}
		d.ipam.Release(ctx, "blue", []netip.Addr{y})
		if got := apiBlocks(t, c, "blue", "node-d"); len(got) != 0 {
			t.Fatalf("blocks %v still exist after their last address was released", got)
		}
		if u, _ := d.ipam.Usage(ctx, "blue"); u.Blocks != 0 {
			t.Errorf("node-d still counts %d blocks of blue", u.Blocks)
		}
		// And the next allocation gets a block again.
		alloc(t, d, "blue")
	})

	t.Run("restart frees unused blocks and keeps used ones", func(t *testing.T) {
		dir := t.TempDir()
		e := startNode(t, env, "node-e", dir, 0)
		var first []netip.Addr
		for range 8 {
			first = append(first, alloc(t, e, "blue"))
		}
		kept := alloc(t, e, "blue") // second block
		if n := len(apiBlocks(t, c, "blue", "node-e")); n != 2 {
			t.Fatalf("node-e has %d blocks, want 2", n)
		}
		// A new skeind on the same node: only kept is still attached (the
		// others' records were lost in the crash, say).
		e.st.Close()
		e2 := startNode(t, env, "node-e", dir, 0)
		if err := e2.ipam.LoadAll(ctx); err != nil {
			t.Fatal(err)
		}
		if err := e2.ipam.Restore(ctx, "blue", []netip.Addr{kept}); err != nil {
			t.Fatalf("restore %v: %v", kept, err)
		}
		freed, err := e2.ipam.FreeUnusedBlocks(ctx)
		if err != nil || freed != 1 {
			t.Fatalf("FreeUnusedBlocks = %d, %v; want 1 freed", freed, err)
		}
		left := apiBlocks(t, c, "blue", "node-e")
		if len(left) != 1 {
			t.Fatalf("node-e has blocks %v after restart, want one", left)
		}
		for _, blk := range left {
			if !netip.MustParsePrefix(*blk.IPv4).Contains(kept) {
				t.Errorf("kept block %s (%s) does not hold the attached %v", blk.Name, *blk.IPv4, kept)
			}
			if netip.MustParsePrefix(*blk.IPv4).Contains(first[0]) {
				t.Errorf("the unused block %s was kept", blk.Name)
			}
		}
	})

	t.Run("the namespace annotation names the pool", func(t *testing.T) {
		// plain first: once team-blue is in the cache, so is plain (a
		// watch delivers events in order).
		for _, ns := range []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "team-blue", Annotations: map[string]string{skeinv1.AnnotationPool: "blue"}}},
		} {
			if err := c.Create(ctx, ns); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, "namespace team-blue's pool", func() error {
			if p, ok := a.st.PoolForNamespace(ctx, "team-blue"); !ok || p != "blue" {
				return errors.New("annotation not seen yet")
			}
			return nil
		})
		if p, ok := a.st.PoolForNamespace(ctx, "plain"); ok {
			t.Errorf("namespace plain has no annotation, yet its pool is %q", p)
		}
		if p, ok := a.st.PoolForNamespace(ctx, "missing"); ok {
			t.Errorf("a missing namespace's pool is %q", p)
		}
	})

	t.Run("pools are read-only", func(t *testing.T) {
		if _, err := a.ipam.CreatePool(ctx, store.Pool{Name: "x", Subnets: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")}}); !errors.Is(err, kubestore.ErrReadOnly) {
			t.Errorf("CreatePool: %v, want ErrReadOnly", err)
		}
		if err := a.ipam.DeletePool(ctx, "blue"); !errors.Is(err, kubestore.ErrReadOnly) {
			t.Errorf("DeletePool: %v, want ErrReadOnly", err)
		}
		if _, err := a.ipam.Allocate(ctx, ipam.Request{Pool: "nope"}); !errors.Is(err, ipam.ErrPoolNotFound) {
			t.Errorf("allocate from a missing pool: %v, want ErrPoolNotFound", err)
		}
	})

	t.Run("static addresses only in blocks the node holds", func(t *testing.T) {
		n := startNode(t, env, "node-s", t.TempDir(), 0)
		x := alloc(t, n, "blue")
		got, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "blue", Static: []netip.Addr{x.Next()}})
		if err != nil || len(got) != 1 || got[0] != x.Next() {
			t.Fatalf("static %v in node-s's own block: %v, %v", x.Next(), got, err)
		}
		// An address of node-b's block, and one of a block nobody holds.
		bAddr := alloc(t, b, "default")
		for _, a := range []netip.Addr{bAddr, netip.MustParseAddr("10.81.0.250")} {
			if _, err := n.ipam.Allocate(ctx, ipam.Request{Pool: poolOfAddr(a), Static: []netip.Addr{a}}); !errors.Is(err, ipam.ErrInUse) {
				t.Errorf("static %v in a block node-s does not hold: %v, want ErrInUse", a, err)
			}
		}
		// Freed, the block is not taken back from a stale cache.
		n.ipam.Release(ctx, "blue", []netip.Addr{x, x.Next()})
		if _, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "blue", Static: []netip.Addr{x}}); !errors.Is(err, ipam.ErrInUse) {
			t.Errorf("static %v in the block just freed: %v, want ErrInUse", x, err)
		}
		if left := apiBlocks(t, c, "blue", "node-s"); len(left) != 0 {
			t.Errorf("node-s still has blocks %v", left)
		}
	})

	t.Run("concurrent allocations on two nodes", func(t *testing.T) {
		createPool(t, c, "busy", "10.83.0.0/24", 3)
		nodes := []*node{startNode(t, env, "node-p", t.TempDir(), 0), startNode(t, env, "node-q", t.TempDir(), 0)}
		type result struct {
			node string
			addr netip.Addr
			err  error
		}
		results := make(chan result, 80)
		for i := range 80 {
			n := nodes[i%2]
			go func() {
				a, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "busy"})
				r := result{node: n.name, err: err}
				if err == nil {
					r.addr = a[0]
				}
				results <- r
			}()
		}
		owner := map[netip.Addr]string{}
		for range 80 {
			r := <-results
			if r.err != nil {
				t.Fatalf("%s: %v", r.node, r.err)
			}
			if prev, dup := owner[r.addr]; dup {
				t.Fatalf("%v handed out twice (%s and %s)", r.addr, prev, r.node)
			}
			owner[r.addr] = r.node
		}
		for _, n := range nodes {
			blocks := apiBlocks(t, c, "busy", n.name)
			for addr, who := range owner {
				if who != n.name {
					continue
				}
				in := false
				for _, blk := range blocks {
					in = in || netip.MustParsePrefix(*blk.IPv4).Contains(addr)
				}
				if !in {
					t.Errorf("%v of %s is in none of its blocks", addr, n.name)
				}
			}
		}
		if left := requestsLeft(t, c); len(left) != 0 {
			t.Errorf("%d BlockRequests left behind", len(left))
		}
	})

	t.Run("the Docker front door uses pools by name", func(t *testing.T) {
		dockerIPAM(t, startNode(t, env, "node-docker", t.TempDir(), 0))
	})

	t.Run("subnets appended to a pool in use", func(t *testing.T) {
		createPool(t, c, "grow", "10.82.0.0/29", 3) // one block
		g := startNode(t, env, "node-g", t.TempDir(), 0)
		alloc(t, g, "grow")
		u, _ := g.ipam.Usage(ctx, "grow")
		for range u.Free { // fill the pool's only block
			alloc(t, g, "grow")
		}
		p := &skeinv1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "grow"}, p); err != nil {
			t.Fatal(err)
		}
		p.Spec.Subnets = append(p.Spec.Subnets, skeinv1.SubnetSet{IPv4: ptr.To("10.82.1.0/29")})
		if err := c.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the appended subnet in node-g's cache", func() error {
			sp, err := g.st.GetPool(ctx, "grow")
			if err != nil || len(sp.Subnets) != 2 {
				return errors.New("not yet")
			}
			return nil
		})
		if got := alloc(t, g, "grow"); !netip.MustParsePrefix("10.82.1.0/29").Contains(got) {
			t.Errorf("after the pool grew, allocated %v, want an address of the appended subnet", got)
		}
	})

	t.Run("no controller: try again, nothing left behind", func(t *testing.T) {
		stopController()
		// node-f is a Node object: its requests are owned by it (so the
		// garbage collector removes them with the node).
		nodeObj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-f"}}
		if err := c.Create(ctx, nodeObj); err != nil {
			t.Fatal(err)
		}
		f := startNode(t, env, "node-f", t.TempDir(), 2*time.Second)
		start := time.Now()
		errc := make(chan error, 1)
		go func() {
			_, err := f.ipam.Allocate(ctx, ipam.Request{Pool: "default"})
			errc <- err
		}()
		eventually(t, "node-f's pending BlockRequest", func() error {
			left := requestsLeft(t, c)
			if len(left) != 1 {
				return errors.New("no request yet")
			}
			br := left[0]
			if br.Spec.NodeName != "node-f" || br.Spec.PoolName != "default" {
				t.Errorf("request spec %+v, want node-f and pool default", br.Spec)
			}
			if o := br.OwnerReferences; len(o) != 1 || o[0].Kind != "Node" || o[0].UID != nodeObj.UID {
				t.Errorf("request owners %+v, want the Node node-f (uid %s)", o, nodeObj.UID)
			}
			return nil
		})
		err := <-errc
		if !errors.Is(err, ipam.ErrTryAgain) {
			t.Fatalf("allocate with no controller: %v, want ErrTryAgain", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("gave up after %v, want about the 1 s grant timeout", took)
		}
		if left := requestsLeft(t, c); len(left) != 0 {
			t.Errorf("BlockRequest %s left behind", left[0].Name)
		}
		if got := apiBlocks(t, c, "default", "node-f"); len(got) != 0 {
			t.Errorf("blocks %v left behind", got)
		}
		if u, _ := f.ipam.Usage(ctx, "default"); u.Blocks != 0 || u.Used != 0 {
			t.Errorf("usage after the failure: %+v, want nothing held", u)
		}
	})
}

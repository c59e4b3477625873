package kubestore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/test/kube"
)

// startEnv starts the API server with skein's namespace (for the nodes'
// Leases) and returns an admin client.
func startEnv(t *testing.T) (*kube.Env, client.Client) {
	t.Helper()
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubestore.DefaultLeaseNamespace}}); err != nil {
		t.Fatal(err)
	}
	return env, c
}

// allBlocks lists every AddressBlock of pool from the API server.
func allBlocks(t *testing.T, c client.Client, pool string) []skeinv1.AddressBlock {
	t.Helper()
	var l skeinv1.AddressBlockList
	if err := c.List(context.Background(), &l, client.MatchingLabels{skeinv1.LabelPool: pool}); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// blockOfAddr returns the API's block of pool that contains a, if any.
func blockOfAddr(t *testing.T, c client.Client, pool string, a netip.Addr) (skeinv1.AddressBlock, bool) {
	t.Helper()
	for _, b := range allBlocks(t, c, pool) {
		if b.IPv4 != nil && netip.MustParsePrefix(*b.IPv4).Contains(a) {
			return b, true
		}
	}
	return skeinv1.AddressBlock{}, false
}

// checkOneOwner checks the invariant block claims exist for, against the
// API's blocks of pool: no block index is believed owned by two nodes
// (by their Store's Owns, or by the block's prefix in their Manager's
// OwnedBlocks, what skeind exports as routes), and no address in handed
// (node name → addresses it handed out) is on two nodes.
func checkOneOwner(t *testing.T, c client.Client, pool string, nodes []*node, handed map[string][]netip.Addr) {
	t.Helper()
	for _, blk := range allBlocks(t, c, pool) {
		var believers []string
		for _, n := range nodes {
			exports := blk.IPv4 != nil && slices.Contains(n.ipam.OwnedBlocks(), netip.MustParsePrefix(*blk.IPv4))
			if n.st.Owns(pool, uint32(blk.Index), n.name) || exports {
				believers = append(believers, n.name)
			}
		}
		if len(believers) > 1 {
			t.Errorf("block %s (index %d, nodeName %q in the API) is believed owned by %d nodes: %v", blk.Name, blk.Index, blk.NodeName, len(believers), believers)
		}
		if len(believers) == 1 && believers[0] != blk.NodeName {
			t.Errorf("block %s is node %q's in the API but node %s believes it owns it", blk.Name, blk.NodeName, believers[0])
		}
	}
	on := map[netip.Addr]string{}
	for name, addrs := range handed {
		for _, a := range addrs {
			if other, dup := on[a]; dup {
				t.Errorf("%v handed out by %s and by %s", a, other, name)
			}
			on[a] = name
		}
	}
}

func tend(t *testing.T, n *node) {
	t.Helper()
	if _, err := n.ipam.FreeUnusedBlocks(context.Background()); err != nil {
		t.Fatalf("node %s: tend: %v", n.name, err)
	}
}

// Nodes claim their own blocks with no controller running: one create
// each, distinct indices, owned through nodeName; addresses from a block
// with room cost no API request; the spare block is there before the
// first ADD, and ADDs do not wait for the next one.
func TestClaimOwnBlocks(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "default", "10.80.0.0/24", 3) // 32 blocks of 8
	// Leases renewed once an hour: a renewal would be a write the counts
	// below do not expect.
	a := startNode(t, env, "node-a", t.TempDir(), nodeOpts{lease: time.Hour})
	b := startNode(t, env, "node-b", t.TempDir(), nodeOpts{lease: time.Hour})

	_, w0 := a.st.APIRequests()
	tend(t, a)
	tend(t, b)
	if _, w1 := a.st.APIRequests(); w1-w0 != 1 {
		t.Errorf("node-a's first spare took %d API writes, want 1 (a create)", w1-w0)
	}
	ba, bb := apiBlocks(t, c, "default", "node-a"), apiBlocks(t, c, "default", "node-b")
	if len(ba) != 1 || len(bb) != 1 {
		t.Fatalf("spares at start: node-a %d, node-b %d blocks; want one each", len(ba), len(bb))
	}
	for _, blk := range ba {
		if blk.NodeName != "node-a" || blk.Name != skeinv1.BlockName("default", uint32(blk.Index)) {
			t.Errorf("block %s: nodeName %q index %d, want node-a and the name <pool>-<index>", blk.Name, blk.NodeName, blk.Index)
		}
	}
	// node-b asks for an address in node-a's spare: its claim of that
	// index collides with node-a's block and must be refused. Then no
	// block is believed owned by both nodes.
	var spareA skeinv1.AddressBlock
	for _, blk := range ba {
		spareA = blk
	}
	inA := netip.MustParsePrefix(*spareA.IPv4).Addr().Next()
	if got, err := b.ipam.Allocate(ctx, ipam.Request{Pool: "default", Static: []netip.Addr{inA}}); !errors.Is(err, ipam.ErrInUse) {
		t.Errorf("node-b's static %v in node-a's block %s: %v, %v; want ErrInUse", inA, spareA.Name, got, err)
	}
	checkOneOwner(t, c, "default", []*node{a, b}, nil)

	r0, w0 := a.st.APIRequests()
	seen := map[netip.Addr]bool{}
	// Down to one free address (below a quarter of the block's 8).
	for u, _ := a.ipam.Usage(ctx, "default"); u.Free > 1; u, _ = a.ipam.Usage(ctx, "default") {
		x := alloc(t, a, "default")
		if seen[x] {
			t.Fatalf("%v handed out twice", x)
		}
		seen[x] = true
	}
	if r1, w1 := a.st.APIRequests(); r1 != r0 || w1 != w0 {
		t.Errorf("%d ADDs into the spare block made %d reads and %d writes, want none", len(seen), r1-r0, w1-w0)
	}
	tend(t, a) // free addresses below a quarter of a block: the next spare
	if n := len(apiBlocks(t, c, "default", "node-a")); n != 2 {
		t.Fatalf("node-a has %d blocks after running low, want 2 (the spare)", n)
	}
	_, w0 = a.st.APIRequests()
	for range 3 {
		alloc(t, a, "default")
	}
	if _, w1 := a.st.APIRequests(); w1 != w0 {
		t.Errorf("ADDs with a spare present made %d API writes, want 0", w1-w0)
	}
	checkOneOwner(t, c, "default", []*node{a, b}, map[string][]netip.Addr{"node-a": slices.Collect(maps.Keys(seen))})
	// The node's Lease is there and names it.
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: kubestore.DefaultLeaseNamespace, Name: skeinv1.NodeLeaseName("node-a")}, lease); err != nil {
		t.Fatalf("node-a's liveness Lease: %v", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "node-a" || lease.Spec.RenewTime == nil {
		t.Errorf("Lease spec %+v, want holder node-a and a renew time", lease.Spec)
	}
}

// Two nodes allocating at once from a small pool: every address on one
// node only, and in a block that node owns.
func TestClaimConcurrentNodes(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "busy", "10.83.0.0/24", 3)
	nodes := []*node{startNode(t, env, "node-p", t.TempDir(), nodeOpts{}), startNode(t, env, "node-q", t.TempDir(), nodeOpts{})}
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
	handed := map[string][]netip.Addr{}
	for addr, who := range owner {
		blk, ok := blockOfAddr(t, c, "busy", addr)
		if !ok || blk.NodeName != who {
			t.Errorf("%v of %s is in block %s of node %q", addr, who, blk.Name, blk.NodeName)
		}
		handed[who] = append(handed[who], addr)
	}
	checkOneOwner(t, c, "busy", nodes, handed)
}

// The dangerous case: a block of a live node deleted behind its back (an
// admin, or a garbage collector that took a live node for dead) and
// claimed by another node. The first node never hands out an address of
// it again, stops exporting it, and reports it; every address stays on
// one node.
func TestBlockTakenFromLiveNode(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "default", "10.80.0.0/24", 3)
	// No Run for node-a: with it, node-a could claim the freed index
	// again itself before node-b does (its seed points there), which is
	// right but not the case under test. The loss is then found on
	// node-a's next allocation.
	a := startNode(t, env, "node-a", t.TempDir(), nodeOpts{})
	held := alloc(t, a, "default")
	blk, ok := blockOfAddr(t, c, "default", held)
	if !ok {
		t.Fatalf("no block holds %v", held)
	}
	// Deleted by an admin: finalizer off, gone.
	if err := c.Delete(ctx, &blk); err != nil {
		t.Fatal(err)
	}
	if err := c.Patch(ctx, &blk, client.RawPatch("application/json-patch+json", []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`))); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	// node-b claims that very index (its seed is elsewhere: it asks for it
	// by a static address in it).
	b := startNode(t, env, "node-b", t.TempDir(), nodeOpts{})
	eventually(t, "node-b seeing the block gone", func() error {
		_, err := b.ipam.Allocate(ctx, ipam.Request{Pool: "default", Static: []netip.Addr{held.Next()}})
		return err
	})
	for range 16 {
		x := alloc(t, a, "default")
		if netip.MustParsePrefix(*blk.IPv4).Contains(x) {
			t.Fatalf("node-a handed out %v from block %s, now node-b's", x, blk.Name)
		}
	}
	select {
	case i := <-a.lost:
		if i != uint32(blk.Index) {
			t.Errorf("node-a reported block %d lost, want %d", i, blk.Index)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node-a did not report its block lost")
	}
	for _, p := range a.ipam.OwnedBlocks() {
		if p.String() == *blk.IPv4 {
			t.Errorf("node-a still exports %v", p)
		}
	}
	// The pod that had held keeps it until its DEL; then it is simply
	// forgotten (not released in the API: the block is node-b's).
	a.ipam.Release(ctx, "default", []netip.Addr{held})
	now, _ := blockOfAddr(t, c, "default", held)
	if now.NodeName != "node-b" {
		t.Errorf("after node-a's DEL the block is node %q's, want node-b's", now.NodeName)
	}
}

// Pools are followed without a restart: a reserved address added is
// never handed out; a pool deleted and re-created with other subnets
// hands out addresses of its new subnets only.
func TestPoolsFollowedLive(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "live", "10.84.0.0/28", 3) // two blocks: .1-.7 and .8-.14
	n := startNode(t, env, "node-l", t.TempDir(), nodeOpts{run: true})
	first := alloc(t, n, "live")
	blk, _ := blockOfAddr(t, c, "live", first)
	block := netip.MustParsePrefix(*blk.IPv4)
	// Reserve the rest of that block.
	var rest []string
	for x := first.Next(); block.Contains(x); x = x.Next() {
		rest = append(rest, x.String())
	}
	p := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "live"}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Reserved = rest
	if err := c.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the reservation followed", func() error {
		x, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "live"})
		if err != nil {
			return err
		}
		n.ipam.Release(ctx, "live", x)
		if slices.Contains(rest, x[0].String()) {
			return fmt.Errorf("allocated reserved %v", x[0])
		}
		return nil
	})

	// Re-created with another subnet: the old blocks go first (the node
	// gives back the empty one at once while the pool is deleted; the
	// test releases first's).
	n.ipam.Release(ctx, "live", []netip.Addr{first})
	if err := c.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the old pool's blocks given back", func() error {
		if left := allBlocks(t, c, "live"); len(left) > 0 {
			return fmt.Errorf("%d blocks left", len(left))
		}
		return nil
	})
	createPool(t, c, "live", "10.85.0.0/24", 3)
	eventually(t, "the re-created pool followed", func() error {
		x, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "live"})
		if err != nil {
			return err
		}
		if !netip.MustParsePrefix("10.85.0.0/24").Contains(x[0]) {
			n.ipam.Release(ctx, "live", x)
			return fmt.Errorf("allocated %v of the old subnets", x[0])
		}
		return nil
	})
}

// A pool being deleted (a finalizer keeps it) gets no block claimed,
// and a node gives its empty blocks of it back at once.
func TestDeletingPoolNoClaims(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	p := &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "going", Finalizers: []string{"test.skein.dev/hold"}},
		Spec:       skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.86.0.0/24")}}, BlockSizeBits: 3},
	}
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, env, "node-d", t.TempDir(), nodeOpts{run: true})
	x := alloc(t, n, "going")
	n.ipam.Release(ctx, "going", []netip.Addr{x})
	if err := c.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the empty block of a deleting pool given back", func() error {
		if left := allBlocks(t, c, "going"); len(left) > 0 {
			return fmt.Errorf("%d blocks left", len(left))
		}
		return nil
	})
	eventually(t, "the deletion seen", func() error {
		_, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "going"})
		if !errors.Is(err, ipam.ErrPoolNotFound) {
			return fmt.Errorf("allocate: %v, want ErrPoolNotFound", err)
		}
		return nil
	})
	if left := allBlocks(t, c, "going"); len(left) > 0 {
		t.Fatalf("a block of a deleting pool was claimed: %s", left[0].Name)
	}
}

// A claim whose answer never came back (the API server made the block,
// the client gave up) leaks nothing: the block names the node, so the
// node adopts it, and gives it back once unused.
func TestLostClaimAdopted(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "default", "10.80.0.0/24", 3)
	createPool(t, c, "other", "10.88.0.0/24", 3)
	n := startNode(t, env, "node-o", t.TempDir(), nodeOpts{run: true, minBlockAge: 200 * time.Millisecond})
	if err := n.ipam.LoadAll(ctx); err != nil { // as skeind does at start
		t.Fatal(err)
	}
	pool := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "other"}, pool); err != nil {
		t.Fatal(err)
	}
	orphan := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: "other-20", Finalizers: []string{skeinv1.FinalizerBlock},
			Labels:          map[string]string{skeinv1.LabelPool: "other", skeinv1.LabelNode: "node-o"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: skeinv1.GroupVersion.String(), Kind: "AddressPool", Name: "other", UID: pool.UID}}},
		NodeName: "node-o", Index: 20, IPv4: ptr.To("10.88.0.160/29"),
	}
	if err := c.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the orphaned block adopted and given back", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(orphan), &skeinv1.AddressBlock{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	// What is left is the spare of the default pool, and only it.
	eventually(t, "node-o's spare", func() error {
		if got := apiBlocks(t, c, "other", "node-o"); len(got) != 0 {
			return fmt.Errorf("node-o has %d blocks of other, want none", len(got))
		}
		if got := apiBlocks(t, c, "default", "node-o"); len(got) != 1 {
			return fmt.Errorf("node-o has %d blocks, want the spare", len(got))
		}
		return nil
	})
}

// A block of the retired BlockRequest protocol (the node label, no
// nodeName) is adopted by its node at start.
func TestOldBlocksAdopted(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "default", "10.80.0.0/24", 3)
	old := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: "default-3", Finalizers: []string{skeinv1.FinalizerBlock},
			Labels: map[string]string{skeinv1.LabelPool: "default", skeinv1.LabelNode: "node-m"}},
		Index: 3, IPv4: ptr.To("10.80.0.24/29"),
	}
	if err := c.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, env, "node-m", t.TempDir(), nodeOpts{})
	if err := c.Get(ctx, client.ObjectKeyFromObject(old), old); err != nil {
		t.Fatal(err)
	}
	if old.NodeName != "node-m" {
		t.Fatalf("old block's nodeName %q after node-m started, want node-m", old.NodeName)
	}
	if err := n.ipam.Restore(ctx, "default", []netip.Addr{netip.MustParseAddr("10.80.0.25")}); err != nil {
		t.Fatalf("restore an address of the adopted block: %v", err)
	}
}

// A namespace the cache has not seen is read from the API server, never
// taken for one without a pool; a namespace that does not exist is an
// error, not the default pool.
func TestNamespacePoolLiveRead(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	// A cache that never sees namespace team-blue: every lookup of it is
	// a miss, as for a namespace made a moment ago.
	blind, err := cache.New(env.Config, cache.Options{Scheme: kubestore.Scheme, ByObject: map[client.Object]cache.ByObject{
		&corev1.Namespace{}: {Field: fields.OneTermEqualSelector("metadata.name", "plain")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	for _, obj := range []client.Object{&skeinv1.AddressPool{}, &skeinv1.AddressBlock{}, &corev1.Namespace{}} {
		if _, err := blind.GetInformer(cctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	go blind.Start(cctx) //nolint:errcheck
	if !blind.WaitForCacheSync(cctx) {
		t.Fatal("cache did not sync")
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-blue", Annotations: map[string]string{skeinv1.AnnotationPool: "blue"}}},
	} {
		if err := c.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	n := startNode(t, env, "node-n", t.TempDir(), nodeOpts{cache: blind})
	if p, ok, err := n.st.PoolForNamespace(ctx, "team-blue"); err != nil || !ok || p != "blue" {
		t.Errorf("pool of team-blue (not in the cache) = %q, %v, %v; want blue", p, ok, err)
	}
	eventually(t, "namespace plain in the cache", func() error {
		if p, ok, err := n.st.PoolForNamespace(ctx, "plain"); err != nil || ok {
			return fmt.Errorf("pool of plain = %q, %v, %v; want none", p, ok, err)
		}
		return nil
	})
	if p, ok, err := n.st.PoolForNamespace(ctx, "missing"); err == nil || ok {
		t.Errorf("pool of a missing namespace = %q, %v, %v; want an error", p, ok, err)
	}
}

// After a restart, blocks no attachment uses go back, but a spare of the
// default pool stays and used blocks are kept.
func TestRestartKeepsUsedAndSpare(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "default", "10.80.0.0/24", 3)
	createPool(t, c, "blue", "10.81.0.0/24", 3)
	dir := t.TempDir()
	e := startNode(t, env, "node-e", dir, nodeOpts{})
	var all []netip.Addr
	for range 12 { // two blocks of blue
		all = append(all, alloc(t, e, "blue"))
	}
	kept := all[len(all)-1]
	e.st.Close()
	e2 := startNode(t, env, "node-e", dir, nodeOpts{})
	if err := e2.ipam.LoadAll(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e2.ipam.Restore(ctx, "blue", []netip.Addr{kept}); err != nil {
		t.Fatalf("restore %v: %v", kept, err)
	}
	tend(t, e2)
	blue := apiBlocks(t, c, "blue", "node-e")
	if len(blue) != 1 {
		t.Fatalf("node-e has %d blocks of blue after restart, want the one in use", len(blue))
	}
	for _, blk := range blue {
		if !netip.MustParsePrefix(*blk.IPv4).Contains(kept) {
			t.Errorf("kept block %s does not hold the attached %v", blk.Name, kept)
		}
	}
	if n := len(apiBlocks(t, c, "default", "node-e")); n != 1 {
		t.Errorf("node-e has %d blocks of default, want its spare", n)
	}
}

// Static addresses: one in a block another node owns is refused; one in
// a free block claims that block.
func TestStaticAddresses(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "blue", "10.81.0.0/24", 3)
	s := startNode(t, env, "node-s", t.TempDir(), nodeOpts{})
	b := startNode(t, env, "node-b", t.TempDir(), nodeOpts{})
	x := alloc(t, s, "blue")
	if got, err := s.ipam.Allocate(ctx, ipam.Request{Pool: "blue", Static: []netip.Addr{x.Next()}}); err != nil || got[0] != x.Next() {
		t.Fatalf("static %v in node-s's own block: %v, %v", x.Next(), got, err)
	}
	if _, err := b.ipam.Allocate(ctx, ipam.Request{Pool: "blue", Static: []netip.Addr{x.Next().Next()}}); !errors.Is(err, ipam.ErrInUse) {
		t.Errorf("static %v in node-s's block from node-b: %v, want ErrInUse", x.Next().Next(), err)
	}
	free := netip.MustParseAddr("10.81.0.250")
	if _, err := b.ipam.Allocate(ctx, ipam.Request{Pool: "blue", Static: []netip.Addr{free}}); err != nil {
		t.Fatalf("static %v in a free block: %v", free, err)
	}
	if blk, _ := blockOfAddr(t, c, "blue", free); blk.NodeName != "node-b" {
		t.Errorf("the block of %v is node %q's, want node-b's", free, blk.NodeName)
	}
}

// Many claims at once on one pool from several nodes (a burst, as 1,000
// nodes starting): no block index believed owned by two nodes.
func TestClaimBurst(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "default", "10.87.0.0/20", 2) // 1,024 blocks of 4
	var nodes []*node
	for i := range 12 {
		nodes = append(nodes, startNode(t, env, fmt.Sprintf("burst-%d", i), t.TempDir(), nodeOpts{}))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 12*20)
	for _, n := range nodes {
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "default"}); err != nil {
					errs <- fmt.Errorf("%s: %w", n.name, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	checkOneOwner(t, c, "default", nodes, nil)
}

// The Docker front door's IPAM uses pools by name over the Kubernetes
// store, and refuses new subnets.
func TestDockerPoolsByName(t *testing.T) {
	env, c := startEnv(t)
	createPool(t, c, "blue", "10.81.0.0/24", 3)
	dockerIPAM(t, startNode(t, env, "node-docker", t.TempDir(), nodeOpts{}))
}

// Subnets appended to a pool in use are followed: once its only block is
// full, the next address comes from the new subnet.
func TestSubnetsAppended(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "grow", "10.82.0.0/29", 3) // one block
	g := startNode(t, env, "node-g", t.TempDir(), nodeOpts{run: true})
	alloc(t, g, "grow")
	u, _ := g.ipam.Usage(ctx, "grow")
	for range u.Free {
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
	eventually(t, "an address of the appended subnet", func() error {
		x, err := g.ipam.Allocate(ctx, ipam.Request{Pool: "grow"})
		if err != nil {
			return err
		}
		if !netip.MustParsePrefix("10.82.1.0/29").Contains(x[0]) {
			return fmt.Errorf("allocated %v", x[0])
		}
		return nil
	})
}

// A release cut short between its two writes (the block deleted, its
// finalizer not yet removed: skeind killed in between) is finished by the
// node: the block goes, its index is free again, and it is not taken for
// a block lost to another node.
func TestReleaseCutShortFinished(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "other", "10.88.0.0/24", 3)
	createPool(t, c, "default", "10.80.0.0/24", 3)
	pool := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "other"}, pool); err != nil {
		t.Fatal(err)
	}
	half := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: "other-5", Finalizers: []string{skeinv1.FinalizerBlock},
			Labels:          map[string]string{skeinv1.LabelPool: "other", skeinv1.LabelNode: "node-h"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: skeinv1.GroupVersion.String(), Kind: "AddressPool", Name: "other", UID: pool.UID}}},
		NodeName: "node-h", Index: 5, IPv4: ptr.To("10.88.0.40/29"),
	}
	if err := c.Create(ctx, half); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, half); err != nil { // the first write of a release
		t.Fatal(err)
	}
	n := startNode(t, env, "node-h", t.TempDir(), nodeOpts{})
	if err := n.ipam.LoadAll(ctx); err != nil {
		t.Fatal(err)
	}
	tend(t, n)
	eventually(t, "the half-released block gone", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(half), &skeinv1.AddressBlock{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	select {
	case i := <-n.lost:
		t.Errorf("block %d of its own half-released reported lost", i)
	default:
	}
}

// A node's Lease renewal is one write and no read (at 1,000 nodes, a read
// before every renewal is 100 requests a second more), and the Lease moves.
func TestLeaseRenewalOneWrite(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	n := startNode(t, env, "node-r", t.TempDir(), nodeOpts{lease: 8 * time.Second}) // renewed every 2 s, each with 2 s to succeed
	key := client.ObjectKey{Namespace: kubestore.DefaultLeaseNamespace, Name: skeinv1.NodeLeaseName("node-r")}
	first := &coordinationv1.Lease{}
	if err := c.Get(ctx, key, first); err != nil {
		t.Fatal(err)
	}
	r0, w0 := n.st.APIRequests()
	time.Sleep(7 * time.Second)
	r1, w1 := n.st.APIRequests()
	if r1 != r0 {
		t.Errorf("%d reads in 7 s of Lease renewals, want none", r1-r0)
	}
	if w := w1 - w0; w < 2 || w > 4 {
		t.Errorf("%d writes in 7 s of renewals every 2 s, want about 3", w)
	}
	now := &coordinationv1.Lease{}
	if err := c.Get(ctx, key, now); err != nil {
		t.Fatal(err)
	}
	if !now.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
		t.Errorf("renew time %v did not move from %v", now.Spec.RenewTime, first.Spec.RenewTime)
	}
	// Someone else's change (an admin's edit) makes the next renewal read
	// the Lease again, and carry on.
	// A merge patch carries no resourceVersion, so a renewal landing
	// in between cannot make it conflict.
	edited := now.DeepCopy()
	edited.Labels = map[string]string{"edited": "yes"}
	if err := c.Patch(ctx, edited, client.MergeFrom(now)); err != nil {
		t.Fatal(err)
	}
	now = edited
	eventually(t, "the Lease renewed after an edit", func() error {
		l := &coordinationv1.Lease{}
		if err := c.Get(ctx, key, l); err != nil {
			return err
		}
		if !l.Spec.RenewTime.After(now.Spec.RenewTime.Time) {
			return fmt.Errorf("renew time still %v", l.Spec.RenewTime)
		}
		return nil
	})
}

package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

// gcEnv is an API server with a pool "gc" (256 blocks of 32), the lease
// namespace, and every reconciler running with opts.
func gcEnv(t *testing.T, opts Options) client.Client {
	t.Helper()
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	leaseNamespace(t, c)
	if err := c.Create(context.Background(), newPool("gc", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.104.0.0/19")})); err != nil {
		t.Fatal(err)
	}
	startAll(t, env, opts)
	return c
}

// waitDeferred waits until the garbage collector has looked at a deleted
// Node's node and kept its blocks at least n more times than before;
// meanwhile kept must keep returning "" (what must not be taken).
func waitDeferred(t *testing.T, before float64, n int, kept func() string) {
	t.Helper()
	eventually(t, "the garbage collector to look at the deleted Node", func() string {
		if msg := kept(); msg != "" {
			t.Fatal(msg)
		}
		if got := counter(t, gcDeferred) - before; got < float64(n) {
			return fmt.Sprintf("%v deferrals", got)
		}
		return ""
	})
}

// TestNodeGCLiveNode: a Node deleted while its node's skeind still runs
// (it renews its Lease) keeps its blocks — both of the new and of the old
// protocol — for as long as the Lease is renewed, however often the
// garbage collector looks; so does one whose clock is five minutes
// behind (its renewTime looks long expired, the API server's record of
// its writes does not). Once the renewals stop, the blocks go (their
// finalizers taken off) Grace after the Lease ends, and the Lease with
// them. Another node's block is not touched.
func TestNodeGCLiveNode(t *testing.T) {
	const grace, leaseFor = 2 * time.Second, 3 * time.Second
	c := gcEnv(t, Options{NodeGCGrace: grace, GCInterval: 500 * time.Millisecond})
	ctx := context.Background()
	nodes := map[string]time.Duration{"live": 0, "skewed": -5 * time.Minute} // node → its clock's error
	kubenode.CreateNode(t, c, "other")

	// The nodes' skeinds: renew their Leases every 300 ms until stopped.
	var mu sync.Mutex
	renewed := time.Now()
	var leases []*coordinationv1.Lease
	for n, skew := range nodes {
		kubenode.CreateNode(t, c, n)
		leases = append(leases, renewLease(t, c, n, renewed.Add(skew), leaseFor))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			now := time.Now()
			for n, skew := range nodes {
				if _, err := writeLease(c, n, now.Add(skew), leaseFor); err != nil {
					t.Error(err)
				}
			}
			mu.Lock()
			renewed = now
			mu.Unlock()
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	blocks := []*skeinv1.AddressBlock{
		makeBlock(t, c, "gc", 0, "live", false),
		makeBlock(t, c, "gc", 1, "live", false),
		makeBlock(t, c, "gc", 2, "live", true),
		makeBlock(t, c, "gc", 4, "skewed", false),
	}
	theirs := makeBlock(t, c, "gc", 3, "other", false)

	before := counter(t, gcDeferred)
	for n := range nodes {
		if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	// The deletions, then sweeps every 500 ms: the collector looks again
	// and again, and each time finds the nodes alive.
	waitDeferred(t, before, 8, func() string {
		for _, b := range blocks {
			if !exists(t, c, b) || !slices.Contains(b.Finalizers, skeinv1.FinalizerBlock) {
				return fmt.Sprintf("block %s of a live node whose Node was deleted: taken (finalizers %v)", b.Name, b.Finalizers)
			}
		}
		for _, l := range leases {
			if !exists(t, c, l) {
				return fmt.Sprintf("the Lease %s of a live node was deleted", l.Name)
			}
		}
		return ""
	})

	// The nodes stop: their blocks go Grace after their Leases end.
	close(stop)
	wg.Wait()
	mu.Lock()
	due := renewed.Add(leaseFor + grace)
	mu.Unlock()
	eventually(t, "the blocks of the stopped nodes", func() string {
		var left []string
		for _, b := range blocks {
			if exists(t, c, b) {
				left = append(left, fmt.Sprintf("%s %v", b.Name, b.Finalizers))
			}
		}
		if len(left) > 0 {
			return fmt.Sprintf("left: %v", left)
		}
		return ""
	})
	if early := due.Sub(time.Now()); early > 0 {
		t.Errorf("blocks taken %v before the Lease had ended and the grace passed", early)
	}
	for _, l := range leases {
		eventually(t, "the Lease of a stopped node", func() string {
			if exists(t, c, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}) {
				return l.Name + " still there"
			}
			return ""
		})
	}
	if !exists(t, c, theirs) {
		t.Errorf("the block of node %s, whose Node exists, was taken", theirs.NodeName)
	}
}

// TestNodeGCWithoutLease: nodes gone without ever having had a Lease (a
// crash before the first renewal) are judged by their newest block: it
// is kept until Grace after its creation, then goes, whether of the new
// or the old protocol, and whether the node went before the controller
// started or while it ran. A Lease left by a deleted node, with no block,
// goes once it has ended.
func TestNodeGCWithoutLease(t *testing.T) {
	const grace = 3 * time.Second
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	leaseNamespace(t, c)
	if err := c.Create(ctx, newPool("gc", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.104.0.0/19")})); err != nil {
		t.Fatal(err)
	}
	// Left before the controller started: an old-protocol block of a
	// node that never had a Node, and a Lease that ended an hour ago.
	ghost := makeBlock(t, c, "gc", 7, "ghost", true)
	// (Written now: the API server's record of the write counts as a
	// renewal, so a short duration.)
	oldLease := renewLease(t, c, "long-gone", time.Now().Add(-time.Hour), time.Second)
	before := counter(t, gcDeferred)
	startAll(t, env, Options{NodeGCGrace: grace, GCInterval: 500 * time.Millisecond})

	// A node that crashed before its first renewal, its Node deleted.
	crashed := kubenode.CreateNode(t, c, "crashed")
	blk := makeBlock(t, c, "gc", 0, "crashed", false)
	if err := c.Delete(ctx, crashed); err != nil {
		t.Fatal(err)
	}
	due := blk.CreationTimestamp.Add(grace) // whole seconds: the block is no older
	waitDeferred(t, before, 2, func() string {
		if !exists(t, c, blk) && time.Now().Before(due) {
			return fmt.Sprintf("block %s of a node without Lease taken before the grace after its creation", blk.Name)
		}
		return ""
	})
	for _, b := range []*skeinv1.AddressBlock{ghost, blk} {
		eventually(t, "block "+b.Name+" of a node gone without a Lease", func() string {
			if exists(t, c, b) {
				return fmt.Sprintf("there, finalizers %v", b.Finalizers)
			}
			return ""
		})
	}
	if early := due.Sub(time.Now()); early > 0 {
		t.Errorf("block %s taken %v before the grace after its creation had passed", blk.Name, early)
	}
	eventually(t, "the Lease of a node long gone", func() string {
		if exists(t, c, oldLease) {
			return "still there"
		}
		return ""
	})
}

// TestNodeGCRequests: BlockRequests, which nothing answers any more, are
// deleted: at once when their Node is gone, else once older than
// RequestMaxAge.
func TestNodeGCRequests(t *testing.T) {
	const maxAge = 5 * time.Second
	c := gcEnv(t, Options{RequestMaxAge: maxAge})
	ctx := context.Background()
	kubenode.CreateNode(t, c, "here")
	young := request(c, t, "here", "gc")
	orphan := request(c, t, "gone", "gc")
	eventually(t, "the request of a missing Node", func() string {
		if exists(t, c, orphan) {
			return "still there"
		}
		return ""
	})
	// The young request must still be there unless it has reached
	// maxAge meanwhile (a loaded machine can take that long to delete the
	// orphan). Its age is counted from its creationTimestamp, whole
	// seconds, as the controller counts it.
	if !exists(t, c, young) {
		// Read after the look: the age can only have grown since.
		if age := time.Since(young.CreationTimestamp.Time); age < maxAge {
			t.Fatalf("request of an existing Node deleted %v after its creationTimestamp, before it was %v old", age, maxAge)
		}
		t.Logf("the orphan took so long to go that the young request reached %v meanwhile: its early deletion cannot be checked in this run", maxAge)
	}
	eventually(t, "the request older than "+maxAge.String(), func() string {
		if exists(t, c, young) {
			return "still there"
		}
		return ""
	})
	if age := time.Since(young.CreationTimestamp.Time); age < maxAge {
		t.Errorf("request deleted at %v old, before %v", age, maxAge)
	}
	var left skeinv1.BlockRequestList
	if err := c.List(ctx, &left); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) > 0 {
		t.Errorf("requests left: %d", len(left.Items))
	}
}

// TestNodeGCSweep: one sweep, run without a manager, takes back what
// nodes gone for good left and keeps what a node with a Node, or a node
// without one that renews its Lease, owns.
func TestNodeGCSweep(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	leaseNamespace(t, c)
	if err := c.Create(ctx, newPool("sweep", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.106.0.0/24")})); err != nil {
		t.Fatal(err)
	}
	kubenode.CreateNode(t, c, "alive")
	renewLease(t, c, "nodeless", time.Now().Add(time.Hour), 40*time.Second) // runs without a Node
	for i, node := range []string{"alive", "gone", "nodeless", "gone"} {
		makeBlock(t, c, "sweep", uint32(i), node, i == 3)
	}
	request(c, t, "gone", "sweep")
	// Long gone: the blocks are older than this grace.
	gc := &NodeGCReconciler{Client: c, Grace: time.Millisecond}
	if err := gc.Sweep(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	var names []string
	for _, b := range blocksOf(c, t, "sweep") {
		names = append(names, b.Name+"@"+blockOwner(&b))
	}
	if fmt.Sprint(names) != "[sweep-0@alive sweep-2@nodeless]" {
		t.Errorf("blocks after a sweep: %v, want those of alive and nodeless", names)
	}
	var reqs skeinv1.BlockRequestList
	if err := c.List(ctx, &reqs); err != nil {
		t.Fatal(err)
	}
	if len(reqs.Items) > 0 {
		t.Errorf("the request of a missing Node was kept")
	}
	// Sweeping again finds nothing more to do.
	if err := gc.Sweep(ctx); err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if n := len(blocksOf(c, t, "sweep")); n != 2 {
		t.Errorf("%d blocks after two sweeps, want 2", n)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "alive"}, &corev1.Node{}); err != nil {
		t.Errorf("node alive: %v", err)
	}
}

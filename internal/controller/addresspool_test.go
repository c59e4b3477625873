package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// startAll runs a manager with every reconciler (Setup) until the test
// ends, without leader election.
func startAll(t *testing.T, env *kube.Env, opts Options) {
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
	ctx, cancel := context.WithCancel(context.Background())
	if err := Setup(mgr, opts); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		checkStopped(t, <-done)
	})
}

// eventually polls cond every 20 ms until it returns "" or 30 s pass,
// then fails with its last complaint.
func eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s after 30 s", what, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeBlock does what a node's skeind does when it lets a block go.
func freeBlock(t *testing.T, c client.Client, name string) {
	t.Helper()
	ctx := context.Background()
	blk := &skeinv1.AddressBlock{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, blk); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, blk); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, blk); err != nil {
		t.Fatal(err)
	}
	controllerutil.RemoveFinalizer(blk, skeinv1.FinalizerBlock)
	if err := c.Update(ctx, blk); err != nil {
		t.Fatal(err)
	}
}

func getPool(t *testing.T, c client.Client, name string) *skeinv1.AddressPool {
	t.Helper()
	p := &skeinv1.AddressPool{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// poolState sums up what the tests check of a pool's status.
func poolState(p *skeinv1.AddressPool) string {
	cond := func(typ string) string {
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		if c == nil {
			return typ + "=?"
		}
		return fmt.Sprintf("%s=%s/%s", typ, c.Status, c.Reason)
	}
	return fmt.Sprintf("%d/%d %s %s", p.Status.BlocksAllocated, p.Status.BlocksTotal, cond(PoolReady), cond(PoolExhausted))
}

func TestAddressPoolStatus(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	startAll(t, env, Options{})
	// Without the Node, its blocks would be garbage.
	newNode(t, c, "n1")
	// Three blocks.
	p := newPool("status", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.100.0.0/27")}, skeinv1.SubnetSet{IPv4: ptr.To("10.100.1.0/26")})
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	want := func(state string) {
		t.Helper()
		eventually(t, "pool status", func() string {
			if got := poolState(getPool(t, c, "status")); got != state {
				return fmt.Sprintf("%q, want %q", got, state)
			}
			return ""
		})
	}
	want("0/3 Ready=True/Valid Exhausted=False/BlocksFree")
	if got := getPool(t, c, "status"); !controllerutil.ContainsFinalizer(got, skeinv1.FinalizerPool) {
		t.Errorf("pool finalizers %v, want %s", got.Finalizers, skeinv1.FinalizerPool)
	}
	var names []string
	for i := range 3 {
		br := answer(c, t, request(c, t, "n1", "status"))
		names = append(names, br.Status.AddressBlockName)
		if i == 0 {
			want("1/3 Ready=True/Valid Exhausted=False/BlocksFree")
		}
	}
	want("3/3 Ready=True/Valid Exhausted=True/AllBlocksCarved")
	freeBlock(t, c, names[1])
	want("2/3 Ready=True/Valid Exhausted=False/BlocksFree")

	// A pool the geometry refuses says why, and has no blocks to give.
	bad := newPool("badstatus", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.101.0.0/24"), IPv6: ptr.To("fd00:101::/120")},
		skeinv1.SubnetSet{IPv4: ptr.To("10.102.0.0/24")})
	if err := c.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status of an invalid pool", func() string {
		got := getPool(t, c, "badstatus")
		if s := poolState(got); s != "0/0 Ready=False/PoolInvalid Exhausted=False/PoolInvalid" {
			return fmt.Sprintf("%q", s)
		}
		return ""
	})
}

// TestPoolDeletion: a pool with blocks is not deleted until its nodes
// have freed every block; then it goes.
func TestPoolDeletion(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	startAll(t, env, Options{})
	for _, n := range []string{"n1", "n2", "n3"} {
		newNode(t, c, n)
	}
	if err := c.Create(ctx, newPool("doomed", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.103.0.0/24")})); err != nil {
		t.Fatal(err)
	}
	a := answer(c, t, request(c, t, "n1", "doomed"))
	b := answer(c, t, request(c, t, "n2", "doomed"))
	eventually(t, "pool finalizer and status", func() string {
		p := getPool(t, c, "doomed")
		if !controllerutil.ContainsFinalizer(p, skeinv1.FinalizerPool) || p.Status.BlocksAllocated != 2 {
			return fmt.Sprintf("finalizers %v, %d blocks", p.Finalizers, p.Status.BlocksAllocated)
		}
		return ""
	})
	if err := c.Delete(ctx, getPool(t, c, "doomed")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleted pool in use", func() string {
		if s := poolState(getPool(t, c, "doomed")); s != "2/8 Ready=False/Deleting Exhausted=False/BlocksFree" {
			return fmt.Sprintf("%q", s)
		}
		return ""
	})
	// New requests are refused meanwhile.
	br := answer(c, t, request(c, t, "n3", "doomed"))
	if cond := condition(br, skeinv1.ConditionFailed); cond == nil || cond.Reason != skeinv1.ReasonPoolNotFound {
		t.Errorf("request for a pool being deleted: %+v, want Failed", br.Status)
	}
	freeBlock(t, c, a.Status.AddressBlockName)
	time.Sleep(500 * time.Millisecond)
	if p := getPool(t, c, "doomed"); p.Status.BlocksAllocated != 1 {
		t.Errorf("pool deleted with a block left, or its status is stale: %s", poolState(p))
	}
	freeBlock(t, c, b.Status.AddressBlockName)
	eventually(t, "pool deletion once its blocks are freed", func() string {
		err := c.Get(ctx, client.ObjectKey{Name: "doomed"}, &skeinv1.AddressPool{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("get: %v", err)
		}
		return ""
	})
}

func newNode(t *testing.T, c client.Client, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	return n
}

// objectsOf returns the names of node's blocks and requests.
func objectsOf(t *testing.T, c client.Client, node string) (blocks, reqs []string) {
	t.Helper()
	var bl skeinv1.AddressBlockList
	if err := c.List(context.Background(), &bl, client.MatchingLabels{skeinv1.LabelNode: node}); err != nil {
		t.Fatal(err)
	}
	for _, b := range bl.Items {
		blocks = append(blocks, b.Name)
	}
	var rl skeinv1.BlockRequestList
	if err := c.List(context.Background(), &rl); err != nil {
		t.Fatal(err)
	}
	for _, r := range rl.Items {
		if r.Spec.NodeName == node {
			reqs = append(reqs, r.Name)
		}
	}
	return blocks, reqs
}

// TestNodeGC: the blocks and requests of a deleted Node are removed
// (finalizers and all), other nodes' are kept, and those of a node gone
// while no controller ran are found when one starts.
func TestNodeGC(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, newPool("gc", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.104.0.0/24")})); err != nil {
		t.Fatal(err)
	}
	// Left by a node that went while no controller ran: a request, and a
	// block made as the controller makes them.
	request(c, t, "ghost", "gc")
	r := &BlockRequestReconciler{Client: c}
	ghost := &skeinv1.BlockRequest{Spec: skeinv1.BlockRequestSpec{NodeName: "ghost", PoolName: "gc"}}
	ghostBlock, err := r.newBlock(getPool(t, c, "gc"), mustGeometry(t, getPool(t, c, "gc")), 7, ghost)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, ghostBlock); err != nil {
		t.Fatal(err)
	}

	startAll(t, env, Options{GCInterval: time.Second})
	eventually(t, "objects of a node gone before the controller started", func() string {
		if b, r := objectsOf(t, c, "ghost"); len(b)+len(r) > 0 {
			return fmt.Sprintf("blocks %v, requests %v", b, r)
		}
		return ""
	})

	n1, n2 := newNode(t, c, "gc-n1"), newNode(t, c, "gc-n2")
	for range 2 {
		for _, n := range []string{n1.Name, n2.Name} {
			answer(c, t, request(c, t, n, "gc"))
		}
	}
	if err := c.Delete(ctx, n1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "objects of a deleted node", func() string {
		if b, r := objectsOf(t, c, n1.Name); len(b)+len(r) > 0 {
			return fmt.Sprintf("blocks %v, requests %v", b, r)
		}
		return ""
	})
	if b, r := objectsOf(t, c, n2.Name); len(b) != 2 || len(r) != 2 {
		t.Errorf("node %s, still there, has blocks %v and requests %v, want 2 of each", n2.Name, b, r)
	}
	// A block of a missing node appearing later (a request carved just as
	// its node went) goes too.
	late, err := r.newBlock(getPool(t, c, "gc"), mustGeometry(t, getPool(t, c, "gc")), 6,
		&skeinv1.BlockRequest{Spec: skeinv1.BlockRequestSpec{NodeName: n1.Name, PoolName: "gc"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a late block of a deleted node", func() string {
		if b, _ := objectsOf(t, c, n1.Name); len(b) > 0 {
			return fmt.Sprintf("blocks %v", b)
		}
		return ""
	})
}

package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

func init() { ctrl.SetLogger(logr.Discard()) }

// startController runs a manager with the BlockRequest reconciler until
// the test ends. Several may run at once, as during a failover.
func startController(t *testing.T, env *kube.Env, workers int) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 kube.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Two managers in one process register one controller name.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &BlockRequestReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Workers: workers}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		checkStopped(t, <-done)
	})
}

func newPool(name string, bits int32, subnets ...skeinv1.SubnetSet) *skeinv1.AddressPool {
	return &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       skeinv1.AddressPoolSpec{Subnets: subnets, BlockSizeBits: bits},
	}
}

func request(c client.Client, t *testing.T, node, pool string) *skeinv1.BlockRequest {
	t.Helper()
	br := &skeinv1.BlockRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-"},
		Spec:       skeinv1.BlockRequestSpec{NodeName: node, PoolName: pool},
	}
	if err := c.Create(context.Background(), br); err != nil {
		t.Fatalf("create request: %v", err)
	}
	return br
}

// answer waits until br is Complete or Failed and returns it.
func answer(c client.Client, t *testing.T, br *skeinv1.BlockRequest) *skeinv1.BlockRequest {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := &skeinv1.BlockRequest{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(br), got); err != nil {
			t.Fatalf("get request %s: %v", br.Name, err)
		}
		if finished(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s unanswered after 30 s: %+v", br.Name, got.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func condition(br *skeinv1.BlockRequest, typ string) *metav1.Condition {
	return meta.FindStatusCondition(br.Status.Conditions, typ)
}

func blocksOf(c client.Client, t *testing.T, pool string) []skeinv1.AddressBlock {
	t.Helper()
	var l skeinv1.AddressBlockList
	if err := c.List(context.Background(), &l, client.MatchingLabels{skeinv1.LabelPool: pool}); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func TestBlockRequest(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	startController(t, env, 1)

	t.Run("carve until exhausted", func(t *testing.T) {
		// Blocks of 8: four in each family.
		p := newPool("small", 3, skeinv1.SubnetSet{IPv4: ptr.To("10.70.0.0/27"), IPv6: ptr.To("fd00:70::/125")})
		p.Spec.Subnets[0].IPv6 = ptr.To("fd00:70::/123")
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			node := fmt.Sprintf("node%d", i%2)
			br := answer(c, t, request(c, t, node, "small"))
			if cond := condition(br, skeinv1.ConditionComplete); cond == nil || cond.Status != metav1.ConditionTrue {
				t.Fatalf("request %d: %+v, want Complete", i, br.Status)
			}
			want := skeinv1.BlockName("small", uint32(i))
			if br.Status.AddressBlockName != want {
				t.Errorf("request %d got block %s, want the next free one, %s", i, br.Status.AddressBlockName, want)
			}
			blk := &skeinv1.AddressBlock{}
			if err := c.Get(ctx, client.ObjectKey{Name: want}, blk); err != nil {
				t.Fatalf("block of request %d: %v", i, err)
			}
			wantV4, wantV6 := fmt.Sprintf("10.70.0.%d/29", 8*i), fmt.Sprintf("fd00:70::%x/125", 8*i)
			if i == 0 {
				wantV6 = "fd00:70::/125"
			}
			if blk.Index != int64(i) || ptr.Deref(blk.IPv4, "") != wantV4 || ptr.Deref(blk.IPv6, "") != wantV6 {
				t.Errorf("block %s: index %d %v %v, want %d %s %s", blk.Name, blk.Index, ptr.Deref(blk.IPv4, ""), ptr.Deref(blk.IPv6, ""), i, wantV4, wantV6)
			}
			if blk.Labels[skeinv1.LabelPool] != "small" || blk.Labels[skeinv1.LabelNode] != node || blk.Labels[skeinv1.LabelRequest] != string(br.UID) {
				t.Errorf("block %s labels %v", blk.Name, blk.Labels)
			}
			if len(blk.OwnerReferences) != 1 || blk.OwnerReferences[0].UID != p.UID || !ptr.Deref(blk.OwnerReferences[0].Controller, false) {
				t.Errorf("block %s owners %+v, want the pool", blk.Name, blk.OwnerReferences)
			}
			if len(blk.Finalizers) != 1 || blk.Finalizers[0] != skeinv1.FinalizerBlock {
				t.Errorf("block %s finalizers %v", blk.Name, blk.Finalizers)
			}
		}
		br := answer(c, t, request(c, t, "node9", "small"))
		cond := condition(br, skeinv1.ConditionFailed)
		if cond == nil || cond.Reason != skeinv1.ReasonPoolExhausted || !strings.Contains(cond.Message, `all 4 blocks of AddressPool "small" are taken`) {
			t.Errorf("fifth request: %+v, want Failed PoolExhausted", br.Status)
		}
		if n := len(blocksOf(c, t, "small")); n != 4 {
			t.Errorf("pool small has %d blocks, want 4", n)
		}
	})

	t.Run("unknown pool", func(t *testing.T) {
		br := answer(c, t, request(c, t, "node1", "nosuch"))
		cond := condition(br, skeinv1.ConditionFailed)
		if cond == nil || cond.Reason != skeinv1.ReasonPoolNotFound || cond.Message != `there is no AddressPool "nosuch"` {
			t.Errorf("request for a missing pool: %+v, want Failed PoolNotFound", br.Status)
		}
		if br.Status.AddressBlockName != "" || len(blocksOf(c, t, "nosuch")) != 0 {
			t.Errorf("a failed request left a block behind")
		}
	})

	t.Run("invalid pool", func(t *testing.T) {
		// The schema accepts it; the geometry does not (the webhook will
		// refuse it when it runs).
		p := newPool("mixed", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.71.0.0/24"), IPv6: ptr.To("fd00:71::/120")},
			skeinv1.SubnetSet{IPv4: ptr.To("10.72.0.0/24")})
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		br := answer(c, t, request(c, t, "node1", "mixed"))
		cond := condition(br, skeinv1.ConditionFailed)
		if cond == nil || cond.Reason != skeinv1.ReasonPoolInvalid || !strings.Contains(cond.Message, "every entry needs both") {
			t.Errorf("request for an invalid pool: %+v, want Failed PoolInvalid", br.Status)
		}
		if len(blocksOf(c, t, "mixed")) != 0 {
			t.Errorf("a failed request left a block behind")
		}
	})
}

// TestBlockRequestRace runs three controllers at once on a burst of
// requests (what a failover can look like for a moment): every request is
// answered with its own block, indices are unique (the names see to
// that), and no request leaves a second, orphaned block.
func TestBlockRequestRace(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, newPool("race", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.80.0.0/21")})); err != nil { // 64 blocks
		t.Fatal(err)
	}
	for range 3 {
		startController(t, env, DefaultBlockRequestWorkers)
	}
	const n = 48
	reqs := make([]*skeinv1.BlockRequest, n)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() { reqs[i] = request(c, t, fmt.Sprintf("node%d", i%7), "race") })
	}
	wg.Wait()
	owner := map[string]string{} // block → request
	for _, br := range reqs {
		got := answer(c, t, br)
		if !meta.IsStatusConditionTrue(got.Status.Conditions, skeinv1.ConditionComplete) {
			t.Errorf("request %s: %+v, want Complete", br.Name, got.Status)
			continue
		}
		if prev, dup := owner[got.Status.AddressBlockName]; dup {
			t.Errorf("block %s given to both %s and %s", got.Status.AddressBlockName, prev, br.Name)
		}
		owner[got.Status.AddressBlockName] = string(got.UID)
	}
	blocks := blocksOf(c, t, "race")
	if len(blocks) != n {
		t.Errorf("%d blocks for %d requests", len(blocks), n)
	}
	for _, b := range blocks {
		if owner[b.Name] != b.Labels[skeinv1.LabelRequest] {
			t.Errorf("block %s carries request %s, but that request's status does not name it", b.Name, b.Labels[skeinv1.LabelRequest])
		}
		if b.Name != skeinv1.BlockName("race", uint32(b.Index)) {
			t.Errorf("block %s has index %d", b.Name, b.Index)
		}
	}
}

// counterValue is skein_blockrequest_index_collisions_total now.
func counterValue(t *testing.T) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := collisions.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestBlockRequestWorkers serves many requests at once with one
// controller of several workers: each gets its own block, the lowest
// indices are used, and no worker chooses an index another worker of the
// process is carving (the reservations), which would cost a status write
// and a refused create.
func TestBlockRequestWorkers(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, newPool("workers", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.81.0.0/21")})); err != nil { // 64 blocks
		t.Fatal(err)
	}
	before := counterValue(t)
	startController(t, env, 8)
	const n = 60
	reqs := make([]*skeinv1.BlockRequest, n)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() { reqs[i] = request(c, t, fmt.Sprintf("node%d", i%9), "workers") })
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, br := range reqs {
		got := answer(c, t, br)
		if !meta.IsStatusConditionTrue(got.Status.Conditions, skeinv1.ConditionComplete) {
			t.Errorf("request %s: %+v, want Complete", br.Name, got.Status)
			continue
		}
		if seen[got.Status.AddressBlockName] {
			t.Errorf("block %s given twice", got.Status.AddressBlockName)
		}
		seen[got.Status.AddressBlockName] = true
	}
	for i := range uint32(n) {
		if name := skeinv1.BlockName("workers", i); !seen[name] {
			t.Errorf("block %s not given, though %d requests were served from the bottom of 64", name, n)
		}
	}
	if got := counterValue(t) - before; got != 0 {
		t.Errorf("%v indices chosen that another worker had, want 0", got)
	}
}

// TestBlockRequestResume replays the states a crash between the steps
// leaves, calling Reconcile directly: a name recorded but no block, a
// block made but no Complete, and a recorded name another request's block
// took meanwhile.
func TestBlockRequestResume(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := &BlockRequestReconciler{Client: c}
	p := newPool("resume", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.90.0.0/24")})
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	reconcile := func(br *skeinv1.BlockRequest) *skeinv1.BlockRequest {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(br)}); err != nil {
			t.Fatalf("reconcile %s: %v", br.Name, err)
		}
		got := &skeinv1.BlockRequest{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(br), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	setName := func(br *skeinv1.BlockRequest, name string) {
		t.Helper()
		br.Status.AddressBlockName = name
		if err := c.Status().Update(ctx, br); err != nil {
			t.Fatal(err)
		}
	}

	// A name recorded, no block yet: the block of that name is made.
	a := request(c, t, "node-a", "resume")
	setName(a, "resume-5")
	a = reconcile(a)
	if !finished(a) || a.Status.AddressBlockName != "resume-5" {
		t.Fatalf("resumed request: %+v, want Complete with resume-5", a.Status)
	}

	// The block made, Complete not written: finishes with that block.
	b := request(c, t, "node-b", "resume")
	setName(b, "resume-6")
	blk, err := r.newBlock(p, mustGeometry(t, p), 6, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, blk); err != nil {
		t.Fatal(err)
	}
	b = reconcile(b)
	if !meta.IsStatusConditionTrue(b.Status.Conditions, skeinv1.ConditionComplete) || b.Status.AddressBlockName != "resume-6" {
		t.Fatalf("resumed request: %+v, want Complete with resume-6", b.Status)
	}

	// A name recorded whose block another request took: a free one instead.
	d := request(c, t, "node-d", "resume")
	setName(d, "resume-5")
	d = reconcile(d)
	if !meta.IsStatusConditionTrue(d.Status.Conditions, skeinv1.ConditionComplete) || d.Status.AddressBlockName != "resume-0" {
		t.Fatalf("request whose recorded block was taken: %+v, want Complete with resume-0", d.Status)
	}
	if n := len(blocksOf(c, t, "resume")); n != 3 {
		t.Errorf("pool has %d blocks, want 3", n)
	}

	// A finished request is left alone; a deleted one is no error.
	if got := reconcile(d); got.ResourceVersion != d.ResourceVersion {
		t.Errorf("reconciling a finished request changed it")
	}
	if err := c.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(d)}); err != nil {
		t.Errorf("reconcile a deleted request: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(d), d); !apierrors.IsNotFound(err) {
		t.Errorf("get deleted request: %v", err)
	}
}

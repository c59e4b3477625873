package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

func TestAddressPoolStatus(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	startAll(t, env, Options{PoolStatusInterval: time.Second})
	// Without the Node, its blocks would be garbage.
	kubenode.CreateNode(t, c, "n1")
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
	makeBlock(t, c, "status", 0, "n1", false)
	want("1/3 Ready=True/Valid Exhausted=False/BlocksFree")
	makeBlock(t, c, "status", 1, "n1", false)
	makeBlock(t, c, "status", 2, "n1", true) // of the old protocol: counts alike
	want("3/3 Ready=True/Valid Exhausted=True/AllBlocksCarved")
	freeBlock(t, c, skeinv1.BlockName("status", 1))
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
// have freed every block; then it goes at once, however long the status
// debounce.
func TestPoolDeletion(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const interval = 5 * time.Second
	startAll(t, env, Options{PoolStatusInterval: interval})
	for _, n := range []string{"n1", "n2"} {
		kubenode.CreateNode(t, c, n)
	}
	if err := c.Create(ctx, newPool("doomed", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.103.0.0/24")})); err != nil {
		t.Fatal(err)
	}
	a := makeBlock(t, c, "doomed", 0, "n1", false)
	b := makeBlock(t, c, "doomed", 1, "n2", false)
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
	// One block freed: the pool says so...
	freeBlock(t, c, a.Name)
	eventually(t, "a deleted pool with one block left", func() string {
		if s := poolState(getPool(t, c, "doomed")); s != "1/8 Ready=False/Deleting Exhausted=False/BlocksFree" {
			return fmt.Sprintf("%q", s)
		}
		return ""
	})
	// ...and stays. A check that something does not happen needs a bound:
	// Reconcile decides on the finalizer before it writes the status, so
	// the status above proves a reconcile that counted one block kept the
	// pool; with no further event, the only reconcile still to come is a
	// requeue, at most one status interval later (RequeueAfter the
	// debounce) or conflictRetry. Watching for one interval covers both.
	for end := time.Now().Add(interval); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		p := &skeinv1.AddressPool{}
		err := c.Get(ctx, client.ObjectKey{Name: "doomed"}, p)
		if err != nil || !controllerutil.ContainsFinalizer(p, skeinv1.FinalizerPool) {
			t.Fatalf("the deleted pool lost its finalizer or went while block %s of it is left: get %v, finalizers %v", b.Name, err, p.Finalizers)
		}
	}
	// The last one freed: the pool goes at once, not after the interval.
	freeBlock(t, c, b.Name)
	freed := time.Now()
	eventually(t, "pool deletion once its blocks are freed", func() string {
		err := c.Get(ctx, client.ObjectKey{Name: "doomed"}, &skeinv1.AddressPool{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("get: %v", err)
		}
		return ""
	})
	if took := time.Since(freed); took > interval/2 {
		t.Errorf("the pool went %v after its last block, want well within the status interval %v", took, interval)
	}
}

// TestPoolStatusBurst: 200 blocks claimed one after the other (a cluster
// starting) make a handful of status writes, at most one per interval
// (counted by watching the pool: every write is an event), and the status
// ends right.
func TestPoolStatusBurst(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const interval = 2 * time.Second
	startAll(t, env, Options{PoolStatusInterval: interval})
	kubenode.CreateNode(t, c, "burst-n")
	if err := c.Create(ctx, newPool("burst", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.120.0.0/16")})); err != nil { // 2048 blocks
		t.Fatal(err)
	}
	eventually(t, "the new pool's status", func() string {
		if s := poolState(getPool(t, c, "burst")); s != "0/2048 Ready=True/Valid Exhausted=False/BlocksFree" {
			return fmt.Sprintf("%q", s)
		}
		return ""
	})

	// Count the status writes from here on.
	w, err := wc.Watch(ctx, &skeinv1.AddressPoolList{}, client.MatchingFields{"metadata.name": "burst"},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: getPool(t, c, "burst").ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	var writes []time.Time
	last := getPool(t, c, "burst").Status
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*skeinv1.AddressPool)
			if ev.Type != watch.Modified || !ok || equality.Semantic.DeepEqual(p.Status, last) {
				continue
			}
			last = p.Status
			mu.Lock()
			writes = append(writes, time.Now())
			mu.Unlock()
		}
	}()

	const n = 200
	start := time.Now()
	for i := range uint32(n) {
		makeBlock(t, c, "burst", i, "burst-n", false)
	}
	made := time.Since(start)
	eventually(t, "the pool's status after the burst", func() string {
		if s := poolState(getPool(t, c, "burst")); s != fmt.Sprintf("%d/2048 Ready=True/Valid Exhausted=False/BlocksFree", n) {
			return fmt.Sprintf("%q", s)
		}
		return ""
	})
	done := time.Since(start)
	// Any write still coming would be a spurious one: give it time.
	time.Sleep(interval + time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d blocks made in %v, status final after %v, in %d writes", n, made.Round(time.Millisecond), done.Round(time.Millisecond), len(writes))
	// At most the first change at once, then one per interval.
	if limit := int(done/interval) + 2; len(writes) > limit {
		t.Errorf("%d status writes for %d block events in %v, want at most %d (one per %v)", len(writes), n, done, limit, interval)
	}
	tooClose := 0
	for i := 1; i < len(writes); i++ {
		// The times are the watch's deliveries, not the writes: the
		// first write lands while 200 creates load the API server and
		// may arrive late while the next arrives promptly. A real double
		// write would be milliseconds apart.
		if writes[i].Sub(writes[i-1]) < interval/2 {
			tooClose++
		}
	}
	if tooClose > 0 {
		t.Errorf("%d status writes less than %v after the one before", tooClose, interval)
	}
}

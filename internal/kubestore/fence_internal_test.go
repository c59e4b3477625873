package kubestore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// TestRenewalAcrossTheFence: a renewal sent just before the node's Lease
// may expire and answered after it still reads what the node owns from
// the API server before the node acts again: the fence was on meanwhile,
// and the cache may have missed a block taken then.
func TestRenewalAcrossTheFence(t *testing.T) {
	ctx := context.Background()
	var slow atomic.Bool
	var lists atomic.Int32
	cl := interceptor.NewClient(fake.NewClientBuilder().WithScheme(Scheme).Build(), interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, op ...client.UpdateOption) error {
			if slow.Load() {
				time.Sleep(300 * time.Millisecond)
			}
			return c.Update(ctx, o, op...)
		},
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, op ...client.ListOption) error {
			lists.Add(1)
			return c.List(ctx, l, op...)
		},
	})
	s := nodeAStore(cl)
	s.lease = newLeaseKeeper(s, "", 2*time.Second)
	s.lease.renew(ctx) // creates the Lease; the first renewal reads what the node owns
	if err := s.Fenced(); err != nil || lists.Load() != 1 {
		t.Fatalf("after the first renewal: %v, %d live lists", err, lists.Load())
	}
	// A block the cache believes this node's, which the API server does
	// not have (taken while the node could not see it).
	s.own("pool-3", "uid-3")
	// The last renewal 100 ms short of the Lease's end; the next is slow.
	s.lease.mu.Lock()
	s.lease.okSent = time.Now().Add(-2*time.Second + 100*time.Millisecond)
	s.lease.mu.Unlock()
	slow.Store(true)
	done := make(chan struct{})
	go func() { s.lease.renew(ctx); close(done) }()
	time.Sleep(200 * time.Millisecond)
	if s.Fenced() == nil {
		t.Fatal("not fenced while the renewal was in flight past the Lease's end")
	}
	<-done
	if err := s.Fenced(); err != nil {
		t.Fatalf("still fenced after the renewal: %v", err)
	}
	if s.Owns("pool", 3, "node-a") || lists.Load() != 2 {
		t.Errorf("after a renewal across the fence: owns pool-3 %v, %d live lists; want the block dropped by a second list",
			s.Owns("pool", 3, "node-a"), lists.Load())
	}
}

// TestClaimDuringLiveList: a block that becomes this node's while its live
// list of owned blocks is under way (a claim answered after the API server
// answered the list) may be newer than the list: it is read again by name,
// and kept if it is this node's (block 5), dropped if the API server does
// not have it (block 6: created before the list and deleted since, or
// never). Dropping a real one would leak it until a restart; keeping a
// gone one would hand out addresses of a block another node may get.
func TestClaimDuringLiveList(t *testing.T) {
	ctx := context.Background()
	var s *Store
	cl := interceptor.NewClient(fake.NewClientBuilder().WithScheme(Scheme).Build(), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, op ...client.ListOption) error {
			err := c.List(ctx, l, op...)
			// Answered; meanwhile a claim creates block 5 and records it,
			// and block 6 is recorded too.
			b := testBlock("pool-5", "node-a")
			b.UID = "uid-5"
			if cerr := c.Create(ctx, b); cerr != nil {
				t.Error(cerr)
			}
			s.own("pool-5", b.UID)
			s.own("pool-6", "uid-6")
			return err
		},
	})
	s = nodeAStore(cl)
	s.own("pool-3", "uid-3") // owned before the list, gone from the API server
	if err := s.verifyOwned(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.Owns("pool", 5, "node-a") {
		t.Error("the block claimed during the live list was dropped")
	}
	for _, i := range []uint32{3, 6} {
		if s.Owns("pool", i, "node-a") {
			t.Errorf("block %d, which the API server does not have, is still owned", i)
		}
	}
}

// nodeAStore is a Store of node-a on cl, without a cache or a Lease.
func nodeAStore(cl client.Client) *Store {
	return &Store{node: "node-a", client: cl, owned: map[string]types.UID{}, m: newStoreMetrics(), done: make(chan struct{})}
}

// testBlock is an AddressBlock of pool "pool" owned by node.
func testBlock(name, node string) *skeinv1.AddressBlock {
	return &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{skeinv1.LabelNode: node, skeinv1.LabelPool: "pool"}}, NodeName: node}
}

// TestForgottenDuringLiveList: a block the node gave back (or found gone)
// while the live list was under way is no longer in the owned set when
// the list's answer is compared, but that life of it is over all the
// same: a stale copy in the cache does not make it this node's again.
func TestForgottenDuringLiveList(t *testing.T) {
	ctx := context.Background()
	var s *Store
	cl := interceptor.NewClient(fake.NewClientBuilder().WithScheme(Scheme).Build(), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, op ...client.ListOption) error {
			err := c.List(ctx, l, op...)
			s.disown("pool-3", "") // a give-back's first step
			return err
		},
	})
	s = nodeAStore(cl)
	stale := testBlock("pool-3", "node-a")
	stale.UID = "uid-3"
	s.observeBlock(stale, false)
	if err := s.verifyOwned(ctx); err != nil {
		t.Fatal(err)
	}
	s.observeBlock(stale, false)
	if s.Owns("pool", 3, "node-a") {
		t.Error("a stale copy of a block the live list did not show made it this node's again")
	}
}

// TestReleaseRetires: a block given back (deleted) or found gone by the
// give-back is over for this node: a stale copy in the cache does not
// make it this node's again.
func TestReleaseRetires(t *testing.T) {
	ctx := context.Background()
	cl := fake.NewClientBuilder().WithScheme(Scheme).Build()
	s := nodeAStore(cl)
	kept := testBlock("pool-1", "node-a")
	kept.UID = "uid-1"
	if err := cl.Create(ctx, kept); err != nil {
		t.Fatal(err)
	}
	gone := testBlock("pool-2", "node-a")
	gone.UID = "uid-2" // not on the API server
	for _, b := range []*skeinv1.AddressBlock{kept, gone} {
		s.observeBlock(b, false)
		if err := s.ReleaseBlock(ctx, "pool", map[string]uint32{"pool-1": 1, "pool-2": 2}[b.Name], "node-a"); err != nil {
			t.Fatal(err)
		}
		s.observeBlock(b, false) // the cache, not caught up
		if s.Owns("pool", map[string]uint32{"pool-1": 1, "pool-2": 2}[b.Name], "node-a") {
			t.Errorf("%s: a stale copy made a block given back this node's again", b.Name)
		}
	}
}

// TestResyncAfterLiveList: once the live list has dropped a block, the
// cache's copy of it (a resync or a late event from a cache that has not
// caught up, the one that missed the block being taken) does not make it
// this node's again: that life of the block (its UID) is over for this
// node, whatever a stale copy says.
func TestResyncAfterLiveList(t *testing.T) {
	ctx := context.Background()
	s := nodeAStore(fake.NewClientBuilder().WithScheme(Scheme).Build())
	stale := testBlock("pool-3", "node-a")
	stale.UID = "uid-3"
	s.observeBlock(stale, false)
	if !s.Owns("pool", 3, "node-a") {
		t.Fatal("the cache's block is not owned to begin with")
	}
	if err := s.verifyOwned(ctx); err != nil { // the API server has no such block
		t.Fatal(err)
	}
	s.observeBlock(stale, false) // the stale cache again
	if s.Owns("pool", 3, "node-a") {
		t.Error("a stale copy of a block the live list dropped made it this node's again")
	}
	// The cache catches up: the block deleted, nothing left to refuse.
	s.observeBlock(stale, true)
	if s.dropped[stale.UID] {
		t.Error("a deleted block's UID is still kept as dropped")
	}
	// Another life of the same block, claimed again: this node's.
	again := stale.DeepCopy()
	again.UID = "uid-3b"
	s.observeBlock(again, false)
	if !s.Owns("pool", 3, "node-a") {
		t.Error("the block claimed again (a new UID) is not owned")
	}
}

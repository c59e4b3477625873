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
	s := &Store{node: "node-a", client: cl, owned: map[string]types.UID{}, m: newStoreMetrics(), done: make(chan struct{})}
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

// TestClaimDuringLiveList: a block this node claims while its live list of
// owned blocks is under way (created after the API server answered the
// list) stays this node's: the list can only speak for what the node owned
// before it was asked. Dropping it would leak the block (the API server
// shows it as this node's, the node no longer uses it) until a restart.
func TestClaimDuringLiveList(t *testing.T) {
	ctx := context.Background()
	var s *Store
	cl := interceptor.NewClient(fake.NewClientBuilder().WithScheme(Scheme).Build(), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, op ...client.ListOption) error {
			err := c.List(ctx, l, op...)
			// Answered; meanwhile a claim creates block 5 and records it.
			s.own("pool-5", "uid-5")
			return err
		},
	})
	s = &Store{node: "node-a", client: cl, owned: map[string]types.UID{}, m: newStoreMetrics(), done: make(chan struct{})}
	s.own("pool-3", "uid-3") // owned before the list, gone from the API server
	if err := s.verifyOwned(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.Owns("pool", 5, "node-a") {
		t.Error("the block claimed during the live list was dropped")
	}
	if s.Owns("pool", 3, "node-a") {
		t.Error("the block the API server no longer shows is still owned")
	}
}

// TestResyncAfterLiveList: once the live list has dropped a block, the
// cache's copy of it (a resync or a late event from a cache that has not
// caught up, the one that missed the block being taken) does not make it
// this node's again: that life of the block (its UID) is over for this
// node, whatever a stale copy says.
func TestResyncAfterLiveList(t *testing.T) {
	ctx := context.Background()
	s := &Store{node: "node-a", client: fake.NewClientBuilder().WithScheme(Scheme).Build(),
		owned: map[string]types.UID{}, m: newStoreMetrics(), done: make(chan struct{})}
	stale := &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: "pool-3", UID: "uid-3",
		Labels: map[string]string{skeinv1.LabelNode: "node-a", skeinv1.LabelPool: "pool"}}, NodeName: "node-a"}
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
	// Another life of the same block, claimed again: this node's.
	again := stale.DeepCopy()
	again.UID = "uid-3b"
	s.observeBlock(again, false)
	if !s.Owns("pool", 3, "node-a") {
		t.Error("the block claimed again (a new UID) is not owned")
	}
}

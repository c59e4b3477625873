package kubestore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
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

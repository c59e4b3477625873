package ctrlutil

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// TestQueueShutdown: the work queue of skein's controllers lets every
// worker go when it shuts down while items keep coming and workers keep
// finishing reconciles, as when a manager with a busy controller of
// several workers stops. controller-runtime 0.23's priority queue fails
// this within a few rounds (a worker stuck in Get or Done), which made a
// manager miss its 30 s grace period at shutdown.
func TestQueueShutdown(t *testing.T) {
	for round := range 40 {
		q := QueueOptions().NewQueue(fmt.Sprintf("shutdown-%d", round),
			workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: fmt.Sprint(rand.Int())}})
					item, shutdown := q.Get()
					if shutdown {
						return
					}
					q.Done(item)
				}
			})
		}
		time.Sleep(10 * time.Millisecond)
		q.ShutDown()
		stopped := make(chan struct{})
		go func() {
			wg.Wait()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: workers still blocked 5 s after the queue shut down", round)
		}
	}
}

// TestQueueUndrained: once shut down, the queue hands out no more items,
// however many are left: a stopping controller finishes what it is doing
// and stops (client-go's queue would have its workers work through the
// backlog first, with a cancelled context).
func TestQueueUndrained(t *testing.T) {
	q := QueueOptions().NewQueue("undrained", workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	for i := range 1000 {
		q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: fmt.Sprint(i)}})
	}
	first, shutdown := q.Get()
	if shutdown {
		t.Fatal("a queue not shut down reports shutdown")
	}
	q.ShutDown()
	q.Done(first)
	if item, shutdown := q.Get(); !shutdown {
		t.Errorf("after shutdown, Get handed out %v of a backlog of %d", item, q.Len()+1)
	}
}

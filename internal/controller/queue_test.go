package controller

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
		q := queueOptions().NewQueue(fmt.Sprintf("shutdown-%d", round),
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

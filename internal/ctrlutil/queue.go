package ctrlutil

import (
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// QueueOptions are the controller options every reconciler here is built
// with: client-go's rate-limited work queue (newQueue) instead of
// controller-runtime's priority queue, its default.
//
// The priority queue of controller-runtime 0.23 deadlocks at shutdown
// (kubernetes-sigs/controller-runtime#3538, fixed in 0.25): a worker
// waiting for an item leaves on ShutDown without taking the item the
// queue is handing it, the queue's goroutine blocks on that hand-over
// holding its locks, and a worker that then finishes a reconcile blocks
// in Done forever; the controller never stops, and the manager returns
// "failed waiting for all runnables to end within grace period" after
// 30 s. It takes a controller with several workers busy while it stops:
// the BlockRequest reconciler's four workers, in the tests that stopped
// a manager in the middle of a burst. client-go's queue has no such
// hand-over: Get waits on a condition that ShutDown broadcasts. (A
// manager with a test controller of four workers, stopped in a stream of
// events: 1 stop in 25 ran into the grace period with the priority queue;
// with this queue, 50 of 50 took under 5 ms.)
func QueueOptions() controller.Options {
	return controller.Options{UsePriorityQueue: ptr.To(false), NewQueue: newQueue}
}

// newQueue is client-go's rate-limited work queue, as controller-runtime
// makes it when the priority queue is off, except that it does not drain:
// once shut down, Get reports shutdown even with items left, so that a
// stopping controller finishes the reconciles under way and no more. A
// manager that steps down must stop quickly: it releases its Lease to the
// next replica only then.
func newQueue(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return undrained{workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Name: name})}
}

// undrained is a work queue whose Get stops handing out items once it is
// shut down.
type undrained struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
}

func (q undrained) Get() (reconcile.Request, bool) {
	item, shutdown := q.TypedRateLimitingInterface.Get()
	if !shutdown && q.ShuttingDown() {
		q.Done(item) // left undone, as the queue is going
		return reconcile.Request{}, true
	}
	return item, shutdown
}

package controller

import (
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// queueOptions are the controller options every reconciler here is built
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
// hand-over: Get waits on a condition that ShutDown broadcasts.
func queueOptions() controller.Options {
	return controller.Options{UsePriorityQueue: ptr.To(false), NewQueue: newQueue}
}

// newQueue is client-go's rate-limited work queue, as controller-runtime
// makes it when the priority queue is off.
func newQueue(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Name: name})
}

package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ctrlutil"
)

// Condition types and reasons of an AddressPool.
const (
	// PoolReady is true while nodes may claim the pool's blocks: its
	// geometry is sound and it is not being deleted.
	PoolReady = "Ready"
	// PoolExhausted is true while every block of the pool is claimed.
	PoolExhausted = "Exhausted"

	ReasonValid       = "Valid"
	ReasonDeleting    = "Deleting"
	ReasonFull        = "AllBlocksCarved"
	ReasonHasRoom     = "BlocksFree"
	ReasonPoolInvalid = skeinv1.ReasonPoolInvalid
)

// DefaultPoolStatusInterval is AddressPoolReconciler.StatusInterval's
// default.
const DefaultPoolStatusInterval = 3 * time.Second

// AddressPoolReconciler keeps a pool's status (blocks claimed, blocks it
// can hold, Ready and Exhausted) current as its blocks come and go, and
// holds the pool with FinalizerPool while any of its blocks exists: a pool
// whose addresses pods still use is not deleted, it waits, Terminating,
// until the nodes have freed every block.
//
// Status is debounced: nodes claim and free blocks by the thousand at
// once (a cluster starting, a rollout), and a write per block event would
// make the controller the heaviest writer of the cluster. A pool's status
// is written at most once per StatusInterval: the first change after a
// quiet spell at once, the changes of a burst together at the end of the
// interval. The finalizer is not debounced: a deleted pool goes as soon as
// its last block does.
type AddressPoolReconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// Reader confirms, past the cache, that no block is left before the
	// finalizer goes; nil means Client.
	Reader client.Reader
	// StatusInterval is the least time between two status writes of one
	// pool; zero means DefaultPoolStatusInterval.
	StatusInterval time.Duration

	mu    sync.Mutex
	pools map[string]poolNote
}

// poolNote is what the reconciler keeps of a pool between reconciles.
type poolNote struct {
	deleting bool      // the pool has a deletionTimestamp
	written  time.Time // its last status write
}

// SetupWithManager registers the reconciler with mgr: it runs for a pool
// and, debounced, for the blocks labelled with the pool.
func (r *AddressPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&skeinv1.AddressPool{}).
		Watches(&skeinv1.AddressBlock{}, r.blockEvents()).
		Named("addresspool").
		WithOptions(ctrlutil.QueueOptions()).
		Complete(ctrlutil.CountErrors("addresspool", r))
}

// blockEvents queues a block's pool when its status may next be written,
// so that a burst of block events is one reconcile, not one each; at once
// when the pool is being deleted (it may be waiting for this block). It
// reads nothing: it runs in the informer's goroutine.
func (r *AddressPoolReconciler) blockEvents() handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	enqueue := func(o client.Object, q queue) {
		name := o.GetLabels()[skeinv1.LabelPool]
		if name == "" {
			return
		}
		req := reconcile.Request{NamespacedName: client.ObjectKey{Name: name}}
		if wait, deleting := r.untilWrite(name, time.Now()); wait > 0 && !deleting {
			q.AddAfter(req, wait)
			return
		}
		q.Add(req)
	}
	return handler.Funcs{
		CreateFunc:  func(_ context.Context, e event.CreateEvent, q queue) { enqueue(e.Object, q) },
		UpdateFunc:  func(_ context.Context, e event.UpdateEvent, q queue) { enqueue(e.ObjectNew, q) },
		DeleteFunc:  func(_ context.Context, e event.DeleteEvent, q queue) { enqueue(e.Object, q) },
		GenericFunc: func(_ context.Context, e event.GenericEvent, q queue) { enqueue(e.Object, q) },
	}
}

// untilWrite is how long until pool's status may be written again, and
// whether the pool is being deleted.
func (r *AddressPoolReconciler) untilWrite(pool string, now time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pools[pool]
	if !ok || p.written.IsZero() {
		return 0, p.deleting
	}
	return p.written.Add(orDefault(r.StatusInterval, DefaultPoolStatusInterval)).Sub(now), p.deleting
}

// note records what Reconcile learnt of pool: whether it is being
// deleted, and (if not zero) when its status was written.
func (r *AddressPoolReconciler) note(pool string, deleting bool, written time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pools == nil {
		r.pools = map[string]poolNote{}
	}
	p := r.pools[pool]
	p.deleting = deleting
	if !written.IsZero() {
		p.written = written
	}
	r.pools[pool] = p
}

// Reconcile brings one pool's finalizer and status up to date.
func (r *AddressPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &skeinv1.AddressPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	pool = pool.DeepCopy()

	// Step 1: hold a live pool with the finalizer. A pool being deleted
	// is noted first, so that block events from now on queue it at once
	// (those before are in the cache the count below reads).
	deleting := !pool.DeletionTimestamp.IsZero()
	r.note(pool.Name, deleting, time.Time{})
	if !deleting && controllerutil.AddFinalizer(pool, skeinv1.FinalizerPool) {
		if err := r.Client.Update(ctx, pool); err != nil {
			return ctrlutil.RequeueOnConflict(err, "add finalizer to pool %s", pool.Name)
		}
	}

	// Step 2: count its blocks (the cache's own objects: only counted).
	var blocks skeinv1.AddressBlockList
	if err := r.Client.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelPool: pool.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("list blocks of pool %s: %w", pool.Name, err)
	}

	// Step 3: a deleted pool goes once no block of it is left; the cache
	// may not have seen a block made a moment ago, so ask the API server.
	if deleting && len(blocks.Items) == 0 {
		return r.release(ctx, pool)
	}

	// Step 4: status, written only when it changed, and not twice within
	// StatusInterval: until then, looked at again when it may be. The
	// metrics follow at once.
	st := pool.Status.DeepCopy()
	r.setStatus(pool, st, int64(len(blocks.Items)))
	poolBlocksAllocated.WithLabelValues(pool.Name).Set(float64(st.BlocksAllocated))
	poolBlocksTotal.WithLabelValues(pool.Name).Set(float64(st.BlocksTotal))
	if equality.Semantic.DeepEqual(st, &pool.Status) {
		return ctrl.Result{}, nil
	}
	if wait, _ := r.untilWrite(pool.Name, time.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	pool.Status = *st
	if err := r.Client.Status().Update(ctx, pool); err != nil {
		return ctrlutil.RequeueOnConflict(err, "update status of pool %s", pool.Name)
	}
	r.note(pool.Name, deleting, time.Now())
	poolStatusWrites.Inc()
	return ctrl.Result{}, nil
}

// setStatus fills st for pool with allocated blocks.
func (r *AddressPoolReconciler) setStatus(pool *skeinv1.AddressPool, st *skeinv1.AddressPoolStatus, allocated int64) {
	st.BlocksAllocated = allocated
	st.ObservedGeneration = pool.Generation
	set := func(typ string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: pool.Generation,
		})
	}
	geo, err := pool.Geometry()
	if err != nil {
		st.BlocksTotal = 0
		set(PoolReady, false, ReasonPoolInvalid, err.Error())
		set(PoolExhausted, false, ReasonPoolInvalid, "the pool has no blocks to claim")
		return
	}
	st.BlocksTotal = int64(geo.Blocks())
	switch {
	case !pool.DeletionTimestamp.IsZero():
		set(PoolReady, false, ReasonDeleting,
			fmt.Sprintf("the pool is being deleted; waiting for nodes to free its %d blocks", allocated))
	default:
		set(PoolReady, true, ReasonValid, fmt.Sprintf("%d blocks of %d addresses", st.BlocksTotal, geo.BlockSize()))
	}
	if allocated >= st.BlocksTotal {
		set(PoolExhausted, true, ReasonFull, fmt.Sprintf("all %d blocks are claimed", st.BlocksTotal))
	} else {
		set(PoolExhausted, false, ReasonHasRoom, fmt.Sprintf("%d of %d blocks free", st.BlocksTotal-allocated, st.BlocksTotal))
	}
}

// release removes the finalizer of a deleted pool once the API server
// confirms that no block of it is left.
func (r *AddressPoolReconciler) release(ctx context.Context, pool *skeinv1.AddressPool) (ctrl.Result, error) {
	rd := r.Reader
	if rd == nil {
		rd = r.Client
	}
	var blocks skeinv1.AddressBlockList
	if err := rd.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelPool: pool.Name}, client.Limit(1)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list blocks of pool %s: %w", pool.Name, err)
	}
	if len(blocks.Items) > 0 {
		return ctrl.Result{RequeueAfter: ctrlutil.ConflictRetry}, nil // the watch brings the block soon
	}
	if controllerutil.RemoveFinalizer(pool, skeinv1.FinalizerPool) {
		if err := r.Client.Update(ctx, pool); err != nil {
			return ctrlutil.RequeueOnConflict(err, "remove finalizer of pool %s", pool.Name)
		}
		log.FromContext(ctx).Info("pool released: no block of it is left", "pool", pool.Name)
	}
	r.forget(pool.Name)
	return ctrl.Result{}, nil
}

// forget drops what is kept of a pool that is gone.
func (r *AddressPoolReconciler) forget(pool string) {
	poolBlocksAllocated.DeleteLabelValues(pool)
	poolBlocksTotal.DeleteLabelValues(pool)
	r.mu.Lock()
	delete(r.pools, pool)
	r.mu.Unlock()
}

package controller

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// Condition types and reasons of an AddressPool.
const (
	// PoolReady is true while the pool can be carved: its geometry is
	// sound and it is not being deleted.
	PoolReady = "Ready"
	// PoolExhausted is true while every block of the pool is carved.
	PoolExhausted = "Exhausted"

	ReasonValid       = "Valid"
	ReasonDeleting    = "Deleting"
	ReasonFull        = "AllBlocksCarved"
	ReasonHasRoom     = "BlocksFree"
	ReasonPoolInvalid = skeinv1.ReasonPoolInvalid
)

// AddressPoolReconciler keeps a pool's status (blocks carved, blocks it
// can hold, Ready and Exhausted) current as its blocks come and go, and
// holds the pool with FinalizerPool while any of its blocks exists: a pool
// whose addresses pods still use is not deleted, it waits, Terminating,
// until the nodes have freed every block.
type AddressPoolReconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// Reader confirms, past the cache, that no block is left before the
	// finalizer goes; nil means Client.
	Reader client.Reader
}

// SetupWithManager registers the reconciler with mgr: it runs for a pool
// and for every change of a block labelled with the pool.
func (r *AddressPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&skeinv1.AddressPool{}).
		Watches(&skeinv1.AddressBlock{}, handler.EnqueueRequestsFromMapFunc(blockToPool)).
		Named("addresspool").
		Complete(countErrors("addresspool", r))
}

func blockToPool(_ context.Context, o client.Object) []reconcile.Request {
	pool := o.GetLabels()[skeinv1.LabelPool]
	if pool == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: pool}}}
}

// Reconcile brings one pool's finalizer and status up to date.
func (r *AddressPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &skeinv1.AddressPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if client.IgnoreNotFound(err) == nil {
			forgetPoolMetrics(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	pool = pool.DeepCopy()

	// Step 1: hold a live pool with the finalizer.
	deleting := !pool.DeletionTimestamp.IsZero()
	if !deleting && controllerutil.AddFinalizer(pool, skeinv1.FinalizerPool) {
		if err := r.Client.Update(ctx, pool); err != nil {
			return requeueOnConflict(err, "add finalizer to pool %s", pool.Name)
		}
	}

	// Step 2: count its blocks.
	var blocks skeinv1.AddressBlockList
	if err := r.Client.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelPool: pool.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list blocks of pool %s: %w", pool.Name, err)
	}

	// Step 3: a deleted pool goes once no block of it is left; the cache
	// may not have seen a block made a moment ago, so ask the API server.
	if deleting && len(blocks.Items) == 0 {
		return r.release(ctx, pool)
	}

	// Step 4: status, written only when it changed.
	st := pool.Status.DeepCopy()
	r.setStatus(pool, st, int64(len(blocks.Items)))
	if !equality.Semantic.DeepEqual(st, &pool.Status) {
		pool.Status = *st
		if err := r.Client.Status().Update(ctx, pool); err != nil {
			return requeueOnConflict(err, "update status of pool %s", pool.Name)
		}
	}
	poolBlocksAllocated.WithLabelValues(pool.Name).Set(float64(st.BlocksAllocated))
	poolBlocksTotal.WithLabelValues(pool.Name).Set(float64(st.BlocksTotal))
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
	geo, err := PoolGeometry(pool)
	if err != nil {
		st.BlocksTotal = 0
		set(PoolReady, false, ReasonPoolInvalid, err.Error())
		set(PoolExhausted, false, ReasonPoolInvalid, "the pool has no blocks to carve")
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
		set(PoolExhausted, true, ReasonFull, fmt.Sprintf("all %d blocks are carved", st.BlocksTotal))
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
		return ctrl.Result{RequeueAfter: conflictRetry}, nil // the watch brings the block soon
	}
	if controllerutil.RemoveFinalizer(pool, skeinv1.FinalizerPool) {
		if err := r.Client.Update(ctx, pool); err != nil {
			return requeueOnConflict(err, "remove finalizer of pool %s", pool.Name)
		}
		log.FromContext(ctx).Info("pool released: no block of it is left", "pool", pool.Name)
	}
	forgetPoolMetrics(pool.Name)
	return ctrl.Result{}, nil
}

func forgetPoolMetrics(pool string) {
	poolBlocksAllocated.DeleteLabelValues(pool)
	poolBlocksTotal.DeleteLabelValues(pool)
}

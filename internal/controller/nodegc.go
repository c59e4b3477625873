package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// NodeGCReconciler removes what a deleted Node leaves behind: its
// AddressBlocks (taking off the block finalizer, which only the node's
// skeind would otherwise remove) and its BlockRequests.
//
// Kubernetes' garbage collector would remove the requests by their owner
// reference to the Node, but not the blocks (a block's owner is its pool:
// an object goes only when all its owners are gone), and no garbage
// collector may be running at all. So the controller does both itself,
// keyed by node name: it runs when a Node goes, when a block or request
// of a missing node appears, and for every node named by a block or a
// request each Interval (dangling objects from a time it was not
// watching).
type NodeGCReconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// Reader confirms past the cache that a Node is gone (the cache may
	// not have seen a Node made a moment ago); nil means Client.
	Reader client.Reader
	// Interval between sweeps for dangling objects; zero means 10 minutes.
	Interval time.Duration
}

// SetupWithManager registers the reconciler and its periodic sweep
// (which, like the reconcilers, runs only on the leader).
func (r *NodeGCReconciler) SetupWithManager(mgr ctrl.Manager) error {
	err := ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Node{}, builder.OnlyMetadata).
		Watches(&skeinv1.AddressBlock{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return nodeRequest(o.GetLabels()[skeinv1.LabelNode])
		})).
		Watches(&skeinv1.BlockRequest{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return nodeRequest(o.(*skeinv1.BlockRequest).Spec.NodeName)
		})).
		Named("nodegc").
		Complete(countErrors("nodegc", r))
	if err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(r.sweepEvery))
}

func nodeRequest(node string) []reconcile.Request {
	if node == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: node}}}
}

// Reconcile removes the blocks and requests of node req.Name if that Node
// does not exist.
func (r *NodeGCReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	gone, err := r.nodeGone(ctx, req.Name)
	if err != nil || !gone {
		return ctrl.Result{}, err
	}
	var errs []error
	var blocks skeinv1.AddressBlockList
	if err := r.Client.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelNode: req.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list blocks of node %s: %w", req.Name, err)
	}
	for i := range blocks.Items {
		errs = append(errs, r.removeBlock(ctx, &blocks.Items[i]))
	}
	// Requests live for seconds (the node deletes its own once answered),
	// so there are few: filtered here rather than indexed.
	var reqs skeinv1.BlockRequestList
	if err := r.Client.List(ctx, &reqs); err != nil {
		return ctrl.Result{}, fmt.Errorf("list requests: %w", err)
	}
	for i := range reqs.Items {
		br := &reqs.Items[i]
		if br.Spec.NodeName != req.Name || !br.DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.Client.Delete(ctx, br); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("delete request %s of deleted node %s: %w", br.Name, req.Name, err))
			continue
		}
		gcDeleted.WithLabelValues("BlockRequest").Inc()
		log.FromContext(ctx).Info("deleted request of a deleted node", "request", br.Name, "node", req.Name)
	}
	return ctrl.Result{}, errors.Join(errs...)
}

// nodeGone reports whether Node name does not exist, asking the API
// server when the cache does not have it.
func (r *NodeGCReconciler) nodeGone(ctx context.Context, name string) (bool, error) {
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, node)
	if err == nil {
		return false, nil
	}
	if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	rd := r.Reader
	if rd == nil {
		rd = r.Client
	}
	err = rd.Get(ctx, client.ObjectKey{Name: name}, node)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	return false, nil
}

// removeBlock deletes a block of a deleted node and takes its finalizer
// off: no skeind is left to do it.
func (r *NodeGCReconciler) removeBlock(ctx context.Context, blk *skeinv1.AddressBlock) error {
	node := blk.Labels[skeinv1.LabelNode]
	if blk.DeletionTimestamp.IsZero() {
		if err := r.Client.Delete(ctx, blk); err != nil {
			return client.IgnoreNotFound(fmt.Errorf("delete block %s of deleted node %s: %w", blk.Name, node, err))
		}
	}
	if controllerutil.ContainsFinalizer(blk, skeinv1.FinalizerBlock) {
		patched := blk.DeepCopy()
		controllerutil.RemoveFinalizer(patched, skeinv1.FinalizerBlock)
		if err := r.Client.Patch(ctx, patched, client.MergeFrom(blk)); err != nil {
			return client.IgnoreNotFound(fmt.Errorf("remove finalizer of block %s of deleted node %s: %w", blk.Name, node, err))
		}
	}
	gcDeleted.WithLabelValues("AddressBlock").Inc()
	log.FromContext(ctx).Info("deleted block of a deleted node", "block", blk.Name, "node", node)
	return nil
}

// sweepEvery reconciles, each Interval, every node that a block or a
// request names, until ctx ends.
func (r *NodeGCReconciler) sweepEvery(ctx context.Context) error {
	every := r.Interval
	if every <= 0 {
		every = 10 * time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := r.Sweep(ctx); err != nil {
			reconcileErrors.WithLabelValues("nodegc-sweep").Inc()
			log.FromContext(ctx).Error(err, "sweep for objects of deleted nodes")
		}
	}
}

// Sweep reconciles every node that a block or a request names.
func (r *NodeGCReconciler) Sweep(ctx context.Context) error {
	nodes := map[string]bool{}
	var blocks skeinv1.AddressBlockList
	if err := r.Client.List(ctx, &blocks); err != nil {
		return fmt.Errorf("list blocks: %w", err)
	}
	for _, b := range blocks.Items {
		nodes[b.Labels[skeinv1.LabelNode]] = true
	}
	var reqs skeinv1.BlockRequestList
	if err := r.Client.List(ctx, &reqs); err != nil {
		return fmt.Errorf("list requests: %w", err)
	}
	for _, br := range reqs.Items {
		nodes[br.Spec.NodeName] = true
	}
	delete(nodes, "")
	var errs []error
	for n := range nodes {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: n}}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

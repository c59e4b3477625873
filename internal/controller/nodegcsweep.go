package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ctrlutil"
)

// sweepEvery hands, each Interval, every node that a block, a request or
// a node Lease names to the reconciler, until ctx ends.
func (r *NodeGCReconciler) sweepEvery(ctx context.Context) error {
	t := time.NewTicker(orDefault(r.Interval, DefaultGCInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		nodes, err := r.nodesNamed(ctx)
		if err != nil {
			ctrlutil.ReconcileErrors("nodegc-sweep").Inc()
			log.FromContext(ctx).Error(err, "sweep for objects of nodes gone for good")
		}
		for _, n := range nodes {
			ev := event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: n}}}
			select {
			case r.sweeps <- ev:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// Sweep reconciles, here and now, every node that a block, a request or
// a node Lease names (the manager's sweep queues them instead).
func (r *NodeGCReconciler) Sweep(ctx context.Context) error {
	nodes, err := r.nodesNamed(ctx)
	errs := []error{err}
	for _, n := range nodes {
		_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: n}})
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// nodesNamed returns the nodes that own a block, have a request or have
// a Lease, sorted. It returns what it found along with an error.
func (r *NodeGCReconciler) nodesNamed(ctx context.Context) ([]string, error) {
	nodes := map[string]bool{}
	var errs []error
	var blocks skeinv1.AddressBlockList
	if err := r.Client.List(ctx, &blocks, client.UnsafeDisableDeepCopy); err != nil {
		errs = append(errs, fmt.Errorf("list blocks: %w", err))
	}
	for i := range blocks.Items {
		nodes[blockOwner(&blocks.Items[i])] = true
	}
	var reqs skeinv1.BlockRequestList
	if err := r.Client.List(ctx, &reqs, client.UnsafeDisableDeepCopy); err != nil {
		errs = append(errs, fmt.Errorf("list requests: %w", err))
	}
	for i := range reqs.Items {
		nodes[reqs.Items[i].Spec.NodeName] = true
	}
	// Leases are not cached: listed from the API server, names only.
	var leases metav1.PartialObjectMetadataList
	leases.SetGroupVersionKind(coordinationv1.SchemeGroupVersion.WithKind("LeaseList"))
	if err := r.reader().List(ctx, &leases, client.InNamespace(r.leaseNamespace())); err != nil {
		errs = append(errs, fmt.Errorf("list Leases in %s: %w", r.leaseNamespace(), err))
	}
	for _, l := range leases.Items {
		if n, ok := strings.CutPrefix(l.Name, skeinv1.NodeLeasePrefix); ok {
			nodes[n] = true
		}
	}
	delete(nodes, "")
	return slices.Sorted(maps.Keys(nodes)), errors.Join(errs...)
}
